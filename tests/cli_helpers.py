"""Run the real `docembed` entry point in-process (fast) or as a subprocess (signals, pipes, timing)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DOCEMBED = str(Path(sys.executable).with_name("docembed"))


@dataclass
class Result:
    code: int
    out: str
    err: str


def invoke(capfd, *args: str) -> Result:
    """docembed.cli.main() with argv = args; returns exit code, stdout and stderr."""
    from docembed.cli import main

    old_argv = sys.argv
    sys.argv = ["docembed", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        sys.argv = old_argv
    out, err = capfd.readouterr()
    return Result(code, out, err)


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([DOCEMBED, *map(str, args)], capture_output=True, text=True, **kwargs)
