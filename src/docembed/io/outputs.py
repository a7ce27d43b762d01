"""The one rule for outputs, and all-or-nothing writes.

Rule (every command that writes): '-' is stdout; the folder must exist; a target that is not a regular file
(a device node, a FIFO), that is one of the command's inputs or lies inside an input that is a folder (an
index, a model) is refused, even with --overwrite; an existing output needs --overwrite - unless it is
*stale*: any of its inputs is newer than it, make's own rule (`make` saw an input change and reruns the
recipe). The staleness rule is `is_stale`, for files and for directory
outputs of a known kind alike (an index, a fitted model): only the --overwrite it stands in for changes.

Every file of an output set obeys the rule, sidecars included (`x.ids.txt`, `x.meta.json`, `x.offsets.npy`
... of `x.npy`): a sidecar that is an input is refused, and so is an existing one beside no set (it is the
user's, --overwrite or not); when a set is replaced, the sidecars of the old set that the new one does not
write are removed with it (a dense set written over a multi-vector one reads back dense); a file at a
sidecar name that the old set did not write (its meta.json says what it is) is refused, never removed.

Directory outputs (indexes, models, training runs) may exist empty. docembed replaces a non-empty one only
if it is a docembed output of the same kind, recognised by its own marker (`DirectoryKind`: an index's
index.faiss + meta.json, a model's config.json of a known family, a run's checkpoint/ or train log), and
only with --overwrite or when it is stale. Never, even with --overwrite: the working directory or a folder
above it (`.`, `..`), a folder that is or holds an input; a non-empty folder docembed did not write is
refused, naming why, and so is one of a kind that lists its files (`DirectoryKind.owns`: an index) holding
any other file (the swap would delete it).
(A shard directory is resumed in place: engines/manifest.py.)

Writes: every file of a set goes to a temporary sibling `.NAME.tmpPID` first (NAME shortened with a hash
where the sibling's name would be too long: `sibling_stem`); only when all are complete are
they renamed into place, under a lock (`.NAME.lock`) that also re-checks the rule, so two processes writing
the same output cannot both succeed and a reader never sees files of two different writes. A command
(`output_claims`, around each CLI command) takes that lock already when `check_output` passes a file output,
before its work, and holds it until the output is written: a second `docembed` writing the same file fails
at once, naming the first one's pid, even with --overwrite. The lock is an flock on `.NAME.lock`, so a killed
holder never leaves it held; the file goes when the lock is released. A directory
output is built in a staging sibling `.NAME.tmpPID/` and swapped in under the lock, held from the start
(the old folder renamed away to `.NAME.oldPID`, the new one renamed in, the old one removed): a kill, a
SIGTERM or a full disk leaves the previous output as it was. Temporaries, staging folders and locks of dead
processes are swept on the next write (a staging folder only if it carries docembed's staging marker or is
a complete output of the kind; an old folder left between the two renames is put back). A set's renames are
journalled (`.NAME.commitPID` lists its sidecars): a writer killed after the old main file went and before
the new one came leaves sidecars without a main file, and the sweep removes them, so the next write is not
refused for files docembed itself left.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from docembed.errors import DocembedError

_TEMP_RE = re.compile(r"\.(?P<name>.+)\.(?P<what>tmp|lock|old|commit)(?P<pid>\d+)?$")
# Put inside a staging folder while it is filled: the sweep removes a dead writer's folder only if it holds
# this (or is empty, or is a complete output of its kind), never a folder it cannot tell docembed wrote.
STAGING_MARKER = ".docembed-staging"
# Files a library creates private whatever the umask (safetensors' save_file: 0600): before they are renamed
# into place they get the mode of any other new file, so an output is as readable as the user asked.
PRIVATE_SUFFIXES = (".safetensors",)


@dataclass(frozen=True)
class DirectoryKind:
    """A kind of directory output and how docembed recognises one it wrote: `recognise(folder)` checks the
    kind's own marker, `marker` describes it in messages."""

    name: str  # "docembed index"
    marker: str  # "index.faiss and meta.json"
    recognise: Callable[[Path], bool]
    # the top-level names a folder of the kind holds (None: any): a rebuild swaps the whole folder, so one
    # holding anything else (a user's notes) is refused rather than losing it
    owns: Callable[[str], bool] | None = None


