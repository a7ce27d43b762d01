"""The shipped student's training corpus: IMDB train and 20 Newsgroups train documents, mixed and shuffled
with a fixed seed, written as JSONL (id, text) for `docembed train-distill`. Only train splits: the test
splits are what the student is measured on. Every long document is kept, plus a sample of shorter ones: the
long ones are what the student exists for, the short ones feed the depth loss (SBERT reads them whole).

    python scripts/student_corpus.py runs/zoo/student-corpus.jsonl --long-words 350 --short 1000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from docembed import datasets

SOURCES = ("imdb/train", "20newsgroups/train")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument(
        "--long-words", type=int, default=350, help="a document of at least this many words is long"
    )
    parser.add_argument(
        "--short", type=int, default=1000, help="how many shorter documents follow the long ones"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    long_docs, short_docs = [], []
    for source in SOURCES:
        for doc in datasets.documents(source):
            words = len(doc.text.split())
            row = {"id": f"{source}/{doc.id}", "text": doc.text}
            (long_docs if words >= args.long_words else short_docs).append(row)
    rng = random.Random(args.seed)
    rng.shuffle(long_docs)
    rng.shuffle(short_docs)
    rows = long_docs + short_docs[: args.short]
    rng.shuffle(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(
        f"{len(long_docs)} long (>= {args.long_words} words) + {min(args.short, len(short_docs))} shorter"
        f" documents -> {args.output}"
    )


if __name__ == "__main__":
    main()
