"""Long documentation from Debian packages, as JSONL: the text the student meets outside reviews and news.

The packages (debian-handbook, debian-reference-en, perl-doc, postgresql-doc-15, git-doc) are fetched from
the Debian archive with `apt-get download` into a cache folder (default runs/debian-docs/, git-ignored) and
unpacked there. Each HTML page (the handbook's English pages only) or POD file (perl-doc, rendered by
`pod2text`) is one document: its prose paragraphs of six or more words that contain a letter, in page order,
joined by newlines (navigation, code and option lists are mostly short lines and drop out). A page whose
text equals an earlier one's is written once. Every document gets a split by a hash of its id: `val`
(a tenth), `test` (a tenth) and `train` (the rest).

`--evaluation` writes other packages' pages instead, text no corpus trains on, so each page is `val` or
`test`, half and half by the same hash: `guides` (the default, EVALUATION_PACKAGES: Debian policy and
developers' guides, exim4's and postfix's documentation, BIND's manual, libvirt's, Node.js's API, Sphinx's)
or `manuals` (MANUAL_PACKAGES, added 2026-11-28: the Apache HTTP server's, Bacula's, CMake's, Octave's,
Varnish's and gnuplot's manuals, the Debian FAQ, Debian's history and the Securing Debian manual, English
pages only). The long-document bench reads both, for test splits large enough to show a difference of a
few points.

The Debian packages linux-doc-* and python3*-doc are reserved for independent evaluation: never fetched here.
Derived data: written under runs/, never shipped.

    python scripts/debian_docs.py runs/debian-docs/docs.jsonl [--cache runs/debian-docs] [--min-words 300]
    python scripts/debian_docs.py runs/debian-docs-eval/docs.jsonl --cache runs/debian-docs-eval --evaluation
    python scripts/debian_docs.py runs/debian-manuals/docs.jsonl --cache runs/debian-manuals \\
        --evaluation manuals
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import re
import subprocess
from pathlib import Path

from debian_packages import decoded, fetch

# package -> (folder inside the package, file pattern)
PACKAGES = {
    "debian-handbook": ("usr/share/doc/debian-handbook/html/en-US", "*.html"),
    "debian-reference-en": ("usr/share/debian-reference", "*.en.html"),
    "perl-doc": ("usr/share/perl", "*.pod"),
    "postgresql-doc-15": ("usr/share/doc/postgresql-doc-15/html", "*.html"),
    "git-doc": ("usr/share/doc/git-doc", "*.html"),
}
EVALUATION_PACKAGES = {  # read by no training corpus: val and test pages only
    "debian-policy": ("usr/share/doc/debian-policy/policy.html", "*.html"),
    "developers-reference": ("usr/share/developers-reference", "*.html"),
    "maint-guide": ("usr/share/doc/maint-guide/html", "*.en.html"),
    "exim4-doc-html": ("usr/share/doc/exim4-doc-html/spec_html", "*.html"),
    "postfix-doc": ("usr/share/doc/postfix/html", "*.html"),
    "bind9-doc": ("usr/share/doc/bind9-doc", "*.html"),
    "libvirt-doc": ("usr/share/doc/libvirt-doc/html", "*.html"),
    "nodejs-doc": ("usr/share/doc/nodejs/api", "*.html"),
    "sphinx-doc": ("usr/share/doc/sphinx-doc/html", "*.html"),
}
MANUAL_PACKAGES = {  # read by no training corpus either: a second evaluation set, of application manuals
    "apache2-doc": ("usr/share/doc/apache2-doc/manual/en", "*.html"),
    "bacula-doc": ("usr/share/doc/bacula-doc/html", "*.html"),
    "cmake-doc": ("usr/share/doc/cmake-data/html", "*.html"),
    "debian-faq": ("usr/share/doc/debian/FAQ", "*.en.html"),
    "debian-history": ("usr/share/doc/debian-history/docs", "*.en.html"),
    "harden-doc": ("usr/share/doc/harden-doc/html/en-US", "*.html"),
    "octave-doc": ("usr/share/doc/octave/octave.html", "*.html"),
    "varnish-doc": ("usr/share/doc/varnish/html", "*.html"),
    "gnuplot-doc": ("usr/share/doc/gnuplot/htmldocs", "*.html"),
}
EVALUATION_SETS = {"guides": EVALUATION_PACKAGES, "manuals": MANUAL_PACKAGES}
MIN_WORDS = 6  # a shorter line is navigation, a heading or an option, not prose
BLOCKS = {"p", "li", "dd", "dt", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "div", "blockquote", "br"}
SKIPPED = {"pre", "code", "script", "style", "head"}


class _Paragraphs(html.parser.HTMLParser):
    """Text of an HTML page cut at block elements; preformatted text, scripts and styles left out."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.language = ""  # <html lang="...">, when the page says
        self._current: list[str] = []
        self._skipping = 0

    def flush(self):
        text = re.sub(r"\s+", " ", "".join(self._current)).strip()
        if text:
            self.paragraphs.append(text)
        self._current = []

    def handle_starttag(self, tag, attrs):
        if tag == "html":
            self.language = (dict(attrs).get("lang") or "").lower()
        if tag in SKIPPED:
            self._skipping += 1
        elif tag in BLOCKS:
            self.flush()

    def handle_endtag(self, tag):
        if tag in SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in BLOCKS:
            self.flush()

    def handle_data(self, data):
        if not self._skipping:
            self._current.append(data)

    def close(self):
        super().close()
        self.flush()