def check_output(
    path: str | Path,
    overwrite: bool = False,
    *,
    directory: bool = False,
    inputs: Sequence[str | Path] = (),
    kind: DirectoryKind | None = None,
) -> None:
    """Fail early, before any work, if `path` may not be written (see the module docstring). `kind`: what a
    directory output is; a non-empty folder that is not one is refused. Inside `output_claims` a file output
    that passes is claimed: this process holds its lock until it is written (or the command ends)."""
    if str(path) == "-":
        return
    _check_output(path, overwrite, directory, inputs, kind)
    if not directory:
        claim_output(Path(path))


def _check_output(
    path: str | Path,
    overwrite: bool,
    directory: bool,
    inputs: Sequence[str | Path],
    kind: DirectoryKind | None,
) -> None:
    target = Path(path)
    parent = target.absolute().parent
    if not parent.exists():
        raise DocembedError(f"output folder does not exist: {parent}")
    if not parent.is_dir():
        raise DocembedError(f"output folder is not a directory: {parent}")
    check_not_inside(path, inputs)
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
        _refuse_protected_folder(target, inputs)
        if not any(target.iterdir()):
            return
        if kind is not None and not kind.recognise(target):
            raise DocembedError(
                f"output {path} is a folder that is not empty and is not a {kind.name} (no {kind.marker}): "
                "docembed replaces only folders it wrote; choose another output"
            )
        _refuse_foreign_entries(target, kind)
        # a folder of an unknown kind is replaced only when asked: staleness stands in for --overwrite only
        # where docembed can tell the folder is its own output
        if overwrite or (kind is not None and is_stale(info.st_mtime_ns, inputs)):
            return
        raise DocembedError(f"output exists: {path} (pass --overwrite to replace it)")
    elif not stat.S_ISREG(info.st_mode):
        raise DocembedError(f"output {path} is not a regular file (a device or pipe): refusing to replace it")
    elif directory:
        raise DocembedError(f"output exists and is a file: {path} (this command writes a directory)")
    if overwrite or is_stale(info.st_mtime_ns, inputs):
        return
    raise DocembedError(f"output exists: {path} (pass --overwrite to replace it)")


def _refuse_protected_folder(target: Path, inputs: Sequence[str | Path]) -> None:
    """The working directory, a folder above it, and a folder holding an input are never a directory output:
    replacing one would remove the user's files (or the folder the command runs in)."""
    folder = target.resolve()
    here = Path.cwd().resolve()
    if folder == here or folder in here.parents:
        raise DocembedError(
            f"output {target} is the working directory or a folder above it: name a new folder for the output"
        )
    for source in inputs:
        if str(source) == "-" or "://" in str(source):
            continue
        if folder in Path(source).resolve().parents:
            raise DocembedError(f"output {target} holds the input {source}: choose another output folder")


def check_not_inside(path: str | Path, inputs: Sequence[str | Path]) -> None:
    """An output inside an input that is a folder (an index, a model, a shard directory) would replace or add
    to that input's own files: never, even with --overwrite."""
    if str(path) == "-":
        return
    resolved = Path(path).resolve()
    for source in inputs:
        if not source or str(source) == "-" or "://" in str(source) or not Path(source).is_dir():
            continue
        if Path(source).resolve() in resolved.parents:
            raise DocembedError(f"output {path} is inside the input {source}: choose an output outside it")


def _refuse_foreign_entries(target: Path, kind: DirectoryKind | None) -> None:
    if kind is None or kind.owns is None:
        return
    for entry in sorted(target.iterdir()):
        if not (kind.owns(entry.name) or _TEMP_RE.fullmatch(entry.name) or entry.name == STAGING_MARKER):
            raise DocembedError(
                f"output {target} holds {entry.name}, which docembed did not write and a rebuild would "
                "delete: move it out of the folder or choose another output"
            )


