"""Process-wide settings chosen by the CLI's global options, plus the helpers that honour them:
device resolution, seeding and progress (a rich bar on a terminal, status lines off one with -v)."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Settings:
    device: str = "auto"
    seed: int = 0
    quiet: bool = False
    verbose: bool = False
    progress: bool | None = None  # None: bars when stderr is a terminal (the Python API may force them)
    server: str | None = None  # a running `docembed serve` that commands use as their model (--server)


settings = Settings()


def models_home() -> Path:
    """Where docembed keeps what it makes at run time: saved models by name (`models/`), unpacked offline
    weights, converted int8 models and embedding caches. `$DOCEMBED_HOME`, else `$XDG_CACHE_HOME/docembed`
    (default `~/.cache/docembed`)."""
    root = os.environ.get("DOCEMBED_HOME")
    if root:
        return Path(root).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "docembed"


def resolve_device(device: str | None = None) -> str:
    """'auto' picks cuda when torch sees a GPU, else cpu; 'cuda' without a GPU is a user error. On a Linux
    machine without a GPU driver, 'auto' is cpu without importing torch (2-3 s of start-up that the
    models without torch, glove-avg, tf-idf, bm25, pv, would otherwise pay on every command)."""
    from docembed.errors import UsageError

    device = device or settings.device
    if device not in ("auto", "cpu", "cuda") and not str(device).startswith("cuda:"):
        raise UsageError(f"device is auto, cpu, cuda or cuda:N, not {device!r}")
    if device == "cpu" or (device == "auto" and "torch" not in sys.modules and not _gpu_driver_present()):
        return "cpu"
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def _gpu_driver_present() -> bool:
    """Whether torch could see a GPU: on Linux only with an NVIDIA (or ROCm) driver loaded; elsewhere ask."""
    if not sys.platform.startswith("linux"):
        return True
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/kfd").exists()


_interrupt_requested = False


def on_interrupt(signum, frame) -> None:
    """SIGINT handler: remember the request, then raise KeyboardInterrupt as Python's own handler does.
    A KeyboardInterrupt raised while Python runs a __del__ or a callback is printed and dropped, so the
    long loops also call `raise_if_interrupted()` between chunks and steps: Ctrl-C is never lost."""
    global _interrupt_requested
    _interrupt_requested = True
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    if _interrupt_requested:
        raise KeyboardInterrupt


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) of this process under torchrun, (0, 1) otherwise; read without importing torch."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def seed_everything(seed: int | None = None) -> int:
    seed = settings.seed if seed is None else seed
    random.seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    if "torch" in sys.modules:
        import torch

        torch.manual_seed(seed)
    return seed


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, quiet=settings.quiet)


def log(message: str) -> None:
    """Informational line on stderr (silenced by -q)."""
    if not settings.quiet:
        # Not wrapped at the console width: a log line (with its paths) stays one line for grep and CI logs.
        stderr_console().print(message, highlight=False, soft_wrap=True)


def debug(message: str) -> None:
    if settings.verbose and not settings.quiet:
        stderr_console().print(f"[dim]{message}[/dim]", highlight=False)


# Off a terminal, -v prints one status line at most this often (and one at the end); tests set it to 0.
STATUS_INTERVAL = 10.0


def progress_mode() -> str | None:
    """How progress is shown: "bar" (rich, on a terminal or when forced), "lines" (off a terminal with -v:
    a periodic one-line status that a log file can keep), or None (-q, or off a terminal without -v)."""
    if settings.quiet or settings.progress is False:
        return None
    if settings.progress or sys.stderr.isatty():
        return "bar"
    return "lines" if settings.verbose else None


def progress_enabled() -> bool:
    return progress_mode() is not None


@contextmanager
def progress_shown(show: bool | None) -> Iterator[None]:
    """Within the block, progress bars are shown (True), hidden (False) or left to the terminal (None)."""
    before = settings.progress
    settings.progress = show
    try:
        yield
    finally:
        settings.progress = before


@contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence what libraries print while a model loads (transformers' load reports about heads docembed
    does not use, its weight-loading bars, warnings a user cannot act on) and restore their settings after,
    so a notebook's own use of those libraries is left as it was."""
    import warnings

    restore = []
    if "transformers" not in sys.modules:
        # Not imported yet: a model without transformers (glove-avg, tf-idf ...) must not pay its import
        # (about 1 s). Its import-time defaults are set through the environment instead, and reset after.
        restore.append(_quiet_transformers_on_import())
    else:
        from transformers.utils import logging as transformers_logging

        verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()

        def restore_transformers():
            transformers_logging.set_verbosity(verbosity)
            if bars:
                transformers_logging.enable_progress_bar()

        restore.append(restore_transformers)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for undo in restore:
            undo()


