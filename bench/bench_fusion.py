"""Fusion of a lexical rule (tf-idf, BM25) with a docembed model on long-document *validation* tasks: the
weight chosen on validation queries and the fused MRR against each part alone (docembed.models.fusion).

Tasks (validation splits only; every document of a task is a candidate; MRR x100, ties against the gold):
- `man-part-val`, `man-halves-val`: bench/bench_long.py's two tasks on the `val` half of its long man pages
  (a passage -> its page; first half -> second half);
- `halves-val`: evaluation/long_documents.py's halves-val (long IMDB / 20NG *train* documents, first half ->
  second half), a seeded sample.
The lexical part is fitted on each task's candidates (as bench_long fits tf-idf). For each pair the weight
is chosen on all of a task's queries (`weight`, `mrr_in_sample`: optimistic), and by 2-fold
cross-validation over its queries (choose on the even queries, score the odd ones, and back:
`mrr_cv`, the honest figure); z-score normalisation, and RRF (k = 60) beside it.

    .venv/bin/python bench/bench_fusion.py [--docs 100] [--models static,sbert]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import warnings

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
OUT = BENCH_DIR / "results" / "fusion.json"
sys.path.insert(0, str(BENCH_DIR))

from bench_long import reciprocal_ranks  # noqa: E402  (query i's answer is candidate i; ties against it)


def tasks(docs: int) -> dict[str, tuple[list[str], list[str]]]:
    import bench_long
    from docembed.evaluation.base import EvalOptions
    from docembed.evaluation.long_documents import HalvesValidation

    rng = np.random.default_rng(1111)
    pages = [p for p in bench_long.pages(docs * 2) if bench_long.split_of(p["id"]) == "val"][:docs]
    parts = [bench_long.part_task(p, rng) for p in pages]
    halves = [bench_long.halves_task(p) for p in pages]
    out = {
        "man-part-val": ([q for q, _ in parts], [d for _, d in parts]),
        "man-halves-val": ([q for q, _ in halves], [d for _, d in halves]),
    }
    task = HalvesValidation.from_data_root(EvalOptions(seed=1111))
    sample = np.sort(np.random.default_rng(1111).choice(len(task.documents), size=docs, replace=False))
    firsts, seconds = [], []
    for i in sample:  # cut as Halves.compute cuts
        words = task.documents[i].split()
        firsts.append(" ".join(words[: len(words) // 2]))
        seconds.append(" ".join(words[len(words) // 2 :]))
    out["halves-val"] = (firsts, seconds)
    return out


def lexical_scores(kind: str, queries: list[str], candidates: list[str]) -> np.ndarray:
    from docembed.models.baselines import fit_bm25, fit_tfidf

    if kind == "tfidf":
        model = fit_tfidf(candidates)
        return np.asarray((model.encode_sparse(queries) @ model.encode_sparse(candidates).T).todense())
    return fit_bm25(candidates).score_matrix(queries, candidates).astype(np.float64)


def model_scores(model, queries: list[str], candidates: list[str]) -> np.ndarray:
    """`model` (a `docembed.load` model): cosine or mean-MaxSim of every query with every candidate."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(model.similarity(model.encode(queries), model.encode(candidates)), dtype=np.float64)


def mrr(rr) -> float:
    return round(100.0 * float(np.mean(rr)), 2)


def fused_rr(lex: np.ndarray, mod: np.ndarray, weight: float, method: str, rows) -> np.ndarray:
    from docembed.models.fusion import fuse

    fused = fuse(lex[rows], mod[rows], weight, method)
    gold = fused[np.arange(len(rows)), rows]
    return 1.0 / ((fused >= gold[:, None]).sum(axis=1))


def choose(lex, mod, rows, method) -> tuple[float, dict]:
    from docembed.models.fusion import choose_weight

    return choose_weight([lex[[r]] for r in rows], [mod[[r]] for r in rows], list(rows), method)


def evaluate_pair(lex: np.ndarray, mod: np.ndarray, method: str) -> dict:
    n = len(lex)
    every = np.arange(n)
    weight, table = choose(lex, mod, every, method)
    folds = (every[::2], every[1::2])
    cv = np.zeros(n)
    cv_weights = []
    for pick, score in (folds, folds[::-1]):
        w, _ = choose(lex, mod, pick, method)
        cv_weights.append(w)
        cv[score] = fused_rr(lex, mod, w, method, score)
    return {
        "weight": weight,
        "mrr_in_sample": table[weight],
        "mrr_cv": mrr(cv),
        "cv_weights": cv_weights,
        "mrr_weight_0.5": table[0.5],
        "per_item_cv": cv.tolist(),
    }


def headline(table: dict) -> dict:
    """Per task: the best part alone and the best fusion (cross-validated MRR), with its paired difference."""
    out = {}
    for task, rows in table.items():
        alone = max((k for k in rows if "+" not in k), key=lambda k: rows[k]["mrr"])
        fused = max((k for k in rows if "+" in k), key=lambda k: rows[k]["mrr_cv"])
        row = rows[fused]
        out[task] = (
            f"best alone {alone} {rows[alone]['mrr']}; best fusion {fused} {row['mrr_cv']} (cross-validated; "
            f"weight {row['weight']} on all queries), vs {row['vs_best_part']['part']} "
            f"{row['vs_best_part']['diff']:+} +- {row['vs_best_part']['se']}"
        )
    return out


def main(
    out_dir: pathlib.Path | None = None, full: bool = False, docs: int = 100, models=("static", "sbert")
):
    import docembed
    from docembed.evaluation.statistics import paired_difference

    started = time.perf_counter()
    data = tasks(docs)
    summary: dict = {
        "data": {name: f"{len(q)} queries, all {len(c)} candidates" for name, (q, c) in data.items()},
        "protocol": " ".join(__doc__.split("\n\n")[1].split()),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "tasks": {},
    }
    loaded = {name: docembed.load(name, device="cpu") for name in models}
    for task, (queries, candidates) in data.items():
        rows: dict = {}
        lexical = {kind: lexical_scores(kind, queries, candidates) for kind in ("tfidf", "bm25")}
        for kind, scores in lexical.items():
            rows[kind] = {"mrr": mrr(reciprocal_ranks(scores))}
        for name, model in loaded.items():
            t = time.perf_counter()
            dense = model_scores(model, queries, candidates)
            rows[name] = {"mrr": mrr(reciprocal_ranks(dense)), "seconds": round(time.perf_counter() - t, 1)}
            for kind, scores in lexical.items():
                for method in ("zscore", "rrf"):
                    label = f"{kind}+{name}" + (" rrf" if method == "rrf" else "")
                    result = evaluate_pair(scores, dense, method)
                    best_alone = max(
                        (reciprocal_ranks(scores), kind),
                        (reciprocal_ranks(dense), name),
                        key=lambda x: x[0].mean(),
                    )
                    result["vs_best_part"] = {
                        "part": best_alone[1],
                        **paired_difference(np.asarray(result.pop("per_item_cv")), best_alone[0]),
                    }
                    rows[label] = result
            print(f"[fusion] {task}: {name} done", file=sys.stderr, flush=True)
        summary["tasks"][task] = rows
    summary["headline"] = headline(summary["tasks"])
    summary["seconds"] = round(time.perf_counter() - started, 1)
    OUT.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--models", default="static,sbert")
    args = parser.parse_args()
    result = main(docs=args.docs, models=tuple(args.models.split(",")))
    json.dump(result, sys.stdout, indent=1)
    print()
