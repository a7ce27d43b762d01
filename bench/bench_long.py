"""Really long documents: every model, truncated and whole, on this machine's long man pages (thousands of
words each; text no model here was trained on), against tf-idf and BM25, and fused with them.

Documents: English man pages of 2,000 to 10,000 words (scripts/man_corpus.py, rendered at run time, never
shipped), split in two by a hash of their names: `val` (for choosing modes and defaults) and `test`.
Two tasks, every document of the split a candidate, MRR x100 with ties counted against the gold:
- part -> document: a passage of three or more paragraphs (60 to 200 words) from the middle of a page is the
  query; its page, with that passage taken out, is the one right answer;
- halves: a page's first half (by words) is the query, its second half the answer.
Per model: MRR per split and task, by the length of the whole page in MiniLM tokens (512-2k, 2k-8k, > 8k),
the paired difference from tf-idf, BM25 and sbert-chunks on the same queries, encode seconds. Fusion rows
(`tfidf+sbert-chunks`, ...): z-scores per query, the weight chosen on val and applied to test.

    .venv/bin/python bench/bench_long.py [--docs 80] [--models sbert,sbert-chunks,...]
    .venv/bin/python bench/run.py --only long
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import warnings

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OUT = BENCH_DIR / "results" / "long.json"
WORK = ROOT / "runs" / "long"  # the rendered pages (runs/ is git-ignored: derived text is never committed)
BUCKETS = ((0, 512), (512, 2048), (2048, 8192), (8192, 10**9))
# (label, docembed.load name, options): each transformer family on its first window only and whole (the
# default of sbert, nugget and the student since 2026-11-25; sbert is then what sbert-chunks is)
MODELS = (
    ("tfidf", "tfidf", {}),
    ("bm25", "bm25", {}),
    ("static", "static", {}),
    ("sbert --long truncate", "sbert", {"long_documents": "truncate"}),
    ("sbert-chunks", "sbert-chunks", {}),
    ("sbert-windows", "sbert-windows", {}),
    ("nugget --long truncate", "nugget", {"long_documents": "truncate"}),
    ("nugget", "nugget", {}),
    ("student --long truncate", "student", {"long_documents": "truncate"}),
    ("student", "student", {}),
    # the student's other ways to read a whole page (#29): longer passes (positions tiled past the 2,048 it
    # was trained at), and late chunking (one vector per 256 tokens of the long pass, MaxSim)
    ("student --max-length 8192", "student", {"max_length": 8192}),
    ("student --long late-chunks", "student", {"long_documents": "late-chunks"}),
    (
        "student --long late-chunks --max-length 8192",
        "student",
        {"long_documents": "late-chunks", "max_length": 8192},
    ),
)


LEXICAL = ("tfidf", "bm25")  # fitted on each split's candidates
FUSED = ("sbert-chunks", "student")  # the whole-document models fused with each lexical rule (`fuse`)


def pages(limit: int) -> list[dict]:
    """Long man pages (2,000-10,000 words), rendered once into WORK, the first `limit` by name."""
    corpus = WORK / "man-pages.jsonl"
    if not corpus.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        script = ROOT / "scripts" / "man_corpus.py"
        subprocess.run([sys.executable, str(script), str(corpus), "--min-bytes", "12000"], check=True)
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if 2000 <= len(r["text"].split()) <= 10000]
    return sorted(rows, key=lambda r: r["id"])[:limit]


def split_of(page_id: str) -> str:
    return "val" if hashlib.sha1(page_id.encode()).digest()[0] % 2 == 0 else "test"


def part_task(page: dict, rng: np.random.Generator) -> tuple[str, str]:
    """(a passage of consecutive paragraphs from the middle of the page, the page without it)."""
    paragraphs = page["text"].split("\n")
    start = int(rng.integers(len(paragraphs) // 5, max(len(paragraphs) * 4 // 5, len(paragraphs) // 5 + 1)))
    end, words = start, 0
    while end < len(paragraphs) and (end - start < 3 or words < 60) and words < 200:
        words += len(paragraphs[end].split())
        end += 1
    return "\n".join(paragraphs[start:end]), "\n".join(paragraphs[:start] + paragraphs[end:])


def halves_task(page: dict) -> tuple[str, str]:
    words = page["text"].split(" ")
    return " ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2 :])


def reciprocal_ranks(scores: np.ndarray) -> np.ndarray:
    """Query i's answer is candidate i; ties with the answer count against it (pessimistic rank)."""
    gold = np.diag(scores)
    rank = 1 + (scores > gold[:, None]).sum(axis=1) + (scores == gold[:, None]).sum(axis=1) - 1
    return 1.0 / rank


