"""Process-wide settings chosen by the CLI's global options, plus the helpers that honour them:
device resolution, seeding and progress bars (rich, on stderr, only when stderr is a terminal)."""

from __future__ import annotations

import os
import random
import sys
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


def progress_enabled() -> bool:
    if settings.quiet:
        return False
    return sys.stderr.isatty() if settings.progress is None else settings.progress


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

    def update(self, **fields) -> None:
        pass


class _RichBar:
    def __init__(self, progress, task):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)

    def update(self, **fields) -> None:
        """Free-form fields (loss, tokens/s, ...) shown after the bar."""
        text = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        self._progress.update(self._task, info=text)


@contextmanager
def progress_bar(description: str, total: int | None = None) -> Iterator[_NullBar | _RichBar]:
    """A progress bar on stderr, or a no-op when -q is set or stderr is not a terminal."""
    if not progress_enabled():
        yield _NullBar()
        return
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
        TextColumn("{task.fields[info]}"),
    ]
    with Progress(*columns, console=stderr_console(), transient=False) as progress:
        task = progress.add_task(description, total=total, info="")
        yield _RichBar(progress, task)
