"""The retriever's training and validation documents (issue 45), written as JSONL for `docembed
train-retriever`: {"id", "text", "group", "summary"?}.

Sources (every one a train split, or text the benchmarks never use):
- Debian documentation (scripts/debian_docs.py: debian-handbook, debian-reference, perl-doc, postgresql-doc,
  git-doc): its `train` pages to train, its `val` pages to validate; a page cut at paragraphs into segments
  of at most 1,400 words, 3 of them at most; the group is the manual;
- man pages (scripts/man_corpus.py) of 300 to 2,000 words to train, at most 3 per command family, with the
  one-line description of their NAME section (`lexgrog`) as summary; bench_long's val pages (2,000 words
  or more) to validate; the group is "man". `--man-extra` adds more pages after those (their own shuffle,
  so the rest of the corpus stays the same): pages of sections 1, 5, 7 and 8 under 2,000 words (the bench
  measures on the longer ones) and pages of the other sections (system calls, library functions: the bench
  reads none) of any length, until a family has `--extra-per-family` pages in all;
- 20 Newsgroups train posts of 60 words or more, grouped by newsgroup (a batch's negatives are posts on the
  same subject); a seeded sample, some of them held out to validate;
- IMDB train reviews of 150 words or more, a seeded sample (text unlike the documentation).
Nothing from linux-doc or python-doc; the benchmarks' test splits are not read.

    python scripts/retriever_corpus.py runs/retriever --docs runs/debian-docs/docs.jsonl \\
        --man runs/retriever/man-pages.jsonl --man-val runs/long/man-pages.jsonl \\
        [--man-extra runs/man-1000.jsonl --man-extra runs/man-dev.jsonl]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path

from man_corpus import COMMAND_SECTIONS, man_description
from student_corpus import MAN_MAX_WORDS, read_jsonl, segments

from docembed import datasets

SEGMENT_WORDS = 1400
MAX_SEGMENTS = 3
BENCH_SECTIONS = {f"man{s}" for s in COMMAND_SECTIONS}  # bench_long's long pages come from these


def man_family(page_id: str) -> str:
    return re.split(r"[_.-]", page_id.split("/")[-1])[0]  # git-log -> git, EVP_EncryptInit.3ssl -> EVP


def extra_man_pages(paths: list[Path], taken: set[str], per_family: dict[str, int], cap: int, seed: int):
    """Pages of `paths` not in `taken` that the bench never reads, shuffled, while their family has fewer
    than `cap` pages (`per_family` counts the pages kept so far)."""
    pages, seen = [], set(taken)
    for path in paths:
        for page in read_jsonl(path):
            words = len(page["text"].split())
            short_enough = words < MAN_MAX_WORDS or page["id"].split("/")[0] not in BENCH_SECTIONS
            if page["id"] not in seen and words >= 300 and short_enough:
                seen.add(page["id"])
                pages.append(page)
    random.Random(seed).shuffle(pages)
    kept = []
    for page in pages:
        family = man_family(page["id"])
        if per_family.get(family, 0) < cap:
            per_family[family] = per_family.get(family, 0) + 1
            kept.append(page)
    return kept


def man_split(page_id: str) -> str:
    """bench_long's split of a long man page (val or test)."""
    return "val" if hashlib.sha1(page_id.encode()).digest()[0] % 2 == 0 else "test"


def segmented(doc_id: str, text: str, group: str, summary=None, keep: int = MAX_SEGMENTS) -> list[dict]:
    rows = []
    for i, piece in enumerate(segments(text, SEGMENT_WORDS, keep)):
        row = {"id": f"{doc_id}#{i}", "text": piece, "group": group}
        if summary and i == 0:  # the summary describes the page's opening
            row["summary"] = summary
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="folder for train.jsonl and val.jsonl")
    parser.add_argument("--docs", type=Path, required=True)
    parser.add_argument("--man", type=Path, required=True, help="man pages to train on (man_corpus.py)")
    parser.add_argument("--man-val", type=Path, required=True, help="bench_long's long man pages")
    parser.add_argument(
        "--man-extra", type=Path, action="append", default=[], help="more man pages (man_corpus.py output)"
    )
    parser.add_argument("--extra-per-family", type=int, default=5, help="--man-extra pages per family")
    parser.add_argument("--newsgroups", type=int, default=3000, help="20NG train posts to train on")
    parser.add_argument("--imdb", type=int, default=1000, help="IMDB train reviews to train on")
    parser.add_argument("--val-posts", type=int, default=60, help="20NG / IMDB documents held out each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    train, val = [], []
    for doc in read_jsonl(args.docs):
        split, group = doc.get("split", "train"), doc["id"].split("/")[0]
        if split == "train":
            train += segmented(f"docs/{doc['id']}", doc["text"], group)
        elif split == "val":  # one segment of each page: validation runs every few dozen steps
            val += segmented(f"docs/{doc['id']}", doc["text"], group, keep=1)
    pages = [p for p in read_jsonl(args.man) if 300 <= len(p["text"].split()) < MAN_MAX_WORDS]
    rng.shuffle(pages)
    per_family: dict[str, int] = {}  # pages kept
    for page in pages:  # varied text: at most 3 pages per command family (git-*, gcloud_*, ...)
        family = man_family(page["id"])
        if per_family.get(family, 0) < 3:
            per_family[family] = per_family.get(family, 0) + 1
            train += segmented(page["id"], page["text"], "man", man_description(page["id"]))
    taken = {row["id"].split("#")[0] for row in train}
    for page in extra_man_pages(args.man_extra, taken, per_family, args.extra_per_family, args.seed):
        train += segmented(page["id"], page["text"], "man", man_description(page["id"]))
    for page in read_jsonl(args.man_val):
        if man_split(page["id"]) == "val":
            val += segmented(page["id"], page["text"], "man", man_description(page["id"]), keep=1)
    posts = [d for d in datasets.documents("20newsgroups/train") if len(d.text.split()) >= 60]
    rng.shuffle(posts)
    for i, post in enumerate(posts[: args.newsgroups + args.val_posts]):
        newsgroup = post.id.rsplit("-", 1)[0]  # 20ng-train-sci.space-61234 -> its newsgroup
        row = {"id": f"20newsgroups/{post.id}", "text": post.text, "group": f"20newsgroups/{newsgroup}"}
        (val if i < args.val_posts else train).append(row)
    reviews = [d for d in datasets.documents("imdb/train") if len(d.text.split()) >= 150]
    rng.shuffle(reviews)
    for i, review in enumerate(reviews[: args.imdb + args.val_posts]):
        row = {"id": f"imdb/{review.id}", "text": review.text, "group": "imdb"}
        (val if i < args.val_posts else train).append(row)
    rng.shuffle(train)
    args.output.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val)):
        with open(args.output / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
        groups = {r["group"].split("/")[0] for r in rows}
        summaries = sum("summary" in r for r in rows)
        print(f"{name}: {len(rows)} documents ({summaries} with a summary) from {sorted(groups)}")


if __name__ == "__main__":
    main()
