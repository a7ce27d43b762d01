"""QuickThoughts against averaged GloVe (the same GloVe 6B 50d vectors QuickThoughts starts from).

Measures, through the evaluation harness (docembed.evaluation), for each model:
- SentEval MR, CR, SUBJ, MPQA: logistic-regression probe accuracy x100, 10-fold stratified CV (shuffle,
  seed 1111), C from 2^-2..2^3 chosen in each training fold by an inner stratified CV. `full=True` uses
  10 inner folds (SentEval); the default uses 3 inner folds, to fit a shared 2-core machine.
- STS-B and SICK-R test: Spearman x100 of cosine similarity (unsupervised).
plus, for trained QuickThoughts models, their training summary (steps, sentences/s, last loss and
neighbour accuracy) read from the model directory.

Models: `glove-avg` and the QuickThoughts runs under runs/qt-c{1,2,3} (context size 1..3) when present;
`--model` picks others. Each model can run in its own process and the JSON files merge afterwards:

    .venv/bin/python bench/bench_quickthoughts.py --model runs/qt-c1 --out bench/results/qt
    .venv/bin/python bench/bench_quickthoughts.py --merge --out bench/results/qt
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import time

DEFAULT_MODELS = ("glove-avg", "runs/qt-c1", "runs/qt-c2", "runs/qt-c3")
SENTEVAL = ("mr", "cr", "subj", "mpqa")
STS = ("stsb", "sick")
REFERENCE = {
    "quickthoughts (paper, uni-GRU, BookCorpus 6 h)": {
        "mr": 76.71,
        "cr": 83.95,
        "subj": 91.74,
        "mpqa": 88.61,
    },
    "glove-avg (300d, SentEval)": {
        "mr": 77.25,
        "cr": 78.30,
        "subj": 91.17,
        "mpqa": 87.85,
        "stsb": 58.02,
        "sick": 53.76,
    },
}


# The C grid of the skip-thoughts evaluation code that the QuickThoughts reference (lajanugen/S2V,
# src/evaluate.py -> eval_classification.eval_nested_kfold) reports its SentEval numbers with.
REFERENCE_GRID = tuple(2.0**t for t in range(0, 9))


def evaluate_model(
    spec: str,
    inner_folds: int,
    limit: int | None = None,
    outer_folds: int = 10,
    checkpoint=None,
    tasks: tuple[str, ...] = SENTEVAL + STS,
    grid: str = "senteval",
) -> dict:
    """Every task's primary score for one model, plus timings and (for trained models) the training run."""
    from docembed.evaluation import EvalOptions, get_evaluator, load_evaluation_model
    from docembed.evaluation.probes import SENTEVAL_GRID, senteval_cv_accuracy

    model = load_evaluation_model(spec)
    options = EvalOptions(limit=limit, seed=1111, batch_size=128, cache=False)
    entry: dict = {"model": spec, "family": model.family, "dim": int(model.dim), "scores": {}, "details": {}}
    entry["protocol"] = {"outer_folds": outer_folds, "inner_folds": inner_folds, "limit": limit, "grid": grid}
    for name in (t for t in STS if t in tasks):
        result = get_evaluator(name, options).run(model)
        entry["scores"][name] = round(result.score, 2)
        entry["details"][name] = {"pairs": result.metrics["pairs"], "seconds": result.seconds}
        print(f"{spec} {name}: {entry['scores'][name]}", file=sys.stderr, flush=True)
    for name in (t for t in SENTEVAL if t in tasks):
        task = get_evaluator(name, options)
        started = time.perf_counter()
        texts, labels = task.sentences, task.labels
        features = task.embed_for_probe(model, texts)
        embed_seconds = time.perf_counter() - started
        c_grid = REFERENCE_GRID if grid == "reference" else SENTEVAL_GRID
        result = senteval_cv_accuracy(features, labels, outer_folds, inner_folds, seed=1111, grid=c_grid)
        entry["scores"][name] = round(100.0 * result["accuracy"], 2)
        entry["details"][name] = {
            "accuracy_std": round(100.0 * result["accuracy_std"], 2),
            "c_per_fold": result["c"],
            "examples": len(texts),
            "embed_s": round(embed_seconds, 1),
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"{spec} {name}: {entry['scores'][name]}", file=sys.stderr, flush=True)
        if checkpoint:  # partial results survive an interrupted run
            checkpoint(entry)
    summary_path = pathlib.Path(spec) / "train_summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        entry["training"] = {
            "steps": summary["steps"],
            "seconds": summary["seconds"],
            "sentences_per_s": summary["sentences_per_s"],
            "last": summary.get("last"),
            "corpus": summary.get("corpus"),
            "config": json.loads((pathlib.Path(spec) / "config.json").read_text())["config"],
        }
    return entry


