"""Quality: every evaluation task for every available baseline, on modest seeded subsets by default.

Subsets (default run; `full=True` runs the full sets, SentEval with 10 outer / 10 inner folds):
- paraphrase-identification dev: all 1,024 queries (2,048 documents);
- SentEval MR/CR/SUBJ/MPQA: 2,000 sentences each, stratified, `--fast` protocol (5 outer / 3 inner folds);
- STS-B and SICK-R test: all pairs (1,379 / 4,927);
- IMDB and 20 Newsgroups: 2,000 training and 2,000 test documents each, stratified;
- 20 Newsgroups retrieval: 2,000 test documents, stratified.
All subsets are drawn with seed 1111. Models: tfidf (fitted per task), bm25 (PI only: it is a scorer),
glove-avg, sbert, sbert-tokens (PI and STS: all-pairs MaxSim over 2,000 long documents is too slow on a
CPU), and pv (PV-DBOW trained per task on that task's training text; see PV_SETTINGS; the trained models
are kept under $DOCEMBED_HOME/cache/bench-pv/, keyed by the hash of their training text).

A failing cell is recorded as {"error": ...} and the run goes on.

    .venv/bin/python bench/bench_quality.py [--full] [--out DIR] [--models tfidf,sbert] [--tasks pi,imdb]
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback

DEFAULT_LIMITS = {
    "paraphrase-identification": None,
    "mr": 2000,
    "cr": 2000,
    "subj": 2000,
    "mpqa": 2000,
    "stsb": None,
    "sick": None,
    "imdb": 2000,
    "20newsgroups": 2000,
    "20newsgroups-retrieval": 2000,
}
SENTEVAL = ("mr", "cr", "subj", "mpqa")
STS = ("stsb", "sick")
DOCS = ("imdb", "20newsgroups", "20newsgroups-retrieval")
PI = ("paraphrase-identification",)
PLAN = {
    "tfidf": PI + SENTEVAL + STS + DOCS,
    "bm25": PI,
    "glove-avg": PI + SENTEVAL + STS + DOCS,
    "sbert": PI + SENTEVAL + STS + DOCS,
    "sbert-tokens": PI + STS,
    "pv": PI + DOCS,
}
# PV-DBOW with interleaved word training, trained on each task's own training text (a few thousand docs).
PV_SETTINGS = {
    "mode": "dbow",
    "vector_size": 300,
    "epochs": 20,
    "min_count": 2,
    "window": 10,
    "negative": 5,
    "dbow_words": True,
    "workers": 1,
    "encode_workers": 2,
    "seed": 0,
}


def _pv_for(evaluator, work_dir: pathlib.Path):
    """PV trained on the evaluator's training text, saved and loaded back (so the cache keys on it)."""
    from docembed.models.baselines import texts_hash
    from docembed.models.paragraph_vector import PVConfig, train_paragraph_vectors
    from docembed.models.registry import load_model

    texts = evaluator.fit_texts()
    # keyed by the training text only: tasks that train on the same text (20NG and its retrieval) share one
    directory = work_dir / f"pv-{texts_hash(texts)}"
    if not (directory / "config.json").exists():
        model, _ = train_paragraph_vectors(texts, PVConfig(**PV_SETTINGS))
        model.save(directory)
    model = load_model(str(directory))
    model.name = "pv"
    return model, f"pv trained on {len(texts)} texts: {evaluator.fit_description()}"


def main(
    out_dir: pathlib.Path, full: bool = False, models: list[str] | None = None, tasks: list[str] | None = None
) -> dict:
    from docembed.evaluation import TASKS, EvalOptions, load_evaluation_model, resolve_tasks
    from docembed.models.registry import models_home
    from docembed.runtime import log

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted_tasks = resolve_tasks(tasks) if tasks else list(DEFAULT_LIMITS)
    result: dict = {
        "full": full,
        "limits": {t: (None if full else DEFAULT_LIMITS[t]) for t in wanted_tasks},
        "senteval_folds": "10 outer / 10 inner" if full else "5 outer / 3 inner (--fast)",
        "seed": 1111,
        "pv_settings": PV_SETTINGS,
        "load_before": os.getloadavg(),
        "results": {},
    }
    for model_name in models or list(PLAN):
        result["results"][model_name] = {}
        loaded = None
        for task in PLAN.get(model_name, tuple(DEFAULT_LIMITS)):
            if task not in wanted_tasks:
                continue
            options = EvalOptions(limit=None if full else DEFAULT_LIMITS[task], fast=not full, seed=1111)
            evaluator = TASKS[task](options)
            started = time.perf_counter()
            try:
                if model_name == "pv":
                    model, note = _pv_for(evaluator, models_home() / "cache" / "bench-pv")
                else:
                    loaded = loaded or load_evaluation_model(model_name)
                    model, note = loaded, None
                outcome = evaluator.run(model).to_dict()
                if note:
                    outcome["notes"].insert(0, note)
            except ImportError as error:
                outcome = {"missing": f"model family not available: {error}"}
            except Exception as error:  # one broken cell must not lose the rest of the run
                outcome = {
                    "error": f"{type(error).__name__}: {error}",
                    "trace": traceback.format_exc(limit=3),
                }
            outcome["wall_seconds"] = round(time.perf_counter() - started, 1)
            result["results"][model_name][task] = outcome
            shown = outcome.get("score", outcome.get("error", outcome.get("missing")))
            log(f"bench quality: {model_name} / {task}: {shown} ({outcome['wall_seconds']}s)")
            (out_dir / "bench_quality.partial.json").write_text(json.dumps(result, indent=2) + "\n")
    result["load_after"] = os.getloadavg()
    (out_dir / "bench_quality.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "bench_quality.partial.json").unlink(missing_ok=True)  # progress file of an unfinished run
    return result


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(PLAN))
    parser.add_argument("--tasks", help="comma-separated task names or groups")
    args = parser.parse_args()
    chosen = args.models.split(",") if args.models else None
    json.dump(
        main(pathlib.Path(args.out), args.full, chosen, [args.tasks] if args.tasks else None),
        sys.stdout,
        indent=2,
    )
    print()
