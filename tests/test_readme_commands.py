"""Every `docembed ...` line of the README, of every page under docs/ and of the model cards parses as
written: the command and each option exist, and the values are of the right kind (#47: lines that failed as
written). This covers the blocks marked illustrative too, which tests/test_docs_examples.py does not run.
The code blocks of the pages are read here, once, for both files."""

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from docembed.cli import app, global_options_first

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = ("sh", "bash", "shell")
FENCE = re.compile(r"^```(\S*)\s*(.*)$")
ILLUSTRATIVE = re.compile(r"^<!--\s*illustrative\b:?\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page: its language, the rest of its fence line, its text, and the reason it
    gives for being illustrative (None when it is not marked so)."""

    page: Path
    line: int
    lang: str
    info: str
    text: str
    illustrative: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def title(self) -> str | None:
        match = re.search(r'title="([^"]+)"', self.info)
        return match.group(1) if match else None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the marker on the last non-blank line before it, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), len(lines))
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        marker = ILLUSTRATIVE.match(before)
        text = "".join(line + "\n" for line in lines[i + 1 : end])
        found.append(Block(page, i + 1, match.group(1), match.group(2), text, marker and marker.group(1)))
        i = end + 1
    return found


def logical_lines(block: Block) -> list[str]:
    """The lines of a shell block, continuation lines joined, blank and comment-only lines left out."""
    joined = block.text.replace("\\\n", " ")
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _command_lines(block: Block) -> list[str]:
    """The `docembed ...` commands of a shell or make block (each part of a pipe or a list), comments cut."""
    lines = []
    for line in logical_lines(block):
        for command in re.split(r"\s*(?:\||&&|;)\s*", line):
            command = command.split(" #")[0].strip().rstrip("&").strip()
            if command.startswith("torchrun "):  # `torchrun ... -m docembed CMD`: the docembed part
                command = "docembed " + command.split("-m docembed", 1)[-1].strip()
            if command.startswith("docembed "):
                lines.append(command)
    return lines


BLOCKS = [block for page in PAGES for block in blocks(page)]
# the model cards are pages of the site too (docs/hooks/site.py): their commands parse, the guides' run
CARDS = sorted([*ROOT.glob("src/docembed/zoo/*/card.md"), *ROOT.glob("src/docembed/models/cards/*.md")])
COMMANDS = [
    (block.where, line)
    for block in BLOCKS + [block for card in CARDS for block in blocks(card)]
    if block.lang in (*SHELL, "make")
    for line in _command_lines(block)
]


def test_the_pages_show_commands():
    readme = [c for c in COMMANDS if c[0].startswith("README.md")]
    assert len(readme) >= 8, "the README shows the main jobs"
    assert len(COMMANDS) >= 100, f"only {len(COMMANDS)} docembed lines found: is the block parser broken?"


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[f"{w}#{i}" for i, (w, _) in enumerate(COMMANDS)])
def test_each_documented_command_parses(where, line):
    from docembed.cli import GLOBAL_WITH_VALUE

    args = global_options_first(shlex.split(line)[1:])
    while args and args[0].startswith("-"):  # the root's options, checked by their own tests
        args = args[2:] if args[0] in GLOBAL_WITH_VALUE else args[1:]
    command, name = typer.main.get_command(app), "docembed"
    try:
        while hasattr(command, "commands") and args:  # the root, then a group such as `index`
            name, args = args[0], args[1:]
            assert name in command.commands, f"no command {name!r}"
            command = command.commands[name]
        if hasattr(command, "commands"):  # `docembed --help`: the root's own options
            return
        command.make_context(name, list(args))
    except typer.Exit as done:  # --help
        assert done.exit_code == 0
    except Exception as error:  # click's usage errors: an unknown option, a missing argument
        pytest.fail(f"{where}: `{line}` does not parse: {error}")