def _quiet_transformers_on_import():
    """Make transformers silent from its import on (its verbosity is read from the environment then) and
    turn off huggingface_hub's bars (a cheap import, which transformers follows); the returned undo puts
    the environment back and, when the block imported transformers, its verbosity and bars to what the
    original environment gives (what a later import would have had)."""
    import importlib.util

    before = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    hub_bars_were_on = False
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

        hub_bars_were_on = not are_progress_bars_disabled()
        disable_progress_bars()

    def undo():
        if before is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = before
        if "transformers" in sys.modules:
            from transformers.utils import logging as transformers_logging

            transformers_logging.set_verbosity(transformers_logging._get_default_logging_level())
            if hub_bars_were_on:
                transformers_logging.enable_progress_bar()  # huggingface_hub's bars as well
        elif hub_bars_were_on:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()

    return undo


class _NullBar:
    def advance(self, n: int = 1) -> None:
        pass

    def set_completed(self, n: int) -> None:
        pass

    def update(self, **fields) -> None:
        pass


class _RichBar:
    def __init__(self, progress, task):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)

    def set_completed(self, n: int) -> None:
        self._progress.update(self._task, completed=n)

    def update(self, **fields) -> None:
        """Free-form fields (loss, tokens/s, ...) shown after the bar."""
        text = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        self._progress.update(self._task, info=text)


def rate_unit(unit: str) -> str:
    return "docs/s" if unit == "documents" else f"{unit}/s"


