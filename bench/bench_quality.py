"""Quality: the leaderboard. Every built-in and every baseline on every task it applies to, in one run, on
modest seeded subsets by default (`quick=True`: small ones, for checking the pipeline in minutes).

Subsets (default run; `full=True` runs the full sets, SentEval with 10 outer / 10 inner folds):
- paraphrase-identification dev: all 1,024 queries (2,048 documents);
- SentEval MR/CR/SUBJ/MPQA: 2,000 sentences each, stratified, `--fast` protocol (5 outer / 3 inner folds);
- STS-B and SICK-R test: all pairs (1,379 / 4,927);
- IMDB and 20 Newsgroups: 1,000 training and 1,000 test documents each, stratified;
- 20 Newsgroups retrieval: 1,000 test documents, stratified;
- long documents (over 512 MiniLM tokens; evaluation/long_documents.py): imdb-long and 20newsgroups-long on
  600 long test documents each (probe trained on 1,000 train documents of all lengths), halves on 300 + 300.
All subsets are drawn with seed 1111. Which model runs which task is PLAN: multi-vector models (sbert-tokens,
nugget) skip the document tasks (all-pairs MaxSim over long documents is too slow on a CPU), the student runs
the long-document tasks it is for, and PI and STS to check it keeps short-text quality; sbert-chunks
differs from sbert only on documents over 256 tokens, so it runs PI and the document tasks. tfidf / bm25 are
fitted per task, pv is trained per task on that task's training text (PV_SETTINGS; kept under
$DOCEMBED_HOME/cache/bench-pv/, keyed by the hash of their training text). A shipped built-in whose weights
are not in the package yet is recorded as {"missing": ...}.

A failing cell is recorded as {"error": ...} and the run goes on. Tasks that score each item keep the
values (`metrics.per_item`); the result's `paired_differences` compares every shipped model with every
other model on them (`statistics.paired_difference`), so bench/run.py can keep the arrays out of the
committed summary.

    .venv/bin/python bench/bench_quality.py [--full | --quick] [--out DIR] [--models tfidf,sbert] [--tasks pi]
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
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
    "imdb": 1000,
    "20newsgroups": 1000,
    "20newsgroups-retrieval": 1000,
    # the long-document tasks take up to 1,000 long test documents each (a limit caps the probe's train split)
    "imdb-long": None,
    "20newsgroups-long": None,
    "halves": None,
    # selection splits (long *train* documents): run only when asked for (--tasks long-val)
    "imdb-long-val": None,
    "20newsgroups-long-val": None,
    "halves-val": None,
}
SELECTION = ("imdb-long-val", "20newsgroups-long-val", "halves-val")
# `quick`: enough to see that every cell runs, in minutes (numbers too noisy to compare models).
QUICK_LIMITS = {task: 50 if task == "paraphrase-identification" else 100 for task in DEFAULT_LIMITS}
SENTEVAL = ("mr", "cr", "subj", "mpqa")
STS = ("stsb", "sick")
DOCS = ("imdb", "20newsgroups", "20newsgroups-retrieval")
LONG = ("imdb-long", "20newsgroups-long", "halves") + SELECTION
PI = ("paraphrase-identification",)
ALL = PI + SENTEVAL + STS + DOCS
# The leaderboard's columns, in order: the learned families first, then the baselines.
PLAN = {
    "nugget": PI + STS,
    "student": LONG + PI + STS,  # long documents are its purpose; PI and STS check short-text quality
    "quickthoughts": ALL,
    "tfidf": ALL + LONG,
    "bm25": PI,
    "pv": PI + DOCS + LONG,
    "glove-avg": ALL,
    "sbert": ALL + LONG,
    "sbert-tokens": PI + STS,
    "sbert-chunks": PI + DOCS + LONG,
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
    from docembed.models.paragraph_vector import PVConfig, train_paragraph_vectors
    from docembed.models.registry import load_model
    from docembed.types import texts_hash

    texts = evaluator.fit_texts()
    # keyed by the training text only: tasks that train on the same text (20NG and its retrieval) share one
    directory = work_dir / f"pv-{texts_hash(texts)}"
    if not (directory / "config.json").exists():
        model, _ = train_paragraph_vectors(texts, PVConfig(**PV_SETTINGS))
        model.save(directory)
    model = load_model(str(directory))
    model.name = "pv"
    return model, f"pv trained on {len(texts)} texts: {evaluator.fit_description()}"


def paired_differences(results: dict, models: list[str] | None = None) -> dict:
    """`model` minus each other model on the same items, for every task and metric where both kept per-item
    values: {model: {task: {metric: {other: {diff, se, n, changed}}}}} (x100, as the leaderboard). `models`
    defaults to the shipped ones (the zoo): what the page compares with the baselines."""
    from docembed.evaluation.statistics import paired_difference

    if models is None:
        from docembed.models.registry import BUILTIN

        models = [name for name, entry in BUILTIN.items() if entry.shipped]

    def items(model: str, task: str) -> dict:
        return (results.get(model, {}).get(task) or {}).get("metrics", {}).get("per_item", {})

    out: dict = {}
    for model in (m for m in models if m in results):
        for task in results[model]:
            for metric, mine in items(model, task).items():
                for other in results:
                    theirs = items(other, task).get(metric)
                    if other == model or theirs is None or len(theirs) != len(mine):
                        continue
                    cell = out.setdefault(model, {}).setdefault(task, {}).setdefault(metric, {})
                    cell[other] = paired_difference(mine, theirs)
    return out


def throughput(model_names: list[str], count: int) -> dict:
    """Encode docs/s of each loadable model on the first `count` IMDB test reviews, one after the other in
    this process (same threads), after a short warm-up. Fitted baselines are fitted on the same reviews."""
    from docembed.datasets import iter_texts
    from docembed.evaluation import load_evaluation_model

    texts = list(iter_texts("imdb/test", limit=count))
    rows = {}
    for name in model_names:
        if name in ("pv", "bm25"):  # trained per task / a scorer without vectors
            continue
        try:
            model = load_evaluation_model(name)
        except Exception as error:  # not shipped yet, or an optional family: the row says why
            rows[name] = {"missing": f"{type(error).__name__}: {error}"}
            continue
        if getattr(model, "requires_fit", False):
            model.fit(texts)
        model.encode(texts[:4])
        started = time.perf_counter()
        model.encode(texts)
        seconds = time.perf_counter() - started
        rows[name] = {
            "docs": len(texts),
            "seconds": round(seconds, 2),
            "docs_per_s": round(len(texts) / seconds, 1),
        }
    return {"data": f"first {len(texts)} IMDB test reviews", "threads": _threads(), "rows": rows}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def main(
    out_dir: pathlib.Path,
    full: bool = False,
    models: list[str] | None = None,
    tasks: list[str] | None = None,
    quick: bool = False,
    jobs: int | None = None,
    measure_throughput: bool = True,
) -> dict:
    jobs = jobs or int(os.environ.get("BENCH_JOBS", min(2, os.cpu_count() or 1)))
    names = models or list(PLAN)
    if jobs > 1 and len(names) > 1:
        return _in_parallel(pathlib.Path(out_dir), full, names, tasks, quick, jobs, measure_throughput)
    from docembed.errors import ModelNotFoundError
    from docembed.evaluation import EvalOptions, get_evaluator, load_evaluation_model, resolve_tasks
    from docembed.runtime import log, models_home

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted_tasks = resolve_tasks(tasks) if tasks else [t for t in DEFAULT_LIMITS if t not in SELECTION]
    limits = {t: None if full else (QUICK_LIMITS if quick else DEFAULT_LIMITS)[t] for t in wanted_tasks}
    started_run = time.perf_counter()
    result: dict = {
        "full": full,
        "quick": quick,
        "limits": limits,
        "senteval_folds": "10 outer / 10 inner" if full else "5 outer / 3 inner (--fast)",
        "seed": 1111,
        "pv_settings": PV_SETTINGS,
        "load_before": os.getloadavg(),
        "results": {},
    }
    for model_name in names:
        result["results"][model_name] = {}
        loaded = None
        for task in PLAN.get(model_name, tuple(DEFAULT_LIMITS)):
            if task not in wanted_tasks:
                continue
            options = EvalOptions(limit=limits[task], fast=not full, seed=1111)
            evaluator = get_evaluator(task, options)
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
            except ModelNotFoundError as error:  # a shipped built-in whose weights are not exported yet
                outcome = {"missing": str(error)}
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
    if measure_throughput:
        result["throughput"] = throughput(list(result["results"]), 100 if quick else 500)
    result["paired_differences"] = paired_differences(result["results"])
    result["load_after"] = os.getloadavg()
    result["seconds"] = round(time.perf_counter() - started_run, 1)
    (out_dir / "bench_quality.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "bench_quality.partial.json").unlink(missing_ok=True)  # progress file of an unfinished run
    return result


# Rough cost of each model's cells (the default run, one thread): the parallel run balances these.
COST = {
    "student": 6,
    "sbert-chunks": 4,
    "sbert": 4,
    "pv": 4,
    "quickthoughts": 2,
    "nugget": 2,
    "sbert-tokens": 2,
}


def _in_parallel(out_dir, full, names, tasks, quick, jobs, measure_throughput) -> dict:
    """The same run split over `jobs` processes of one thread each (models balanced by COST), merged in PLAN
    order; throughput is then measured in this process alone, so its docs/s are not slowed by the others."""
    groups: list[list[str]] = [[] for _ in range(jobs)]
    for name in sorted(names, key=lambda n: -COST.get(n, 1)):
        min(groups, key=lambda g: sum(COST.get(n, 1) for n in g)).append(name)
    started = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", BENCH_JOBS="1")
    processes = []
    for index, group in enumerate(g for g in groups if g):
        command = [
            sys.executable,
            __file__,
            "--out",
            str(out_dir / f"part-{index}"),
            "--models",
            ",".join(group),
        ]
        command += ["--no-throughput"] + (["--full"] if full else []) + (["--quick"] if quick else [])
        command += ["--tasks", ",".join(tasks)] if tasks else []
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL))
    if any(p.wait() for p in processes):
        raise RuntimeError("a bench_quality part failed: see its log lines above")
    part_dirs = [out_dir / f"part-{i}" for i in range(len(processes))]
    return merge_parts(out_dir, part_dirs, names, measure_throughput, time.perf_counter() - started)


def merge_parts(out_dir, part_dirs, names=None, measure_throughput=True, seconds=None) -> dict:
    """One result from runs over disjoint model sets (the parallel run's parts, or parts started by hand
    one after the other when a core was busy): results in PLAN order, then throughput measured here."""
    parts = [json.loads((pathlib.Path(d) / "bench_quality.json").read_text()) for d in part_dirs]
    result = {k: v for k, v in parts[0].items() if k not in ("results", "seconds", "load_after")}
    merged = {name: part["results"][name] for part in parts for name in part["results"]}
    wanted = list(names or PLAN)
    order = [n for n in wanted if n in merged] + [n for n in merged if n not in wanted]
    result["results"] = {name: merged[name] for name in order}
    result["parallel"] = {
        "parts": [list(part["results"]) for part in parts],
        "part_seconds": [part.get("seconds") for part in parts],
        "threads_each": 1,
    }
    result["paired_differences"] = paired_differences(result["results"])
    if measure_throughput:
        result["throughput"] = throughput(list(result["results"]), 100 if result.get("quick") else 500)
    result["load_after"] = os.getloadavg()
    result["seconds"] = round(seconds, 1) if seconds else max(p.get("seconds") or 0 for p in parts)
    pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(out_dir) / "bench_quality.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small subsets: checks the pipeline in minutes")
    # a working folder (git-ignored, like run.py's): its JSON keeps the per-item values
    parser.add_argument("--out", default=f"bench/results/{time.strftime('%Y-%m-%d')}")
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(PLAN))
    parser.add_argument("--tasks", help="comma-separated task names or groups")
    parser.add_argument("--jobs", type=int, help="processes (one thread each); default $BENCH_JOBS or 2")
    parser.add_argument("--no-throughput", action="store_true", help="skip the docs/s measurement")
    parser.add_argument("--merge", nargs="+", metavar="PART_DIR", help="merge finished parts into --out")
    args = parser.parse_args()
    if args.merge:
        json.dump(merge_parts(pathlib.Path(args.out), args.merge), sys.stdout, indent=2)
        sys.exit(0)
    chosen = args.models.split(",") if args.models else None
    json.dump(
        main(
            pathlib.Path(args.out),
            args.full,
            chosen,
            [args.tasks] if args.tasks else None,
            args.quick,
            args.jobs,
            not args.no_throughput,
        ),
        sys.stdout,
        indent=2,
    )
    print()