def run_model(label: str, name: str, options: dict, tasks: dict) -> dict:
    import docembed

    model = docembed.load(name, device="cpu", **options)
    out = {"max_tokens": model.max_tokens, "seconds": 0.0, "tasks": {}, "scores": {}}
    for task, by_split in tasks.items():
        for split, (queries, candidates) in by_split.items():
            if name in LEXICAL:  # fitted on the split's candidates
                model = docembed.load(name, device="cpu")
                if name == "tfidf":  # the exact tf-idf rows: an LSA fitted on a few dozen pages is no rule
                    model.encoder.config.svd_dim = 0
                model.fit(candidates)
            started = time.perf_counter()
            with warnings.catch_warnings():  # truncation is what this bench measures: no warning per call
                warnings.simplefilter("ignore")
                if name == "bm25":  # a scorer: texts in, one row of scores per query
                    scores = model.similarity(queries, candidates)
                else:
                    scores = model.similarity(model.encode(queries), model.encode(candidates))
            out["seconds"] += time.perf_counter() - started
            out["tasks"].setdefault(task, {})[split] = reciprocal_ranks(scores).tolist()
            out["scores"].setdefault(task, {})[split] = np.asarray(scores, dtype=np.float64)
        print(f"[long] {label}: {task} done ({out['seconds']:.0f} s so far)", file=sys.stderr, flush=True)
    return out


def fuse(results: dict) -> dict:
    """Fusion rows: each lexical rule with each whole-document model, z-scores per query combined as
    (1 - w) lexical + w model (docembed's `LEXICAL+MODEL`), w chosen on the task's val split (MRR over
    0, 0.05, ..., 1) and applied unchanged to its test split."""
    from docembed.models.fusion import WEIGHT_GRID, normalize_rows

    rows = {}
    for lexical in LEXICAL:
        for model in FUSED:
            if lexical not in results or model not in results:
                continue
            row = {"max_tokens": None, "seconds": results[model]["seconds"], "tasks": {}, "weights": {}}
            for task, by_split in results[model]["scores"].items():
                z = {
                    split: (
                        normalize_rows(results[lexical]["scores"][task][split], "zscore"),
                        normalize_rows(scores, "zscore"),
                    )
                    for split, scores in by_split.items()
                }

                lex, dense = z["val"]
                best = max(  # ties: the weight nearest an even mix
                    WEIGHT_GRID,
                    key=lambda w, lex=lex, dense=dense: (
                        float(reciprocal_ranks((1 - w) * lex + w * dense).mean()),
                        -abs(w - 0.5),
                    ),
                )
                row["weights"][task] = best
                for split, (lex, dense) in z.items():
                    fused = (1 - best) * lex + best * dense
                    row["tasks"].setdefault(task, {})[split] = reciprocal_ranks(fused).tolist()
            rows[f"{lexical}+{model}"] = row
    return rows


def summarise(
    results: dict, lengths: dict, reference: tuple[str, ...] = ("tfidf", "bm25", "sbert-chunks")
) -> dict:
    from docembed.evaluation.statistics import paired_difference

    table = {}
    for label, result in results.items():
        rows = {}
        for task, by_split in result["tasks"].items():
            for split, rr in by_split.items():
                rr = np.asarray(rr)
                row = {"mrr": round(100 * float(rr.mean()), 2), "n": len(rr)}
                for low, high in BUCKETS:
                    inside = (lengths[split] >= low) & (lengths[split] < high)
                    if inside.any():
                        row[f"mrr_{low}-{high if high < 10**9 else 'more'}"] = round(
                            100 * float(rr[inside].mean()), 2
                        )
                for other in reference:
                    if other != label and other in results:
                        row[f"vs_{other}"] = paired_difference(rr, results[other]["tasks"][task][split])
                rows[f"{task}/{split}"] = row
        table[label] = {"max_tokens": result["max_tokens"], "seconds": round(result["seconds"], 1), **rows}
        if "weights" in result:
            table[label]["weight_chosen_on_val"] = result["weights"]
    return table


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    docs: int = 80,
    models: list[str] | None = None,
    out: pathlib.Path = OUT,
):
    import docembed

    chosen = [m for m in MODELS if models is None or m[0] in models]
    rng = np.random.default_rng(1111)
    corpus = pages(docs if not full else 10**6)
    tasks: dict[str, dict] = {"part": {}, "halves": {}}
    lengths = {}
    tokenizer = docembed.load("sbert", device="cpu").encoder.tokenizer
    for split in ("val", "test"):
        chosen_pages = [p for p in corpus if split_of(p["id"]) == split]
        parts = [part_task(p, rng) for p in chosen_pages]
        halves = [halves_task(p) for p in chosen_pages]
        tasks["part"][split] = ([q for q, _ in parts], [d for _, d in parts])
        tasks["halves"][split] = ([q for q, _ in halves], [d for _, d in halves])
        counts = tokenizer([p["text"] for p in chosen_pages], add_special_tokens=False, verbose=False)
        lengths[split] = np.array([len(ids) for ids in counts["input_ids"]])
    results = {label: run_model(label, name, options, tasks) for label, name, options in chosen}
    results.update(fuse(results))
    summary = {
        "data": f"{len(corpus)} English man pages of 2,000-10,000 words (this machine's /usr/share/man), "
        f"val {len(lengths['val'])} / test {len(lengths['test'])} by a hash of the page name",
        "tokens_per_page": {
            s: {"median": int(np.median(v)), "max": int(v.max())} for s, v in lengths.items()
        },
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "models": summarise(results, lengths),
    }
    pathlib.Path(out).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=80)
    parser.add_argument("--models", help="comma-separated labels (default: all)")
    parser.add_argument(
        "--out", type=pathlib.Path, default=OUT, help="results file (a subset: not long.json)"
    )
    args = parser.parse_args()
    result = main(docs=args.docs, models=args.models.split(",") if args.models else None, out=args.out)
    json.dump(result, sys.stdout, indent=1)
    print()