def duration(seconds: float) -> str:
    """21m54s, 1h02m, 9s: short enough for a status line."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class _StatusLines:
    """Progress off a terminal (-v): `encode [m]: 1,024/50,000 documents, 37.2 docs/s, ETA 21m54s` on
    stderr at the first step, then at most every STATUS_INTERVAL seconds, and once at the end. Steps may
    come from another thread (a model's own pool), hence the lock."""

    def __init__(self, description: str, total: int | None, unit: str):
        import threading

        self.description, self.total, self.unit = description, total, unit
        self.done = 0
        self.started = time.perf_counter()
        self.printed_at: float | None = None
        self.printed_done = -1
        self.first_step: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        self.set_completed(self.done + n)

    def set_completed(self, n: int) -> None:
        with self._lock:
            self.done = n
            now = time.perf_counter()
            if self.first_step is None and n:
                self.first_step = (now, n)
            due = self.printed_at is None or now - self.printed_at >= STATUS_INTERVAL
            # the last step is left to the closing line, which says how long it all took
            if n and n != self.printed_done and n != self.total and due:
                self._print(now)

    def update(self, **fields) -> None:
        pass  # the line carries its own rate; free-form fields are for the bar

    def close(self) -> None:
        with self._lock:
            if self.done:
                self._print(time.perf_counter(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        if not final and self.first_step and now > self.first_step[0] and self.done > self.first_step[1]:
            # the pace since the first step: loading the model (in each worker too) is not part of it
            rate = (self.done - self.first_step[1]) / (now - self.first_step[0])
        count = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        line = f"{self.description}: {count} {self.unit}, {rate:.1f} {rate_unit(self.unit)}"
        if final:
            line += f", done in {duration(elapsed)}"
        elif self.total:
            line += f", ETA {duration((self.total - self.done) / rate)}" if rate > 0 else ""
        # plain print: rich would read [model] in a description as markup
        print(line, file=sys.stderr, flush=True)
        self.printed_at, self.printed_done = now, self.done


@contextmanager
def progress_bar(
    description: str, total: int | None = None, unit: str | None = None
) -> Iterator[_NullBar | _RichBar | _StatusLines]:
    """Progress on stderr (see `progress_mode`): a rich bar on a terminal; off a terminal with -v, status
    lines for a bar that counts a `unit` ("documents", "texts"); nothing with -q. `unit` also adds the
    rate (docs/s) to the bar."""
    mode = progress_mode()
    if mode == "lines" and unit:
        lines = _StatusLines(description, total, unit)
        try:
            yield lines
        finally:
            lines.close()
        return
    if mode != "bar":
        yield _NullBar()
        return
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    if unit:
        columns.append(_rate_column(rate_unit(unit)))
    columns.append(TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=stderr_console(), transient=False) as progress:
        # escaped: the column reads markup, and "[sbert]" in "encode [sbert]" would vanish as a style tag
        task = progress.add_task(escape(description), total=total, info="")
        yield _RichBar(progress, task)


def _rate_column(label: str):
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task) -> Text:
            speed = "" if task.speed is None else f"{task.speed:.1f} {label}"
            return Text(speed, style="progress.data.speed")

    return RateColumn()


# --- progress from inside one model call ------------------------------------------------------------------
# The encode loops hand a model many texts per call (a chunk of 1,024: a family sorts a call's texts by
# length, so the chunk decides its batches and so the exact vectors). A family reports each batch it
# finishes with `report_batch`, and the loop moves its progress within the call.
_batch_listener = None


def report_batch(done: float, total: float) -> None:
    """For a model's encode, after each batch: `done` of the `total` units of work of this call (texts,
    windows, ...) are finished. A no-op unless an encode loop listens (`batches_reported_to`)."""
    listener = _batch_listener
    if listener is not None and total > 0:
        listener(done, total)


@contextmanager
def batches_reported_to(listener) -> Iterator[None]:
    """Within the block, `report_batch(done, total)` calls `listener(done, total)`."""
    global _batch_listener
    before = _batch_listener
    _batch_listener = listener
    try:
        yield
    finally:
        _batch_listener = before


@contextmanager
def reporting_texts(first: int, count: int, total: int) -> Iterator[None]:
    """For a family whose encode runs its texts in parts (the usual ones together, each long one streamed
    in sub-calls): within the block the reports, in whatever units the part counts, stand for `count` of
    the call's `total` texts after the `first` ones; the block's end reports them done."""
    global _batch_listener
    outer = _batch_listener
    if outer is None:
        yield
        return

    def within(done: float, total_of_part: float) -> None:
        outer(first + count * min(done, total_of_part) / total_of_part, total)

    _batch_listener = within
    try:
        yield
    finally:
        _batch_listener = outer
    outer(first + count, total)


def reported_share(size: int, done: float, total: float) -> int:
    """How many of a call's `size` texts a report of `done` of `total` units of work stands for."""
    # the small margin: a share such as 3/10 is 0.29999... in floating point, and stands for 3 texts of 10
    return min(size, int(size * min(done, total) / total + 1e-9)) if total > 0 else 0


class ChunkProgress:
    """The listener for one model call over `size` texts after `before` were done: moves `bar` to
    before + the share the model reports (never backwards: a fusion's second model starts again from 0),
    and honours Ctrl-C between batches."""

    def __init__(self, bar, before: int, size: int):
        self.bar, self.before, self.size, self.seen = bar, before, size, 0

    def __call__(self, done: float, total: float) -> None:
        raise_if_interrupted()
        share = reported_share(self.size, done, total)
        if share > self.seen:
            self.seen = share
            self.bar.set_completed(self.before + share)
