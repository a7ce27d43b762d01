"""The student's training corpus, written as JSONL (id, text) for `docembed train-distill`.

IMDB train and 20 Newsgroups train documents, mixed and shuffled with a fixed seed: every long document, plus
a sample of shorter ones (the long ones are what the student exists for, the short ones feed the depth loss,
SBERT reads them whole). Only train splits: the test splits are what the student is measured on.

Varied long text (issue 35), each source optional:
- `--docs`: Debian documentation (scripts/debian_docs.py: debian-handbook, debian-reference, perl-doc,
  postgresql-doc, git-doc), its `train` split only;
- `--man`: man pages (scripts/man_corpus.py) of fewer than 2,000 words, so none of bench_long's pages
  (2,000 to 10,000 words, its val and test) is trained on.
A long document of these is cut at paragraph boundaries into segments of at most `--segment-words` words (the
student trains at 2,048 tokens; a segment is a document the teachers read whole), `--max-segments` evenly
spread ones kept per document so that a few huge manuals do not dominate.

    python scripts/student_corpus.py runs/zoo/student-corpus.jsonl --long-words 350 --short 1000
    python scripts/student_corpus.py runs/zoo/student-varied.jsonl --long 500 --short 200 \\
        --docs runs/debian-docs/docs.jsonl --man-limit 500 \\
        --man runs/debian-docs/man-pages.jsonl runs/debian-docs/man-578.jsonl

`--varied-only` writes the varied documents alone (no IMDB / 20NG): with `--max-segments 1 --segment-words
1000000` each page whole, the pair documents of `train-distill --pairs-from`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from docembed import datasets

SOURCES = ("imdb/train", "20newsgroups/train")
MAN_MAX_WORDS = 2000  # bench_long measures on man pages of 2,000-10,000 words


def segments(text: str, max_words: int, keep: int) -> list[str]:
    """`text` cut at paragraph (line) boundaries into pieces of at most about `max_words` words; at most
    `keep` of them, evenly spread over the document."""
    pieces, current, words = [], [], 0
    for paragraph in text.split("\n"):
        n = len(paragraph.split())
        if current and words + n > max_words:
            pieces.append("\n".join(current))
            current, words = [], 0
        current.append(paragraph)
        words += n
    if current:
        pieces.append("\n".join(current))
    if len(pieces) <= keep:
        return pieces
    step = len(pieces) / keep
    return [pieces[int(i * step)] for i in range(keep)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def varied_rows(args, rng: random.Random) -> list[dict]:
    rows = []
    if args.docs:
        for doc in read_jsonl(args.docs):
            if doc.get("split", "train") != "train":
                continue
            for i, piece in enumerate(segments(doc["text"], args.segment_words, args.max_segments)):
                rows.append({"id": f"docs/{doc['id']}#{i}", "text": piece})
    if args.man:
        pages = [
            p
            for path in args.man
            for p in read_jsonl(path)
            if args.long_words <= len(p["text"].split()) < MAN_MAX_WORDS
        ]
        rng.shuffle(pages)
        per_family: dict[str, int] = {}
        kept = []
        for page in pages:  # at most 3 pages per command family (gcloud_*, git-*, ...): varied text
            family = re.split(r"[_.-]", page["id"].split("/")[-1])[0]
            per_family[family] = per_family.get(family, 0) + 1
            if per_family[family] <= 3:
                kept.append(page)
        for page in kept[: args.man_limit]:
            for i, piece in enumerate(segments(page["text"], args.segment_words, args.max_segments)):
                rows.append({"id": f"{page['id']}#{i}", "text": piece})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument(
        "--long-words", type=int, default=350, help="a document of at least this many words is long"
    )
    parser.add_argument("--long", type=int, default=None, help="IMDB/20NG long documents kept (default: all)")
    parser.add_argument(
        "--short", type=int, default=1000, help="how many shorter documents follow the long ones"
    )
    parser.add_argument("--docs", type=Path, help="Debian documentation JSONL (scripts/debian_docs.py)")
    parser.add_argument("--man", type=Path, nargs="+", help="man pages JSONL (scripts/man_corpus.py)")
    parser.add_argument("--man-limit", type=int, default=10**9, help="man pages kept (a seeded sample)")
    parser.add_argument("--segment-words", type=int, default=1400)
    parser.add_argument("--max-segments", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--varied-only", action="store_true", help="only --docs and --man documents")
    args = parser.parse_args(argv)
    long_docs, short_docs = [], []
    for source in () if args.varied_only else SOURCES:
        for doc in datasets.documents(source):
            words = len(doc.text.split())
            row = {"id": f"{source}/{doc.id}", "text": doc.text}
            (long_docs if words >= args.long_words else short_docs).append(row)
    rng = random.Random(args.seed)
    rng.shuffle(long_docs)
    rng.shuffle(short_docs)
    long_docs = long_docs[: args.long]
    varied = varied_rows(args, rng)
    rows = long_docs + short_docs[: args.short] + varied
    rng.shuffle(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(
        f"{len(long_docs)} long (>= {args.long_words} words) + {min(args.short, len(short_docs))} shorter"
        f" IMDB/20NG documents + {len(varied)} documentation segments -> {args.output}"
    )


if __name__ == "__main__":
    main()
