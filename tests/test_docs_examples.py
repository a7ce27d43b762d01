"""Every code block of the README and of the pages under docs/ runs here as written, on the example files of
docs/getting-started.md, or is marked illustrative (#48: no example fails as written).

- A page's blocks run in order in one fresh folder holding the example files (the blocks whose fence names a
  file, ```json title="docs.jsonl"), so a block can use what an earlier block of its page wrote.
- sh blocks run line by line: a plain `docembed ...` line in this process (once torch is imported a model
  loads in about a second), any other line (a pipe, curl, python -c) in bash with docembed first on PATH.
  `export NAME=VALUE` holds for the lines after it. `docembed serve` starts in the background on a free port
  (every 8765 of the page becomes that port) and stops at the end of the page.
- python blocks run in one namespace per page; `>>>` blocks are doctests, run by tests/test_docs_python.py.
- make blocks become a Makefile, run with make twice: the second run must find nothing to do.
- A block right after `<!-- illustrative: why -->` does not run (it trains for hours, needs a cluster, a GPU,
  the network or the evaluation data). Its `docembed` lines still parse (tests/test_readme_commands.py) and
  its Python still compiles (below).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import DOCEMBED, free_port, invoke
from test_readme_commands import BLOCKS, PAGES, ROOT, SHELL, Block, logical_lines

BIN = str(Path(sys.executable).parent)
CODE = (*SHELL, "python", "make")
NOT_CODE = ("text", "json", "toml", "yaml")  # file contents, layouts, output
FILES = {block.title: block.text for block in BLOCKS if block.title}
OPERATORS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "(", ")", "$(", "`"}


def _plain(line: str) -> bool:
    """Whether a line is one command with literal arguments (no pipe, redirection, list or expansion)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    return not any(token in OPERATORS or any(c in token for c in "$`*") for token in lexer)


def _runs(block: Block) -> bool:
    return block.lang in CODE and block.illustrative is None and ">>>" not in block.text


RUN_PAGES = [page for page in PAGES if any(_runs(b) for b in BLOCKS if b.page == page)]


# --- every block is run, parsed or marked ------------------------------------------------------------------
def test_every_block_says_what_it_is():
    problems = []
    for block in BLOCKS:
        if block.lang not in CODE + NOT_CODE:
            problems.append(f"{block.where}: a block needs a language: one of {', '.join(CODE + NOT_CODE)}")
        if block.illustrative == "":
            problems.append(f"{block.where}: say why the block is illustrative: <!-- illustrative: why -->")
        if block.illustrative is not None and block.lang not in CODE:
            problems.append(f"{block.where}: only code is marked illustrative")
        if block.title and block.lang in CODE:
            problems.append(f"{block.where}: a titled block is an example file, not code")
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith((" ", "\t")) and line.lstrip().startswith("```"):
                problems.append(f"{page.relative_to(ROOT)}:{number}: an indented block is not checked")
    assert not problems, "\n".join(problems)


def test_each_example_file_is_given_once():
    titles = [block.title for block in BLOCKS if block.title]
    assert sorted(titles) == sorted(set(titles)), "two blocks give the same example file"
    assert {"docs.jsonl", "queries.txt", "tasks.jsonl"} <= set(FILES)


def test_illustrative_python_compiles():
    for block in BLOCKS:
        if block.lang == "python" and block.illustrative is not None:
            compile(block.text, block.where, "exec")


def test_the_pages_run_code():
    assert Path(ROOT / "README.md") in RUN_PAGES
    assert len(RUN_PAGES) >= 10, [str(p) for p in RUN_PAGES]


# --- running a page -----------------------------------------------------------------------------------------
class Session:
    """One page's run: the folder, its environment, and the servers it started."""

    def __init__(self, folder: Path, capfd, monkeypatch):
        self.folder, self.capfd, self.monkeypatch = folder, capfd, monkeypatch
        self.port = str(free_port())
        self.servers: list[subprocess.Popen] = []
        self.namespace: dict = {"__name__": "__docs__"}
        monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")

    def shell(self, block: Block) -> None:
        for line in logical_lines(block):
            self.line(line.replace("8765", self.port), block.where)

    def line(self, line: str, where: str) -> None:
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                self.monkeypatch.setenv(name, value)
            return
        if words and words[0] == "docembed" and "serve" in words and words.index("serve") < 3:
            return self.serve([w for w in words[1:] if w != "&"], where, line)
        if words and words[0] == "docembed" and _plain(line):
            result = invoke(self.capfd, *words[1:])
            assert result.code == 0, f"{where}: `{line}` exited {result.code}:\n{result.err[-3000:]}"
            return
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{where}: `{line}` exited {done.returncode}:\n{done.stderr[-3000:]}"

    def serve(self, args: list[str], where: str, line: str) -> None:
        if "--port" not in args:
            args += ["--port", self.port]
        log = self.folder / f".serve{len(self.servers)}.log"
        with open(log, "w") as stderr:
            server = subprocess.Popen([DOCEMBED, *args], stdout=subprocess.DEVNULL, stderr=stderr)
        self.servers.append(server)
        deadline = time.monotonic() + 180
        while "serving " not in log.read_text():
            assert server.poll() is None, f"{where}: `{line}` exited {server.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{where}: `{line}` did not start:\n{log.read_text()}"
            time.sleep(0.2)

    def python(self, block: Block) -> None:
        exec(compile(block.text, block.where, "exec"), self.namespace)

    def make(self, block: Block) -> None:
        folder = self.folder / f"make{block.line}"
        folder.mkdir()
        for name in FILES:
            shutil.copy(self.folder / name, folder / name)
        (folder / "Makefile").write_text(block.text)
        for args, wanted in ((["make"], 0), (["make", "-q"], 0)):
            done = subprocess.run(args, cwd=folder, capture_output=True, text=True, timeout=600)
            assert done.returncode == wanted, f"{block.where}: `{' '.join(args)}`:\n{done.stderr[-3000:]}"

    def close(self) -> None:
        for server in self.servers:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_the_page_runs_as_written(page, tmp_path, capfd, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    session = Session(tmp_path, capfd, monkeypatch)
    try:
        for block in (b for b in BLOCKS if b.page == page and _runs(b)):
            {"python": session.python, "make": session.make}.get(block.lang, session.shell)(block)
    finally:
        session.close()


# --- the site -----------------------------------------------------------------------------------------------
def test_the_site_builds_without_a_warning(tmp_path):
    """`make docs` without make: a broken link or anchor, a missing page or one left out of the nav fails."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    # not --quiet: it hides the warning about a page left out of the nav, and strict mode then passes
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    command += ["-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    warnings = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0 and not warnings, done.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").exists() and (
        tmp_path / "site" / "zoo" / "nugget" / "index.html"
    ).exists()
