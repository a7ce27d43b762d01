"""The one rule for outputs, and all-or-nothing writes.

Rule (every command that writes): '-' is stdout; the folder must exist; a target that is not a regular file
(a device node, a FIFO) or that is one of the command's inputs is refused, even with --overwrite; an existing
output needs --overwrite - unless it is a file older than every input it was made from, as after `make` saw
the input change (then it is replaced, like make's own rules). Directory outputs (models, shard directories,
result folders) may exist empty; a non-empty one always needs --overwrite.

Writes: every file of a set goes to a temporary sibling `.NAME.tmpPID` first; only when all are complete are
they renamed into place, under a lock (`.NAME.lock`) that also re-checks the rule, so two processes writing
the same output cannot both succeed and a reader never sees files of two different writes. Temporaries and
locks of dead processes are swept on the next write.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from docembed.errors import DocembedError

_TEMP_RE = re.compile(r"\.(?P<name>.+)\.(?:tmp|lock)(?P<pid>\d+)?$")


def check_output(
    path: str | Path,
    overwrite: bool = False,
    *,
    directory: bool = False,
    inputs: Sequence[str | Path] = (),
) -> None:
    """Fail early, before any work, if `path` may not be written (see the module docstring)."""
    if str(path) == "-":
        return
    target = Path(path)
    parent = target.absolute().parent
    if not parent.exists():
        raise DocembedError(f"output folder does not exist: {parent}")
    if not parent.is_dir():
        raise DocembedError(f"output folder is not a directory: {parent}")
    try:
        info = target.stat()
    except FileNotFoundError:
        return
    except OSError as error:
        raise DocembedError(f"cannot write {path}: {error.strerror}") from None
    for source in inputs:
        if str(source) != "-" and _same_file(target, Path(source)):
            raise DocembedError(f"output {path} is the input {source}: choose another output")
    if stat.S_ISDIR(info.st_mode):
        if not directory:
            raise DocembedError(f"output is a directory: {path} (name a file)")
        if overwrite or not any(target.iterdir()):
            return
        raise DocembedError(f"output exists: {path} (pass --overwrite to replace it)")
    elif not stat.S_ISREG(info.st_mode):
        raise DocembedError(f"output {path} is not a regular file (a device or pipe): refusing to replace it")
    elif directory:
        raise DocembedError(f"output exists and is a file: {path} (this command writes a directory)")
    if overwrite or _older_than_inputs(info.st_mtime_ns, inputs):
        return
    raise DocembedError(f"output exists: {path} (pass --overwrite to replace it)")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _older_than_inputs(mtime_ns: int, inputs: Sequence[str | Path]) -> bool:
    files = [Path(p) for p in inputs if str(p) != "-" and "://" not in str(p)]
    try:
        return bool(files) and all(p.stat().st_mtime_ns > mtime_ns for p in files)
    except OSError:
        return False


def temporary_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.tmp{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_temporaries(folder: Path, names: Sequence[str]) -> list[Path]:
    """Remove `.NAME.tmpPID` files and `.NAME.lock` files of processes that no longer run (a SIGKILL or a
    power cut leaves them); only for the given target NAMEs. Returns what was removed."""
    wanted = set(names)
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_RE.fullmatch(entry.name)
        if not match or match.group("name") not in wanted:
            continue
        pid = match.group("pid")
        if pid is None:  # a lock: its owner's pid is inside
            try:
                pid = entry.read_text().strip()
            except OSError:
                continue
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


@contextmanager
def output_lock(target: Path) -> Iterator[None]:
    """An exclusive lock on writing `target` (a `.NAME.lock` file holding our pid)."""
    lock = target.with_name(f".{target.name}.lock")
    sweep_stale_temporaries(target.parent, [target.name])
    # The lock appears with our pid already in it (written to `.NAME.lockPID`, then hard-linked into place,
    # which fails if the lock exists): a kill at any moment leaves no empty lock that no sweep could judge.
    staged = lock.with_name(f"{lock.name}{os.getpid()}")
    staged.write_text(str(os.getpid()))
    try:
        os.link(staged, lock)
    except FileExistsError:
        try:
            owner = lock.read_text().strip()
        except OSError:
            owner = "?"
        raise DocembedError(f"{target} is being written by another process (pid {owner})") from None
    except OSError:  # a file system without hard links: create the lock directly
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise DocembedError(f"{target} is being written by another process") from None
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
    finally:
        staged.unlink(missing_ok=True)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


class OutputSet:
    """The files of one output, written all or nothing. Write each file to `set.temporary(path)`, then
    `commit()`: under the lock, the rule is checked again (another process may have written the output
    meanwhile), the old main file is removed first and the new one renamed last, so at every moment the
    main file is absent or belongs to a complete set. Temporaries are removed if anything fails."""

    def __init__(self, main: Path, overwrite: bool, inputs: Sequence[str | Path] = ()):
        self.main = Path(main)
        self.overwrite = overwrite
        self.inputs = inputs
        self.files: list[tuple[Path, Path]] = []  # (temporary, target)
        sweep_stale_temporaries(self.main.parent, [self.main.name])

    def temporary(self, target: Path) -> Path:
        target = Path(target)
        sweep_stale_temporaries(target.parent, [target.name])
        tmp = temporary_path(target)
        self.files.append((tmp, target))
        return tmp

    def commit(self) -> list[Path]:
        with output_lock(self.main):
            check_output(self.main, self.overwrite, inputs=self.inputs)
            if self.main.exists():
                self.main.unlink()
            # sidecars first, the main file last: its presence means the whole set is there
            ordered = sorted(self.files, key=lambda pair: pair[1] == self.main)
            for tmp, target in ordered:
                os.replace(tmp, target)
        return [target for _, target in ordered]

    def discard(self) -> None:
        for tmp, _ in self.files:
            tmp.unlink(missing_ok=True)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.discard()


@contextmanager
def atomic_path(path: Path, overwrite: bool = True, inputs: Sequence[str | Path] = ()) -> Iterator[Path]:
    """A temporary sibling of `path` that replaces it only if the block finishes (no half-written output)."""
    with OutputSet(Path(path), overwrite, inputs) as output:
        yield output.temporary(Path(path))
        output.commit()


def describe_os_error(error: OSError, path: bool = True) -> str:
    """One line for an OSError a user can cause (a full disk, a read-only folder, permissions)."""
    where = f": {error.filename}" if error.filename and path else ""
    hints = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file too large (a file size limit, e.g. ulimit -f)",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.EISDIR: "is a directory",
        errno.ENOTDIR: "not a directory (a path goes through a file)",
        errno.ENOENT: "no such file or directory",
        errno.EMFILE: "too many open files",
    }
    if error.errno is None and "written" in str(error):  # numpy's short write on a full disk
        reason = f"no space left on the device? (a write stopped short: {error})"
    else:
        reason = hints.get(error.errno, error.strerror or str(error))
    return f"{reason}{where}"