def prose(paragraphs: list[str]) -> list[str]:
    return [p for p in paragraphs if len(p.split()) >= MIN_WORDS and re.search(r"[A-Za-z]", p)]


def html_paragraphs(path: Path) -> list[str]:
    """The page's prose; none when the page says it is in another language than English (apache2-doc's
    English folder holds a few Portuguese pages)."""
    parser = _Paragraphs()
    parser.feed(decoded(path.read_bytes()))
    parser.close()
    if parser.language and not parser.language.startswith("en"):
        return []
    return prose(parser.paragraphs)


def pod_paragraphs(path: Path) -> list[str]:
    # --utf8: pod2text writes Latin-1 unless told, and "Ævar" (perlreapi) was read back as U+FFFD "var"
    rendered = subprocess.run(["pod2text", "--utf8", str(path)], capture_output=True, timeout=60)
    if rendered.returncode != 0:
        return []
    text = rendered.stdout.decode("utf-8", errors="replace")
    # pod2text separates paragraphs by blank lines and indents code further than prose (4 spaces)
    blocks = [b for b in re.split(r"\n\s*\n", text) if not b.startswith("        ")]
    return prose([re.sub(r"\s+", " ", b).strip() for b in blocks])


def split_of(doc_id: str, evaluation: bool = False) -> str:
    """val / test / train by a hash of the id (a tenth, a tenth, the rest); an evaluation package's page:
    val / test (half and half)."""
    bucket = hashlib.sha1(doc_id.encode()).digest()[0] % 10
    if evaluation:
        return "val" if bucket % 2 == 0 else "test"
    return "val" if bucket == 0 else "test" if bucket == 1 else "train"


def documents(unpacked: Path, packages: dict[str, tuple[str, str]]):
    for package, (folder, pattern) in packages.items():
        for path in sorted(p for p in (unpacked / package / folder).rglob(pattern) if p.is_file()):
            paragraphs = pod_paragraphs(path) if path.suffix == ".pod" else html_paragraphs(path)
            yield f"{package}/{path.name}", package, paragraphs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("runs/debian-docs"))
    parser.add_argument("--min-words", type=int, default=300, help="skip shorter documents")
    parser.add_argument(
        "--evaluation",
        nargs="?",
        const="guides",
        choices=list(EVALUATION_SETS),
        help="an evaluation set's pages (val and test only) instead (default set: guides)",
    )
    args = parser.parse_args(argv)
    packages = EVALUATION_SETS[args.evaluation] if args.evaluation else PACKAGES
    unpacked = fetch(list(packages), args.cache)
    seen: set[str] = set()
    counts: dict[str, int] = {}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as out:
        for doc_id, package, paragraphs in documents(unpacked, packages):
            text = "\n".join(paragraphs)
            digest = hashlib.sha1(text.encode()).hexdigest()
            if len(text.split()) < args.min_words or digest in seen:
                continue
            seen.add(digest)
            row = {"id": doc_id, "source": package, "split": split_of(doc_id, args.evaluation), "text": text}
            out.write(json.dumps(row) + "\n")
            counts[package] = counts.get(package, 0) + 1
    summary = ", ".join(f"{package} {n}" for package, n in counts.items())
    print(f"{sum(counts.values())} documents of >= {args.min_words} words ({summary}) -> {args.output}")


if __name__ == "__main__":
    main()
