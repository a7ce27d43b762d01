"""The `docembed` command line: a Typer root with the global options, and one small module per command
group. Command modules import only typer and the standard library at import time, so `docembed --help`
answers instantly; models, torch and numpy are imported inside the commands."""

from __future__ import annotations

import importlib
import io
import os
import signal
import sys

import typer

from docembed.runtime import on_interrupt, settings, torchrun_rank
from docembed.version import __version__

app = typer.Typer(
    name="docembed",
    help="Document embeddings from the command line: encode, compare, rerank, search, train, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# One module per command group; each defines register(app).
COMMAND_MODULES = [
    "encode",
    "merge",
    "compare",
    "index",
    "models",
    "train_pv",
    "evaluate",
    "fit",
    "export",
    "train_nugget",
    "inspect",
    "convert_long",
    "train_distill",
    "train_quickthoughts",
    "train_setenc",
    "train_retriever",
    "distill_static",
    "plot",
    "serve",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"docembed {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda (or cuda:N)."),
    seed: int = typer.Option(0, "--seed", help="Seed for every random choice (shuffles, init, sampling)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bars or informational messages."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="More detail on stderr."),
    server: str = typer.Option(
        None,
        "--server",
        envvar="DOCEMBED_SERVER",
        help="URL of a running `docembed serve`: encode, similarity, rerank and search use its model instead "
        "of loading one (the same outputs, without the load; -m must name the served model).",
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print version."),
) -> None:
    # these go before or after the command: main() moves them (global_options_first)
    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter("expected auto, cpu, cuda or cuda:N", param_hint="--device")
    if server is not None and not server.startswith(("http://", "https://")):
        raise typer.BadParameter(f"expected an http:// URL, got {server!r}", param_hint="--server")
    settings.device, settings.seed, settings.quiet, settings.verbose = device, seed, quiet, verbose
    settings.server = server or None
    from docembed.runtime import seed_everything

    seed_everything(seed)


for _name in COMMAND_MODULES:
    try:
        importlib.import_module(f"docembed.cli.{_name}").register(app)
    except ModuleNotFoundError as _error:  # a command group not built yet in this checkout
        if _error.name != f"docembed.cli.{_name}":
            raise


def _quiet_libraries() -> None:
    # Keep stderr for docembed's own messages: no hub progress bars, no transformers chatter, no hub calls
    # for the offline models (users with network can set HF_HUB_OFFLINE=0).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _terminate(signum, frame) -> None:
    print("docembed: terminated", file=sys.stderr)
    raise SystemExit(128 + signum)


def main() -> None:
    """Console entry point: user errors become one line and an exit status, never a traceback.

    Exit status: 0 success (also when stdout is closed early, as under `| head`); 1 a runtime error the user
    can fix (bad input, an existing output, a full disk, permissions, a diverged training); 2 a usage
    error (options, arguments); 130 interrupted."""
    from typer import Abort

    from docembed.errors import DocembedError

    try:  # newer typer vendors click as typer._click; older typer uses click itself
        from typer._click.exceptions import ClickException
    except ImportError:  # pragma: no cover
        from click.exceptions import ClickException

    _quiet_libraries()
    _closed_standard_streams()
    # A scheduler's SIGTERM unwinds like Ctrl-C, so atomic writers remove their temporary files. Not under
    # torchrun: when a rank dies, torchrun stops the others with SIGTERM, and a rank blocked in a collective
    # (C++ code, where a Python handler never runs) must then die at once instead of hanging on.
    if torchrun_rank()[1] == 1:
        signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, on_interrupt)
    try:
        code = _run_command()
        if code == 130:  # typer turns Ctrl-C inside a command into exit code 130
            print("docembed: interrupted", file=sys.stderr)
    except ClickException as error:  # bad option or argument: usage error, exit 2
        error.show()
        code = error.exit_code
    except Abort as error:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        if isinstance(error.__cause__, EOFError):  # ... and EOFError too: a read that ended early
            code = _fail(f"unexpected end of input: {error.__cause__ or 'no data left'}", 1)
        else:
            print("docembed: interrupted", file=sys.stderr)
            code = 130
    except KeyboardInterrupt:
        print("docembed: interrupted", file=sys.stderr)
        code = 130
    except DocembedError as error:
        code = _fail(str(error), error.exit_code)
    except BrokenPipeError:
        code = _stdout_closed()
    except SystemExit:
        # typer catches EPIPE itself and exits 1 with stdout wrapped; a closed pipe is not a failure
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":
            code = _stdout_closed()
        else:
            raise
    except OSError as error:  # a full disk, a read-only folder, permissions, a path through a file
        from docembed.io.outputs import describe_os_error

        code = _fail(describe_os_error(error), 1)
    except FloatingPointError as error:  # training diverged (a non-finite loss)
        code = _fail(f"training diverged: {error}", 1)
    except ValueError as error:
        if not _from_optimizer(error):
            raise
        code = _fail(f"invalid optimiser setting: {error}", 1)
    except RecursionError:  # a reader missed a deeply nested value: still no traceback
        code = _fail("input nested too deeply to read", 1)
    sys.exit(code or 0)


