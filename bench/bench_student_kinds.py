"""The long student on kinds of text beyond reviews and newsgroups (issue 35): Debian documentation and man
pages, each in a `val` split (for choosing a student) and a `test` split (for reporting).

Kinds and tasks (every document of a split is a candidate; MRR x100, ties counted against the gold):
- docs: Debian documentation (scripts/debian_docs.py: debian-handbook, debian-reference, perl-doc,
  postgresql-doc, git-doc; fetched from the Debian archive at run time, never shipped), pages of 600 to 8,000
  words, split by a hash of the page id (the student's training corpus takes only the `train` split);
  `docs-halves` (first half -> second half), `docs-part` (a passage of 60-200 words -> its page without it);
- man: bench_long's long man pages (2,000-10,000 words; the student never trains on a page that long), its
  val / test halves; `man-halves` and `man-part` as bench_long builds them.
Models: tf-idf (fitted on each split's candidates), sbert on its first window, sbert-chunks, the shipped
student, the student before distillation (`docembed convert-long sbert --max-length 2048`), and any student
folder given with `--student LABEL=PATH`. Each student row has its paired difference from sbert-chunks and
tf-idf; per-query reciprocal ranks are kept under runs/student_kinds/ so a rerun adds only new rows.

    .venv/bin/python bench/bench_student_kinds.py [--split val] [--student new=runs/zoo/student] \\
        [--man-pages 80 --out bench/results/other.json]
    .venv/bin/python bench/run.py --only student_kinds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OUT = BENCH_DIR / "results" / "student_kinds.json"
WORK = ROOT / "runs" / "student_kinds"
sys.path.insert(0, str(BENCH_DIR))

import bench_long  # noqa: E402  (its man pages, tasks and run_model)

DOC_WORDS = (600, 8000)
MODELS = (
    ("tfidf", "tfidf", {}),
    ("sbert --long truncate", "sbert", {"long_documents": "truncate"}),
    ("sbert-chunks", "sbert-chunks", {}),
    ("student", "student", {}),
)
REFERENCE = ("sbert-chunks", "tfidf")


def debian_docs() -> list[dict]:
    corpus = ROOT / "runs" / "debian-docs" / "docs.jsonl"
    if not corpus.exists():
        script = ROOT / "scripts" / "debian_docs.py"
        command = [sys.executable, str(script), str(corpus), "--cache", str(corpus.parent)]
        subprocess.run(command, check=True)
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if DOC_WORDS[0] <= len(r["text"].split()) <= DOC_WORDS[1]]


def before_distillation() -> str:
    """The student's starting point: MiniLM converted to 2,048 positions, built once under WORK."""
    folder = WORK / "student-before"
    if not (folder / "config.json").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        docembed = str(pathlib.Path(sys.executable).with_name("docembed"))
        command = [docembed, "convert-long", "sbert", "--max-length", "2048", "-o", str(folder)]
        subprocess.run(command, check=True, cwd=ROOT)
    return str(folder)


def tasks(splits: list[str], man_pages: int) -> dict[str, dict]:
    """{task: {split: (queries, candidates)}}; the passages of a split do not depend on the other split."""
    kinds = {
        "docs": [(p, p["split"]) for p in debian_docs()],
        "man": [(p, bench_long.split_of(p["id"])) for p in bench_long.pages(man_pages)],
    }
    out: dict[str, dict] = {}
    for split in splits:
        rng = np.random.default_rng(1111)
        for kind, pages in kinds.items():
            chosen = [page for page, page_split in pages if page_split == split]
            parts = [bench_long.part_task(p, rng) for p in chosen]
            halves = [bench_long.halves_task(p) for p in chosen]
            out.setdefault(f"{kind}-halves", {})[split] = ([q for q, _ in halves], [d for _, d in halves])
            out.setdefault(f"{kind}-part", {})[split] = ([q for q, _ in parts], [d for _, d in parts])
    return out


def task_key(task: str, split: str, pair: tuple[list[str], list[str]]) -> str:
    """A cache key that changes with the task's texts (other pages, passages or --man-pages)."""
    digest = hashlib.sha1(json.dumps(pair).encode()).hexdigest()[:16]
    return f"{task}/{split}/{digest}"


def ranks(label: str, name: str, options: dict, all_tasks: dict) -> dict[str, dict[str, list[float]]]:
    """Per-query reciprocal ranks of one model, computed once per task and kept under WORK, keyed by the
    model's identity (its weights' files and settings: a retrained model is measured again) and the task's
    texts."""
    import docembed
    from docembed.encoding import model_identity

    identity = model_identity(docembed.load(name, device="cpu", **options).encoder)
    cache = WORK / f"{label.replace(' ', '_').replace('/', '_')}-{identity}.json"
    known = json.loads(cache.read_text()) if cache.exists() else {}
    keys = {(t, s): task_key(t, s, pair) for t, by_split in all_tasks.items() for s, pair in by_split.items()}
    missing: dict[str, dict] = {}
    for (task, split), key in keys.items():
        if key not in known:
            missing.setdefault(task, {})[split] = all_tasks[task][split]
    if missing:
        result = bench_long.run_model(label, name, options, missing)
        for task, by_split in result["tasks"].items():
            known.update({keys[task, split]: rr for split, rr in by_split.items()})
        WORK.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known))
    return {task: {s: known[keys[task, s]] for s in by_split} for task, by_split in all_tasks.items()}


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    splits: list[str] | None = None,
    students: list[tuple[str, str]] = (),
    man_pages: int = 80,
    out: pathlib.Path = OUT,
) -> dict:
    from docembed.evaluation.statistics import paired_difference

    splits = splits or ["val", "test"]
    all_tasks = tasks(splits, man_pages)
    models = [*MODELS, ("student before distillation", before_distillation(), {})]
    models += [(label, path, {}) for label, path in students]
    results = {label: ranks(label, name, options, all_tasks) for label, name, options in models}
    table = {}
    for label, by_task in results.items():
        rows = {}
        for task, by_split in all_tasks.items():
            for split in by_split:
                rr = np.asarray(by_task[task][split])
                row = {"mrr": round(100 * float(rr.mean()), 2), "n": len(rr)}
                for other in REFERENCE:
                    if other != label:
                        row[f"vs_{other}"] = paired_difference(rr, results[other][task][split])
                rows[f"{task}/{split}"] = row
        table[label] = rows
    man_count = len(bench_long.pages(man_pages))
    summary = {
        "data": "Debian documentation pages of 600-8,000 words (scripts/debian_docs.py, split by page id) "
        f"and bench_long's man pages (the first {man_count} by name, split as bench_long splits them)",
        "queries": {f"{t}/{s}": len(q) for t, by in all_tasks.items() for s, (q, _) in by.items()},
        "students": dict(students),
        "models": table,
    }
    pathlib.Path(out).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("val", "test"), help="one split only (default: both)")
    parser.add_argument("--student", action="append", default=[], help="LABEL=PATH, a student folder")
    parser.add_argument("--man-pages", type=int, default=80, help="the first N long man pages (or all)")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="results file (default: the bench's)")
    args = parser.parse_args()
    chosen = [tuple(s.split("=", 1)) for s in args.student]
    splits = [args.split] if args.split else None
    result = main(splits=splits, students=chosen, man_pages=args.man_pages, out=args.out)
    json.dump(result, sys.stdout, indent=1)
    print()