def check_companions(main: Path, companions: Sequence[Path], inputs: Sequence[str | Path] = ()) -> None:
    """The rule for the other files of the set whose main file is `main` (its sidecars): none may be an input
    or other than a regular file, and where `main` does not exist none may exist, --overwrite or not: a set's
    sidecars are renamed into place and removed with its main file, so one without it is the user's. Where
    `main` exists it passed the rule: the old set, sidecars included, is being replaced."""
    if not Path(main).exists():  # sidecars a killed commit left are docembed's: swept, not refused
        sweep_stale_temporaries(Path(main).parent, [Path(main).name])
    replacing_a_set = Path(main).exists()
    for path in companions:
        path = Path(path)
        for source in inputs:
            if str(source) != "-" and _same_file(path, Path(source)):
                raise DocembedError(
                    f"output {path} (written with {main.name}) is the input {source}: choose another output"
                )
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        except OSError as error:
            raise DocembedError(f"cannot write {path}: {error.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            raise DocembedError(f"output {path} (written with {main.name}) is not a regular file: refused")
        if not replacing_a_set:
            raise DocembedError(
                f"{path} is there without {main.name}, so docembed did not write it: move it away or choose "
                "another output"
            )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_stale(mtime_ns: int, inputs: Sequence[str | Path]) -> bool:
    """make's rule, the one staleness rule of every output (files and folders): an output last modified at
    `mtime_ns` is out of date when ANY of its local inputs (files or folders) is newer than it. stdin, URIs
    and inputs that cannot be read make nothing stale."""
    for source in inputs:
        if str(source) == "-" or "://" in str(source):
            continue
        try:
            if Path(source).stat().st_mtime_ns > mtime_ns:
                return True
        except OSError:
            continue
    return False


# The longest a file name may be (bytes), and what docembed adds to an output's name for its temporary,
# staging, old and lock siblings: ".NAME.lock" + a pid of up to 10 digits.
NAME_MAX = 255
_SIBLING_EXTRA = len(".") + len(".lock") + 10


def name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def sibling_stem(name: str, limit: int = NAME_MAX) -> str:
    """The NAME in `.NAME.tmpPID`, `.NAME.lock` and `.NAME.oldPID`: the output's name, or where that would
    make a sibling's name too long for the file system, its start and a hash of it (so every output whose
    own name fits can be written; the sweep derives the same stem)."""
    room = limit - _SIBLING_EXTRA
    if len(os.fsencode(name)) <= room:
        return name
    import hashlib

    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    start = os.fsencode(name)[: room - len(digest) - 1].decode("utf-8", "ignore")
    return f"{start}~{digest}"


def temporary_path(target: Path) -> Path:
    return target.with_name(f".{sibling_stem(target.name)}.tmp{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_temporaries(
    folder: Path, names: Sequence[str], kind: DirectoryKind | None = None
) -> list[Path]:
    """Remove `.NAME.tmpPID` files and `.NAME.lock` files of processes that no longer run (a SIGKILL or a
    power cut leaves them), and their staging folders (see `_sweep_folder`); only for the given target
    NAMEs. Returns what was removed."""
    wanted = {sibling_stem(name): name for name in names}
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
        if pid is None:  # a lock: gone if nobody holds it (the pid inside may be reused or not written yet)
            if _remove_unheld_lock(entry):
                removed.append(entry)
            continue
        if not (pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            if _sweep_folder(entry, folder / wanted[match.group("name")], match.group("what"), kind):
                removed.append(entry)
        elif match.group("what") == "commit":
            _finish_dead_commit(entry, folder / wanted[match.group("name")])
            removed.append(entry)
        elif match.group("what") != "old":
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def commit_journal(main: Path) -> Path:
    return main.with_name(f".{sibling_stem(main.name)}.commit{os.getpid()}")


def _finish_dead_commit(journal: Path, main: Path) -> None:
    """A writer died while renaming a set into place. Its main file there: the set is whole (only the
    journal was left). Not there: the sidecars the journal names are the replaced set's or the unfinished
    new one's, docembed's either way, and belong to no set now: removed."""
    if not main.exists():
        try:
            names = json.loads(journal.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            names = []
        for name in names:
            sidecar = main.with_name(name)
            if sidecar.is_file() and not sidecar.is_symlink():
                sidecar.unlink(missing_ok=True)
    journal.unlink(missing_ok=True)


def _sweep_folder(entry: Path, target: Path, what: str, kind: DirectoryKind | None) -> bool:
    """A dead writer's folder: its staging folder (`tmp`) is removed if it is verifiably ours; the previous
    output it had renamed away (`old`) is put back if the output is missing (killed between the two renames
    of the swap), removed if the output is there and the old folder is recognisably of its kind."""
    if what == "old" and not target.exists():
        os.rename(entry, target)
        return True
    ours = (entry / STAGING_MARKER).is_file() or (kind is not None and kind.recognise(entry))
    if what == "tmp" and not any(entry.iterdir()):
        entry.rmdir()
        return True
    if ours:
        shutil.rmtree(entry, ignore_errors=True)
        return True
    return False


# --- one writer per output ----------------------------------------------------------------------------------
# The locks this process holds, by lock file: claims (taken by check_output inside `output_claims`, released
# when the output is written or the command ends) and locks held by `output_lock` blocks.
_CLAIMS: dict[Path, int] = {}
_LOCKED: set[Path] = set()
_CLAIMING = [0]  # how many `output_claims` blocks are open (claims are taken only inside one)


def lock_path(target: Path) -> Path:
    """The lock file of writing `target`: `.NAME.lock` beside it (in its folder resolved, so `x.npy` and
    `./sub/../x.npy` share one)."""
    target = Path(target).absolute()
    return target.parent.resolve() / f".{sibling_stem(target.name)}.lock"


def _owner(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "?"
    return text if text.isdigit() else "?"


def _acquire(lock: Path, target: Path) -> int | None:
    """An exclusive flock on `lock` (created if missing), with our pid written inside; the open descriptor.
    A lock another process (or another block of this one) holds is a DocembedError naming its pid. None
    where the file system has no flock: the writes are then not serialised."""
    import fcntl

    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:  # a read-only folder, permissions: say so of the output, not of its lock
            raise DocembedError(f"cannot write {target}: {describe_os_error(error, path=False)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise DocembedError(f"another docembed is writing {target} (pid {owner})") from None
        except OSError:  # no flock here (some network file systems)
            os.close(fd)
            lock.unlink(missing_ok=True)
            return None
        # the holder before us removes the file as it lets go: a lock on a removed file locks nothing
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)
    pid = str(os.getpid()).encode()
    os.pwrite(fd, pid, 0)
    os.ftruncate(fd, len(pid))
    return fd


def _release(lock: Path, fd: int | None) -> None:
    """Remove the lock file while still holding it, then let go (the order `_acquire` relies on)."""
    if fd is None:
        return
    try:
        lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _remove_unheld_lock(lock: Path) -> bool:
    """Remove a lock file nobody holds (left by a killed writer, or by an older docembed); False if held."""
    import fcntl

    if lock.parent.resolve() / lock.name in (*_CLAIMS, *_LOCKED):
        return False  # ours (the flock below would fail on it anyway, from a second descriptor)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _release(lock, fd)
    return True


@contextmanager
def output_claims() -> Iterator[None]:
    """The extent of one command: inside it `check_output` claims each file output it passes (see
    `claim_output`); every claim still held is released at the end, whatever happens."""
    _CLAIMING[0] += 1
    try:
        yield
    finally:
        _CLAIMING[0] -= 1
        if not _CLAIMING[0]:
            for lock in list(_CLAIMS):
                _release(lock, _CLAIMS.pop(lock))


def claim_output(target: Path) -> None:
    """Inside `output_claims`: take the write lock of `target` now, before the work, and hold it until the
    output is written (`release_claim`) or the command ends; a second writer of the same output fails at
    once. Outside, nothing: the lock is taken only while the files are renamed into place."""
    if not _CLAIMING[0] or str(target) == "-":
        return
    lock = lock_path(target)
    if lock in _CLAIMS or lock in _LOCKED:
        return
    sweep_stale_temporaries(lock.parent, [Path(target).name])
    fd = _acquire(lock, Path(target))
    if fd is not None:
        _CLAIMS[lock] = fd


def release_claim(target: Path) -> None:
    lock = lock_path(target)
    if lock in _CLAIMS:
        _release(lock, _CLAIMS.pop(lock))


@contextmanager
def output_lock(target: Path, kind: DirectoryKind | None = None) -> Iterator[None]:
    """An exclusive lock on writing `target` (an flock on `.NAME.lock`, which holds our pid): the claim this
    command holds on it already, or one taken for the block."""
    lock = lock_path(target)
    sweep_stale_temporaries(lock.parent, [Path(target).name], kind)
    if lock in _CLAIMS:
        yield
        return
    fd = _acquire(lock, Path(target))
    _LOCKED.add(lock)
    try:
        yield
    finally:
        _LOCKED.discard(lock)
        _release(lock, fd)


class OutputSet:
    """The files of one output, written all or nothing. Write each file to `set.temporary(path)`, then
    `commit()`: under the lock, the rule is checked again (another process may have written the output
    meanwhile), the old main file is removed first and the new one renamed last, so at every moment the
    main file is absent or belongs to a complete set. Temporaries are removed if anything fails.
    `companions`: every other file a set at `main` may have (its sidecars); they obey the rule too, and
    those this write does not produce are removed with the old set."""

    def __init__(
        self,
        main: Path,
        overwrite: bool,
        inputs: Sequence[str | Path] = (),
        companions: Sequence[Path] = (),
    ):
        self.main = Path(main)
        self.overwrite = overwrite
        self.inputs = inputs
        self.companions = [Path(c) for c in companions]
        self.files: list[tuple[Path, Path]] = []  # (temporary, target)
        sweep_stale_temporaries(self.main.parent, [self.main.name])

    def temporary(self, target: Path) -> Path:
        target = Path(target)
        sweep_stale_temporaries(target.parent, [target.name])
        tmp = temporary_path(target)
        self.files.append((tmp, target))
        return tmp

    def commit(self) -> list[Path]:
        written = {target for _, target in self.files}
        others = [*self.companions, *sorted(written - {self.main, *self.companions})]
        with output_lock(self.main):
            check_output(self.main, self.overwrite, inputs=self.inputs)
            check_companions(self.main, others, self.inputs)
            # sidecars first, the main file last: its presence means the whole set is there
            ordered = sorted(self.files, key=lambda pair: pair[1] == self.main)
            journal = commit_journal(self.main)
            try:
                # before the old main file goes: a kill from here on leaves sidecars the sweep can name
                journal.write_text(json.dumps([path.name for path in others]), encoding="utf-8")
                if self.main.exists():
                    self.main.unlink()
                for tmp, target in ordered:
                    if target == self.main:  # the old set's sidecars this one does not write go with it
                        for stale in others:
                            if stale not in written:
                                stale.unlink(missing_ok=True)
                    if target.suffix in PRIVATE_SUFFIXES:
                        follow_umask(tmp)
                    os.replace(tmp, target)
            finally:  # failed half way (a full disk, a SIGTERM): what it placed goes, as the sweep would do
                _finish_dead_commit(journal, self.main)
        release_claim(self.main)  # written: another writer may go on
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


@contextmanager
def directory_output(
    path: str | Path, kind: DirectoryKind, overwrite: bool = False, inputs: Sequence[str | Path] = ()
) -> Iterator[Path]:
    """A directory output written all or nothing: yields an empty staging folder (`.NAME.tmpPID`, a sibling)
    to fill; when the block finishes, the rule is checked again and the folder swapped in. The lock is held
    from the start, so a second writer of the same output fails at once instead of after its work. If
    anything fails (an error, Ctrl-C, SIGTERM, a full disk) the staging folder goes and the previous output
    stays as it was; after a SIGKILL the next write sweeps what is left."""
    target = Path(path)
    if _staged_by_us(target):  # a caller stages the whole output already (fit_family around fit_pv ...)
        yield target
        return
    # first: a previous output that a killed swap left renamed away is back in place before the rule looks
    sweep_stale_temporaries(target.parent, [target.name], kind)
    check_output(target, overwrite, directory=True, inputs=inputs, kind=kind)
    with output_lock(target, kind):
        staging = temporary_path(target)
        staging.mkdir()
        (staging / STAGING_MARKER).write_text(str(os.getpid()))
        try:
            yield staging
            # again: the folder may have changed since the start (a user's files put into an empty one)
            check_output(target, overwrite, directory=True, inputs=inputs, kind=kind)
            (staging / STAGING_MARKER).unlink()
            swap_in_folder(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # ours: created above (gone once swapped in)


def _staged_by_us(folder: Path) -> bool:
    try:
        return (folder / STAGING_MARKER).read_text().strip() == str(os.getpid())
    except OSError:
        return False


def swap_in_folder(staging: Path, target: Path) -> None:
    """Replace `target` (absent, empty, or checked to be an output of its kind) by `staging`: the old folder
    is renamed away first and removed last, so a failure in between puts it back."""
    for suffix in PRIVATE_SUFFIXES:
        for path in staging.rglob(f"*{suffix}"):
            if path.is_file() and not path.is_symlink():  # a link's target is not ours to change
                follow_umask(path)
    old = target.with_name(f".{sibling_stem(target.name)}.old{os.getpid()}")
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists():
        os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        if old.exists() and not target.exists():
            os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def follow_umask(path: Path) -> None:
    """Give `path` the mode open() gives a new file: 0666 less the umask (a folder: mkdir's, 0777 less it)."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def _umask() -> int:
    try:  # Linux says it without changing it (os.umask sets it: another thread could create a file then)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


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