def _file_for(spec: str) -> str:
    return "model__" + (re.sub(r"[^A-Za-z0-9._-]+", "_", spec).strip("_") or "model") + ".json"


def merge(out_dir: pathlib.Path) -> dict:
    """Combine the per-model files into one table with QuickThoughts - GloVe differences (each model against
    the glove-avg entry measured with the same probe grid)."""
    entries = [json.loads(p.read_text()) for p in sorted(out_dir.glob("model__*.json"))]
    result: dict = {"models": entries, "reference": REFERENCE}

    def grid_of(entry):
        return entry.get("protocol", {}).get("grid", "senteval")

    gloves = {grid_of(e): e for e in entries if e["model"] == "glove-avg"}
    for entry in entries:
        glove = gloves.get(grid_of(entry))
        if glove is None or entry is glove:
            continue
        delta = {
            k: round(v - glove["scores"][k], 2) for k, v in entry["scores"].items() if k in glove["scores"]
        }
        entry["minus_glove_avg"] = delta
        entry["senteval_wins_over_glove_avg"] = sum(delta.get(k, 0) > 0 for k in SENTEVAL)
    (out_dir / "bench_quickthoughts.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(
    out_dir: pathlib.Path,
    full: bool = False,
    models: tuple[str, ...] | None = None,
    limit: int | None = None,
    outer_folds: int = 10,
    inner_folds: int | None = None,
    tasks: tuple[str, ...] = SENTEVAL + STS,
    grid: str = "senteval",
) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    inner = inner_folds or (10 if full else 3)
    specs = models or tuple(
        m for m in DEFAULT_MODELS if not m.startswith("runs/") or pathlib.Path(m).is_dir()
    )
    for spec in specs:
        started = time.perf_counter()
        path = out_dir / _file_for(spec if grid == "senteval" else f"{spec}__grid-{grid}")

        def save(entry, path=path):
            path.write_text(json.dumps(entry, indent=2) + "\n")

        entry = evaluate_model(spec, inner, limit, outer_folds, checkpoint=save, tasks=tasks, grid=grid)
        entry["eval_seconds"] = round(time.perf_counter() - started, 1)
        entry["load_average"] = os.getloadavg()
        save(entry)
    return merge(out_dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/quickthoughts")
    parser.add_argument("--full", action="store_true", help="10 inner folds (SentEval) instead of 3")
    parser.add_argument(
        "--model", action="append", help="model(s) to evaluate (default: glove-avg + runs/qt-c*)"
    )
    parser.add_argument("--outer-folds", type=int, default=10)
    parser.add_argument("--inner-folds", type=int, default=None, help="default 3 (10 with --full)")
    parser.add_argument("--tasks", default=",".join(SENTEVAL + STS), help="comma-separated subset")
    parser.add_argument(
        "--grid",
        choices=("senteval", "reference"),
        default="senteval",
        help="probe C grid: SentEval's 2^-2..2^3 (the harness) or the QuickThoughts reference's 2^0..2^8",
    )
    parser.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    parser.add_argument("--merge", action="store_true", help="only merge the per-model files in --out")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    if args.merge:
        print(json.dumps(merge(out), indent=2))
    else:
        models = tuple(args.model) if args.model else None
        print(
            json.dumps(
                main(
                    out,
                    args.full,
                    models,
                    args.limit,
                    args.outer_folds,
                    args.inner_folds,
                    tuple(args.tasks.split(",")),
                    args.grid,
                ),
                indent=2,
            )
        )
