"""Extra training text for QuickThoughts: this machine's English man pages, rendered to prose, as JSONL.

Each page of /usr/share/man/man{1,5,7,8} (the English sections; translations live in language folders and
are skipped) is rendered by groff (no hyphenation, one paragraph per line), and its paragraphs of six or more
words that contain a letter are kept in page order: {"id": "man1/ls", "text": paragraphs joined by newlines}.
A page whose text equals an earlier page's (links, aliases) is written once.
Option lists, synopses and code are mostly short lines and drop out. Pages named python* are skipped (the
Python documentation is reserved for independent evaluation). Derived data: written under runs/, not shipped.

    python scripts/man_corpus.py runs/zoo/man-pages.jsonl [--sections 1,5,7,8] [--limit N] [--min-bytes B]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
COMMAND_SECTIONS = ("1", "5", "7", "8")  # the default: commands, files, overviews, administration
RENDER = ["groff", "-man", "-Tutf8", "-P-cbou", "-rHY=0", "-rLL=2000n"]
MIN_WORDS = 6


def page_paragraphs(path: Path) -> list[str]:
    """The prose paragraphs of one man page, in order (an empty list when groff fails)."""
    source = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if source.startswith(b".so "):  # a link to another page: its text is read there
        return []
    rendered = subprocess.run(RENDER, input=source, capture_output=True, timeout=60)
    if rendered.returncode != 0:
        return []
    lines = rendered.stdout.decode("utf-8", errors="replace").splitlines()[1:-1]  # header and footer
    paragraphs = []
    for line in lines:
        text = re.sub(r"\s+", " ", line).strip()
        if len(text.split()) >= MIN_WORDS and re.search(r"[A-Za-z]", text):
            paragraphs.append(text)
    return paragraphs


def man_description(page_id: str) -> str | None:
    """The description in the NAME line of man page `man1/ls` ("list directory contents"), or None: the
    long-document bench's summary queries and the retriever's summaries."""
    section, name = page_id.split("/", 1)
    files = sorted(MAN_ROOT.joinpath(section).glob(f"{name}.*"))
    if not files:
        return None
    found = subprocess.run(["lexgrog", str(files[0])], capture_output=True, text=True).stdout
    match = re.search(r'"[^"]*? - (.+)"', found)
    return match.group(1).strip() if match and len(match.group(1).split()) >= 2 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--sections", default=",".join(COMMAND_SECTIONS))
    parser.add_argument("--limit", type=int, default=None, help="pages per section (default: all)")
    parser.add_argument(
        "--min-bytes", type=int, default=0, help="skip page files smaller than this (compressed): long pages"
    )
    args = parser.parse_args(argv)
    pages = written = paragraphs = 0
    seen: set[str] = set()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as out:
        for section in args.sections.split(","):
            folder = MAN_ROOT / f"man{section}"
            for path in sorted(folder.iterdir())[: args.limit]:
                if not path.is_file() or path.name.startswith("python"):
                    continue
                if path.stat().st_size < args.min_bytes:
                    continue
                pages += 1
                kept = page_paragraphs(path)
                digest = hashlib.sha1("\n".join(kept).encode("utf-8")).hexdigest()
                if kept and digest not in seen:
                    seen.add(digest)
                    name = path.name.removesuffix(".gz")
                    out.write(json.dumps({"id": f"man{section}/{name}", "text": "\n".join(kept)}) + "\n")
                    written += 1
                    paragraphs += len(kept)
                if pages % 1000 == 0:
                    print(f"man pages: {pages} read, {written} kept", file=sys.stderr, flush=True)
    print(
        f"man pages: {pages} read, {written} written, {paragraphs} paragraphs -> {args.output}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