def _run_command():
    """The command, holding the outputs it checks from the check until they are written (io/outputs.py:
    a second docembed writing the same file fails at once). Not under torchrun with several ranks: they
    check the same outputs, and rank 0 writes them."""
    from contextlib import nullcontext

    from docembed.io.outputs import output_claims

    with output_claims() if torchrun_rank()[1] == 1 else nullcontext():
        return app(args=global_options_first(sys.argv[1:]), standalone_mode=False)


# The root's options: those without a value, and those that take one.
GLOBAL_FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose"})
GLOBAL_WITH_VALUE = frozenset({"--device", "--seed", "--server"})


def global_options_first(args: list[str]) -> list[str]:
    """`args` with the root's options that follow the command moved before it (`encode x -q` reads as
    `-q encode x`), unless the command has an option of that name itself (evaluate's --seed) or they
    follow `--`."""
    start = 0
    while start < len(args) and args[start].startswith("-"):  # the root's own options, then the command
        start += 2 if args[start] in GLOBAL_WITH_VALUE else 1
    globals_ = GLOBAL_FLAGS | GLOBAL_WITH_VALUE
    rest = args[start + 1 :]
    if start >= len(args) or not any(a.split("=", 1)[0] in globals_ for a in rest):
        return args
    own = _command_options(args[start])
    moved, kept, index = [], [], 0
    while index < len(rest):
        arg, name = rest[index], rest[index].split("=", 1)[0]
        if arg == "--":
            kept += rest[index:]
            break
        if name in own or name not in globals_:
            kept.append(arg)
        elif name in GLOBAL_WITH_VALUE and "=" not in arg and index + 1 < len(rest):
            moved += rest[index : index + 2]
            index += 1
        else:
            moved.append(arg)
        index += 1
    return args[:start] + moved + [args[start]] + kept


def _command_options(name: str) -> set[str]:
    """Every option name of command `name` (of all its subcommands, for a group like `index`)."""
    command = typer.main.get_command(app)
    found, stack = set(), [command.commands.get(name)] if hasattr(command, "commands") else []
    while stack:
        current = stack.pop()
        if current is None:
            continue
        for param in getattr(current, "params", []):
            found.update(getattr(param, "opts", []) + getattr(param, "secondary_opts", []))
        stack.extend(getattr(current, "commands", {}).values())
    return found


class _ClosedStream(io.TextIOBase):
    """Stands in for stdout when docembed was started with it closed (`>&-`): writing data there is an
    error, where Python would fail with an AttributeError on None."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        from docembed.errors import DocembedError

        raise DocembedError("stdout is closed: nowhere to write the output (redirect it, or use -o FILE)")


def _closed_standard_streams() -> None:
    if sys.stdout is None:
        sys.stdout = _ClosedStream()
    if sys.stderr is None:  # messages have nowhere to go: drop them rather than fail
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def _fail(message: str, code: int) -> int:
    # one line, always: a message that spans lines (an OS or library text) is joined
    print(f"docembed: error: {' '.join(message.split())}", file=sys.stderr)
    return code


def _stdout_closed() -> int:
    # stdout closed early (e.g. `| head`): stop quietly, and keep Python from complaining at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno())
    return 0


def _from_optimizer(error: ValueError) -> bool:
    """torch.optim rejects settings (lr < 0, a bad beta) with a ValueError raised in its own code."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and "torch/optim" in frame.tb_frame.f_code.co_filename.replace(os.sep, "/")
