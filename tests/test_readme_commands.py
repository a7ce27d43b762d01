"""Every `docembed ...` line of the README and docs/ parses as written (the command and each option exist,
values of the right kind), and the README's main job runs as written on tiny data (#47: lines that failed
as written). Lines that need trained models, a cluster or the network are parsed, not run."""

import json
import re
import shlex
from pathlib import Path

import pytest
import typer

from cli_helpers import invoke
from docembed.cli import app, global_options_first

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _command_lines(page: Path) -> list[str]:
    """The `docembed ...` lines of a page's sh/bash/make blocks, continuation lines joined, comments cut."""
    text = page.read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```(?:sh|bash|shell|make)\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            for command in re.split(r"\s*(?:\||&&|;)\s*", line):
                command = command.split(" #")[0].strip().rstrip("&").strip()
                if command.startswith("torchrun "):  # `torchrun ... -m docembed CMD`: the docembed part
                    command = "docembed " + command.split("-m docembed", 1)[-1].strip()
                if command.startswith("docembed "):
                    lines.append(command)
    return lines


COMMANDS = [(page.name, line) for page in PAGES for line in _command_lines(page)]


def test_the_pages_show_commands():
    assert len([c for c in COMMANDS if c[0] == "README.md"]) >= 30


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_each_documented_command_parses(page, line):
    from docembed.cli import GLOBAL_WITH_VALUE

    args = global_options_first(shlex.split(line)[1:])
    while args and args[0].startswith("-"):  # the root's options, checked by their own tests
        args = args[2:] if args[0] in GLOBAL_WITH_VALUE else args[1:]
    command, name = typer.main.get_command(app), "docembed"
    try:
        while hasattr(command, "commands"):  # the root, then a group such as `index`
            name, args = args[0], args[1:]
            assert name in command.commands, f"no command {name!r}"
            command = command.commands[name]
        command.make_context(name, list(args))
    except Exception as error:  # click's usage errors: an unknown option, a missing argument
        pytest.fail(f"{page}: `{line}` does not parse: {error}")


def test_the_main_job_runs_as_written(capfd, tmp_path, monkeypatch):
    """The README's first commands with glove-avg (the fast built-in) in place of sbert."""
    monkeypatch.chdir(tmp_path)
    docs = [
        {"id": f"doc{i}", "text": t} for i, t in enumerate(["a cat", "a dog", "stock prices", "catch it"])
    ]
    Path("docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    Path("docs.txt").write_text("".join(d["text"] + "\n" for d in docs))
    Path("pairs.jsonl").write_text(json.dumps({"text1": "a cat", "text2": "a kitten"}) + "\n")
    Path("gone.txt").write_text("doc3\n")
    written = [line for page, line in COMMANDS if page == "README.md"]
    wanted = [
        "docembed encode docs.jsonl --model sbert -o docs.npy",
        "docembed similarity --pairs pairs.jsonl -m sbert -o scores.jsonl",
        "docembed index build docs.npy -o docs.index --type flat",
        'docembed search docs.index --query "how do I catch an exception" -k 5',
        "docembed search docs.index --id doc42 --text-from docs.jsonl",
        "docembed encode docs.jsonl -m glove-avg --reuse docs.npy -o docs.npy",
        "docembed index remove docs.index --ids gone.txt",
    ]
    for line in wanted:
        assert line in written, f"the README no longer shows `{line}`"
        args = shlex.split(line.replace("sbert", "glove-avg").replace("doc42", "doc1"))[1:]
        result = invoke(capfd, *args)
        assert result.code == 0, f"`{line}`: {result.err}"
