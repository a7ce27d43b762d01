"""`make bench`: the leaderboard. Runs bench/bench_quality.py (every built-in and every baseline on every
task, one table) and bench/bench_speed.py by default, merges their summaries into bench/results/<date>.json,
and renders docs/results.md from it: the one results page.

    .venv/bin/python bench/run.py                 # the leaderboard + speed, modest subsets
    .venv/bin/python bench/run.py --quick         # small subsets, minutes: bench/results/quick/, not the page
    .venv/bin/python bench/run.py --full          # the full data sets (hours on a CPU)
    .venv/bin/python bench/run.py --only nugget,student   # family benches (any bench/bench_*.py; `all`)
    .venv/bin/python bench/run.py --report-only   # re-render docs/results.md from the latest results file
    .venv/bin/python bench/run.py --import-result speed=DIR/bench_speed.json   # add a standalone run

What is committed: bench/results/<date>.json holds summaries only. Per-item values (`per_item`: each
document's or query's score, which the paired standard errors need) go to bench/results/items/<date>.json.gz,
which git ignores; the paired differences computed from them at run time stay in the summary, so the page
renders from the summary alone. Each module's own working files go to bench/results/<date>/ (ignored too).
A run with --only merges into the same day's results file, keeping the other modules' earlier entries.
bench/results/CHANGELOG.md (by hand: what replaced what, the old headline number) ends the page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import importlib.util
import inspect
import json
import os
import pathlib
import platform
import re
import sys
import time
import traceback

from docembed.evaluation.report import LEADERBOARD_ROWS, format_cell, format_number, markdown_table

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
QUICK_DIR = RESULTS_DIR / "quick"  # `--quick` runs check the pipeline: their results and page stay here
CHANGELOG = RESULTS_DIR / "CHANGELOG.md"
DOCS_PAGE = ROOT / "docs" / "results.md"
# What `make bench` runs (the leaderboard, speed, long documents by length bucket, speed and memory by
# length, NUGGET against the rules that keep as many vectors and its storage choices); the other family
# benches (nugget, student, setenc, int8, fusion, ...) run with --only.
DEFAULT_MODULES = (
    "quality",
    "speed",
    "long",
    "long_retrieval",
    "length",
    "nugget_curve",
    "nugget_storage",
    "int8",
)

# Published reference numbers (../shared/data/README.md), shown beside ours on the results page.
REFERENCES: dict[str, list[tuple[str, float]]] = {
    "paraphrase-identification": [
        ("random", 18.0),
        ("TF-IDF cosine", 98.7),
        ("NUGGET r=0.1 (MT)", 96.69),
        ("NUGGET r=0.25 (MT)", 97.38),
        ("TSDAE", 95.59),
        ("all-token MaxSim, BART (ColBART)", 94.83),
    ],
    "mr": [("avg GloVe", 77.25), ("SBERT-NLI-base", 83.64), ("QuickThoughts (1 GRU, 6 h)", 76.71)],
    "cr": [("avg GloVe", 78.30), ("SBERT-NLI-base", 89.43), ("QuickThoughts (1 GRU, 6 h)", 83.95)],
    "subj": [("avg GloVe", 91.17), ("SBERT-NLI-base", 94.39), ("QuickThoughts (1 GRU, 6 h)", 91.74)],
    "mpqa": [("avg GloVe", 87.85), ("SBERT-NLI-base", 89.86), ("QuickThoughts (1 GRU, 6 h)", 88.61)],
    "stsb": [("avg GloVe", 58.02), ("SBERT-NLI-base", 77.03)],
    "sick": [("avg GloVe", 53.76), ("SBERT-NLI-base", 72.91)],
    "imdb": [
        ("Longformer mean-pooled + MLP", 91.3),
        ("SBERT all-mpnet-base-v2 + MLP", 89.0),
        ("Paragraph Vector 2048d + MLP", 86.5),
        ("SBERT+PV distilled students", 84.0),
    ],
}
REFERENCE_NOTES = [
    "Published GloVe rows average 300-d GloVe 840B vectors; our `glove-avg` averages offline 50-d GloVe 6B.",
    "Published SBERT rows are SBERT-NLI-base (BERT-base); our `sbert` is all-MiniLM-L6-v2 (6 layers, 384-d).",
    "Published ColBART is all-token MaxSim with the NUGGET paper's BART encoder; our `sbert-tokens` uses "
    "MiniLM token vectors.",
    "Published IMDB rows train a small MLP head on the full 25k/25k split; ours is a logistic-regression "
    "probe on the subset stated below.",
]


# "Which model for what": the job, the leaderboard cell that measures it, the model we recommend and why. The
# page fills in the numbers from the results; a row whose model another one now beats says so (`cheap` rows
# are chosen for speed and only compared).
JOBS = [
    {
        "job": "short-text similarity",
        "task": "stsb",
        "metric": "spearman",
        "use": "sbert",
        "why": "all-MiniLM-L6-v2 as published; the student keeps its quality on short texts but is slower.",
    },
    {
        "job": "document paraphrase / near-duplicate ranking",
        "task": "paraphrase-identification",
        "metric": "mrr",
        "use": "bm25",
        "why": "word overlap decides this set: a baseline wins (tfidf is level and gives vectors); "
        "nugget is the best learned model.",
    },
    {
        "job": "long documents: find similar ones",
        "task": "20newsgroups-long",
        "metric": "map@100",
        "use": "student",
        "why": "reads 2,048 tokens, where sbert reads 256 and sbert-chunks averages windows.",
    },
    {
        "job": "long reviews: find similar ones",
        "task": "imdb-long",
        "metric": "map@100",
        "use": "student",
        "why": "as above; on reviews pv is the closest baseline.",
    },
    {
        "job": "long documents: classification (linear probe)",
        "task": "20newsgroups-long",
        "metric": "accuracy",
        "use": "tfidf",
        "why": "level with the student within the paired SE (on IMDB too), hundreds of times faster.",
    },
    {
        "job": "long documents: find a document's other half",
        "task": "halves",
        "metric": "mrr",
        "use": "tfidf",
        "why": "the halves share rare words, which is what tf-idf measures; a baseline wins.",
    },
    {
        "job": "topic retrieval, documents of any length",
        "task": "20newsgroups-retrieval",
        "metric": "map@100",
        "use": "sbert",
        "why": "sbert-chunks is level and slower; the student has not run the all-lengths tasks.",
    },
    {
        "job": "review sentiment, any length",
        "task": "imdb",
        "metric": "accuracy",
        "use": "quickthoughts",
        "why": "sentence encoders averaged over the whole review; a GRU, fast on a CPU.",
    },
    {
        "job": "cheapest on a CPU",
        "task": "imdb",
        "metric": "accuracy",
        "use": "tfidf",
        "cheap": True,
        "why": "thousands of docs/s on one thread, fitted on your corpus; glove-avg is as fast but weaker.",
    },
]


def discover() -> dict[str, pathlib.Path]:
    """bench_<name>.py modules in bench/, by name."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(BENCH_DIR.glob("bench_*.py"))}


def _load_module(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def split_items(value, path: str = "") -> tuple[object, dict[str, dict]]:
    """`value` without its `per_item` entries, and those entries by their path ("results/student/halves/
    metrics"): the summary that is committed and the per-item values that are not."""
    if isinstance(value, dict):
        summary, items = {}, {}
        for key, child in value.items():
            if key == "per_item":
                items[path] = child
                continue
            summary[key], found = split_items(child, f"{path}/{key}" if path else str(key))
            items.update(found)
        return summary, items
    if isinstance(value, list):
        pairs = [split_items(child, f"{path}/{i}") for i, child in enumerate(value)]
        return [p[0] for p in pairs], {k: v for p in pairs for k, v in p[1].items()}
    return value, {}


def items_path(results_path: pathlib.Path) -> pathlib.Path:
    """Where the per-item values of a results file live (git-ignored)."""
    return results_path.parent / "items" / f"{results_path.stem}.json.gz"


def save_items(results_path: pathlib.Path, name: str, items: dict) -> None:
    path = items_path(results_path)
    stored = json.loads(gzip.decompress(path.read_bytes())) if path.exists() else {}
    stored[name] = items
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(stored).encode()))


def _store(target: pathlib.Path, name: str, entry: dict, merged: dict) -> None:
    """Put one module's entry into the day's results file: its summary there, its per-item values beside. A
    module that keeps the same summary in its own file beside (`NAME.json`, tracked) is named, not copied."""
    summary, items = split_items(entry["result"])
    if items:
        save_items(target, name, items)
    # re-read before writing: another `run.py --only` may have finished a module in the meantime
    if target.exists():
        merged["benchmarks"] = json.loads(target.read_text()).get("benchmarks", {})
    own = target.parent / f"{name}.json"
    if own.is_file() and json.loads(own.read_text()) == summary:
        stored = {k: v for k, v in entry.items() if k != "result"} | {"result_file": own.name}
    else:
        stored = {**entry, "result": summary}
    merged["benchmarks"][name] = stored
    target.write_text(json.dumps(merged, indent=2, default=str) + "\n")


def run(only: list[str] | None, full: bool, quick: bool = False) -> pathlib.Path:
    modules = discover()
    if only == ["all"]:
        only = list(modules)
    only = only or list(DEFAULT_MODULES)
    unknown = sorted(set(only or []) - set(modules))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(modules)}")
    date = dt.date.today().isoformat()
    results_dir = QUICK_DIR if quick else RESULTS_DIR
    target = results_dir / f"{date}.json"
    results_dir.mkdir(parents=True, exist_ok=True)
    merged = json.loads(target.read_text()) if target.exists() else {"date": date, "benchmarks": {}}
    merged["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }
    for name, path in modules.items():
        if only and name not in only:
            continue
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            main = _load_module(name, path).main
            extra = {"quick": True} if quick and "quick" in inspect.signature(main).parameters else {}
            result = main(results_dir / date, full, **extra)
        except Exception as error:  # one module failing must not lose the others' results
            result = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc(limit=5)}
        seconds = round(time.perf_counter() - started, 1)
        entry = {
            "full": full,
            "quick": quick,
            "seconds": seconds,
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "result": result,
        }
        _store(target, name, entry, merged)
        print(f"[bench] {name} done in {seconds}s", file=sys.stderr, flush=True)
    return target


# --- markdown ----------------------------------------------------------------------------------------------
def _shipped() -> list[str]:
    from docembed.models.registry import BUILTIN

    return [name for name, entry in BUILTIN.items() if entry.shipped]


def _score(results: dict, model: str, task: str, metric: str) -> float | None:
    outcome = results.get(model, {}).get(task) or {}
    return outcome.get("metrics", {}).get(metric)


def _paired(quality: dict, model: str, other: str, task: str, metric: str) -> str:
    """`model` minus `other` with its paired standard error, from whichever side the run compared."""
    differences = quality.get("paired_differences", {})
    for first, second, sign in ((model, other, 1), (other, model, -1)):
        found = differences.get(first, {}).get(task, {}).get(metric, {}).get(second)
        if found:
            return f"{sign * found['diff']:+.2f} ± {found['se']:.2f}"
    return "–"


def render_jobs(quality: dict) -> list[str]:
    """The table a reader chooses from: per job the recommended model's score, the best model of the other
    kind (a baseline for a zoo model, the best zoo model for a baseline), the paired difference, docs/s."""
    results = quality.get("results", {})
    shipped = [m for m in _shipped() if m in results]
    speeds = quality.get("throughput", {}).get("rows", {})
    rows = []
    for job in JOBS:
        task, metric, use = job["task"], job["metric"], job["use"]
        mine = _score(results, use, task, metric)
        if mine is None:
            continue
        others = [m for m in results if (m in shipped) != (use in shipped)]
        scored = [(s, m) for m in others if (s := _score(results, m, task, metric)) is not None]
        best_other = max(scored)[1] if scored else None
        everyone = [(s, m) for m in results if (s := _score(results, m, task, metric)) is not None]
        why = job["why"]
        top_score, top = max(everyone)
        if round(top_score, 2) > round(mine, 2) and not job.get("cheap"):
            why += f" (now behind {top}: {format_number(top_score)})"
        label = next(lbl for t, m, lbl in LEADERBOARD_ROWS if (t, m) == (task, metric))
        rows.append(
            [
                job["job"],
                label.split(" ±")[0],
                f"`{use}`",
                format_number(mine),
                "–"
                if best_other is None
                else f"`{best_other}` {format_number(_score(results, best_other, task, metric))}",
                "–" if best_other is None else _paired(quality, use, best_other, task, metric),
                format_number((speeds.get(use) or {}).get("docs_per_s"), 1),
                why,
            ]
        )
    if not rows:  # a partial run (--models, --tasks) measures none of the jobs
        return []
    return [
        "## Which model for what",
        "",
        "Scores x100 from the leaderboard below (the same run); `compared with` is the best baseline for a "
        "zoo model (`" + "`, `".join(shipped) + "`) and the best zoo model for a baseline; `paired` is the "
        "difference on the same documents with its standard error, where the run kept per-item values; "
        "docs/s: encoding, one thread.",
        "",
        *markdown_table(
            ["job", "measured by", "use", "score", "compared with", "paired", "docs/s", "why"], rows
        ),
        "",
    ]


def render_paired(quality: dict) -> list[str]:
    """Each zoo model minus every other model, per task and metric, on the same items."""
    lines = []
    for model, tasks in quality.get("paired_differences", {}).items():
        others = list(
            dict.fromkeys(o for metrics in tasks.values() for cells in metrics.values() for o in cells)
        )
        rows = []
        for task, metrics in tasks.items():
            for metric, cells in metrics.items():
                n = next(iter(cells.values()))["n"]
                row = [f"{task} {metric} (n={n})"]
                row += [f"{c['diff']:+.2f} ± {c['se']:.2f}" if (c := cells.get(o)) else "–" for o in others]
                rows.append(row)
        lines += ["", f"`{model}` minus each model on the same items (paired standard error):", ""]
        lines += markdown_table(["task", *others], rows)
    return lines


def render_quality(quality: dict) -> list[str]:
    results = quality.get("results", {})
    models = list(results)
    lines = ["## Leaderboard", ""]
    limits = quality.get("limits", {})
    sizes = ", ".join(f"{t}: {'full' if n is None else n}" for t, n in limits.items())
    mode = (
        "full sets"
        if quality.get("full")
        else ("QUICK subsets (pipeline check only)" if quality.get("quick") else "")
    )
    lines += [
        f"One run of `make bench` ({quality.get('seconds', '?')} s{', ' + mode if mode else ''}). "
        f"Subsets (seed {quality.get('seed')}): {sizes}. SentEval folds: {quality.get('senteval_folds')}.",
        "All numbers x100 except docs/s. `–` = not run for that model; `missing` = not available "
        "(a shipped built-in whose weights are not exported yet, or an optional family).",
        "",
    ]
    parts_note = quality.get("parallel", {}).get("note")
    if parts_note:  # parts run by hand after the main run (a retrained model) say so
        lines[-1:-1] = [f"Parts: {parts_note}."]
    rows = []
    for task, metric, label in LEADERBOARD_ROWS:
        if not any(task in results[m] for m in models):
            continue
        refs = (
            "; ".join(f"{name} {value}" for name, value in REFERENCES.get(task, []))
            if metric in ("mrr", "accuracy", "spearman")
            else ""
        )
        rows.append([label, *[format_cell(results[m].get(task), metric) for m in models], refs])
    speed = quality.get("throughput", {})
    if speed.get("rows"):
        cells = []
        for m in models:
            row = speed["rows"].get(m)
            cells.append(
                "–"
                if row is None
                else ("missing" if "missing" in row else format_number(row["docs_per_s"], 1))
            )
        rows.append([f"encode docs/s ({speed.get('data')}, {speed.get('threads')} thread(s))", *cells, ""])
    lines += markdown_table(["task", *models, "published reference"], rows)
    lines += ["", *[f"- {note}" for note in REFERENCE_NOTES]]
    lines += render_paired(quality)
    fitted = ("tfidf fitted", "bm25 fitted", "pv trained")
    notes = sorted(
        {
            n
            for m in models
            for o in results[m].values()
            for n in o.get("notes", [])
            if not n.startswith(fitted)
        }
    )
    fits = sorted(
        {
            n.split(":")[-1].strip()
            for m in models
            for o in results[m].values()
            for n in o.get("notes", [])
            if n.startswith(fitted)
        }
    )
    lines += [""]
    if fits:
        lines += ["- tfidf / bm25 / pv are fitted or trained per task on: " + "; ".join(fits) + "."]
    lines += [f"- {n}" for n in notes]
    errors = [(m, t, o["error"]) for m in models for t, o in results[m].items() if "error" in o]
    if errors:
        lines += ["", "Errors:", *[f"- {m} / {t}: {e}" for m, t, e in errors]]
    seconds = [[m, t, o.get("seconds", o.get("wall_seconds"))] for m in models for t, o in results[m].items()]
    lines += [
        "",
        "<details><summary>seconds per cell (wall clock of the cell; embeddings already in the cache under "
        "$DOCEMBED_HOME/cache/embeddings are not recomputed)</summary>",
        "",
        *markdown_table(["model", "task", "seconds"], seconds),
        "",
        "</details>",
        "",
    ]
    return lines


def render_speed(speed: dict) -> list[str]:
    lines = [
        "## Speed",
        "",
        f"Threads: {speed.get('threads')}; load average before/after: "
        f"{speed.get('load_before')} / {speed.get('load_after')}.",
        "",
    ]
    for key, title, ratio_keys in (
        ("encode", "Encoding", ["ratio_docembed_over_st_time"]),
        (
            "maxsim",
            "MaxSim scoring",
            [
                "ratio_loop_over_docembed_time",
                "ratio_st_over_docembed_time_pairs",
                "ratio_st_over_docembed_time_one_to_many",
            ],
        ),
        ("search", "Exact search", ["ratio_numpy_over_faiss_time", "top_k_overlap"]),
    ):
        part = speed.get(key)
        if not part:
            continue
        lines += [f"### {title}", "", f"Data: {part['data']}", ""]
        for rows_key in ("rows", "pairs", "one_to_many"):
            rows = part.get(rows_key)
            if rows:
                header = list(rows[0])
                lines += markdown_table(header, [[r.get(h) for h in header] for r in rows]) + [""]
        lines += [
            f"- {k}: {part.get(k)}"
            for k in ratio_keys + ["max_abs_difference", "faiss_build_seconds"]
            if k in part
        ] + [""]
    return lines


def render_long_retrieval(result: dict) -> list[str]:
    """Long-document retrieval (bench_long_retrieval): test MRR per task for the lexical rules, the models
    read whole, passage scoring and the fusions, with the paired difference from the task's better lexical
    rule; configurations and fusion weights were chosen on val."""
    models = result.get("models", {})
    if not models:
        return []
    tasks = list(next(iter(models.values()))["test"])
    kept = set(result.get("kept_from_earlier_run", []))
    rows = []
    for label, row in models.items():
        cells = []
        for task in tasks:
            cell = row["test"][task]
            versus = cell.get("vs_lexical")
            text = format_number(cell["mrr"])
            cells.append(text if versus is None else f"{text} ({versus['diff']:+.1f} ± {versus['se']:.1f})")
        weight = row.get("weight_chosen_on_val", row.get("weight_shipped"))
        long_weight = row.get("long_query_weight_chosen_on_val", row.get("long_query_weight_shipped"))
        name = f"`{label}`" + ("" if weight is None else f" w={weight}")
        name += "" if long_weight is None else f", long queries w={long_weight}"
        name += " (earlier run)" if label in kept else ""
        rows.append([name, *cells, format_number(row["mean"]["val"]), format_number(row["mean"]["test"])])
    data = result.get("data", {})
    sizes = "; ".join(
        f"{task} {split['val']['queries']} / {split['test']['queries']}"
        + (
            f" ({split['val']['with_duplicate_answers']} / {split['test']['with_duplicate_answers']})"
            if "with_duplicate_answers" in split["test"]
            else ""
        )
        for task, split in data.items()
    )
    headroom = [
        f"{task} {h['diff']:+.1f} ± {h['se']:.1f} "
        + ("(every query ranked alike)" if h["ses"] is None else f"({h['ses']} SEs)")
        for task, split in data.items()
        if (h := split["test"].get("perfect_ranker_vs_lexical"))
    ]
    lines = [
        "## Long-document retrieval",
        "",
        "Find the document a query is about (`bench/bench_long_retrieval.py`): MRR x100 on the test split, "
        "every document of the split a candidate; in brackets the paired difference from the task's better "
        "lexical rule on test (tf-idf or BM25) with its standard error. `w`: a fusion's weight of the model "
        "part (of the second model, in a fusion of two), chosen once on all val tasks together (`by "
        "query kind`: one weight for long queries, of six passages or more, and one for the rest). "
        "Queries val / test (in brackets, those with a duplicate answer, another candidate as good an "
        "answer, left out of their ranking: it holds most of the query's text, or its own query does): "
        + sizes
        + ".",
        "",
        *markdown_table(["configuration", *tasks, "mean val", "mean test"], rows),
        "",
    ]
    if result.get("more_pages"):
        added = "; ".join(f"{t} {by['val']} / {by['test']}" for t, by in result["more_pages"].items())
        lines += [
            "Of those queries, from pages no model trained on (man pages of Debian packages this machine "
            "lacks, and the documentation of eighteen packages no corpus reads: Debian's guides and server "
            "software's, then application manuals), val / test: " + added + ".",
            "",
        ]
    if kept:
        lines += [
            f"Rows `(earlier run)`, {len(kept)} of them: configurations of models this run did not encode "
            "again (`--update`), as the run before it scored them, with the texts and lexical rules of that "
            "run.",
            "",
        ]
    shipped = _load_module("long_retrieval", discover()["long_retrieval"]).SHIPPED_WEIGHTS.strip()
    if any(label.endswith(shipped) for label in models):
        lines += [
            f"Rows `{shipped}`: a fusion at the weights the product ships, where this run's val "
            "chose others.",
            "",
        ]
    if headroom:
        lines += [
            "The most each task can show: a ranker that always puts the answer first would be, on test, "
            + "; ".join(headroom)
            + " above the better lexical rule.",
            "",
        ]
    return lines


def render_generic(name: str, entry) -> list[str]:
    # Family benches keep their own tables in their JSON; the page only points at them, folded.
    text = json.dumps(entry, indent=2, default=str)
    if len(text) > 3000:
        text = text[:3000] + "\n... (truncated; see the results JSON)"
    return [
        f"<details><summary>{name} (family bench)</summary>",
        "",
        "```json",
        text,
        "```",
        "",
        "</details>",
        "",
    ]


def _machine(machine: dict | None) -> str:
    if not machine:
        return "an unrecorded machine"
    return (
        f"{machine.get('cpus')} CPUs, Python {machine.get('python')}, "
        f"OMP_NUM_THREADS={machine.get('OMP_NUM_THREADS')}"
    )


def render(results_path: pathlib.Path, changelog: pathlib.Path | None = CHANGELOG) -> str:
    """The results page from a summary file alone (plus the hand-kept changelog)."""
    merged = json.loads(results_path.read_text())
    try:
        shown = results_path.relative_to(ROOT)
    except ValueError:
        shown = results_path
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python bench/run.py --report-only` from `{shown}` "
        f"({_machine(merged.get('machine'))}). Do not edit by hand.",
        "",
    ]
    benchmarks = merged.get("benchmarks", {})
    for entry in benchmarks.values():  # a module's summary kept in its own file beside (_store)
        if "result_file" in entry:
            entry["result"] = json.loads((results_path.parent / entry["result_file"]).read_text())
    quality = benchmarks.get("quality", {}).get("result", {})
    if quality.get("results"):
        lines += render_jobs(quality)
    # the leaderboard first, then speed, then the changelog, then the family benches
    ordered = sorted(benchmarks.items(), key=lambda kv: (kv[0] != "quality", kv[0] != "speed"))
    family = []
    for name, entry in ordered:
        result = entry.get("result", {})
        origin = f"imported from {entry['imported_from']}" if entry.get("imported_from") else "run by run.py"
        section = [
            f"<!-- {name}: {entry.get('seconds')} s, finished {entry.get('finished')}, "
            f"full={entry.get('full')}, {origin} -->"
        ]
        if "error" in result:
            section += [f"## {name}", "", f"Failed: {result['error']}", ""]
        elif name == "quality":
            section += render_quality(result)
        elif name == "speed":
            section += render_speed(result)
        elif name == "long_retrieval":
            section += render_long_retrieval(result)
        else:
            family += section + render_generic(name, result)
            continue
        lines += section
    if changelog is not None and changelog.exists():
        lines += [changelog.read_text(encoding="utf-8").rstrip(), ""]
    if family:
        lines += ["## Family benches", "", "Each family bench's own results file, folded.", "", *family]
    return "\n".join(lines).rstrip() + "\n"


def latest_results(results_dir: pathlib.Path = RESULTS_DIR) -> pathlib.Path:
    # only run.py's own dated files (other modules may keep their own JSON files in bench/results/)
    files = sorted(p for p in results_dir.glob("*.json") if re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.stem))
    if not files:
        raise SystemExit("no results yet: run `make bench` first")
    return files[-1]


def write_report(results_path: pathlib.Path) -> None:
    """docs/results.md is the one rendering of the results (the JSON beside it is the data); a quick run's
    page stays beside its results."""
    page = DOCS_PAGE if results_path.parent == RESULTS_DIR else results_path.parent / "results.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render(results_path))
    print(f"[bench] wrote {page} from {results_path}", file=sys.stderr)


def import_result(spec: str) -> pathlib.Path:
    """Merge the JSON a module wrote in a standalone run (`bench/bench_x.py --out DIR`) into today's results
    file as entry NAME, recording where it came from (its per-item values go beside, as in a run)."""
    name, _, path = spec.partition("=")
    source = pathlib.Path(path)
    if not name or not source.is_file():
        raise SystemExit(f"--import-result expects NAME=PATH to a module's JSON, got {spec!r}")
    date = dt.date.today().isoformat()
    target = RESULTS_DIR / f"{date}.json"
    merged = json.loads(target.read_text()) if target.exists() else {"date": date, "benchmarks": {}}
    stamp = dt.datetime.fromtimestamp(source.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")
    entry = {
        "full": None,
        "seconds": None,
        "finished": stamp,
        "imported_from": str(source),
        "result": json.loads(source.read_text()),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _store(target, name, entry, merged)
    return target


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(description="Run the docembed benchmarks (bench/bench_*.py).")
    parser.add_argument("--full", action="store_true", help="full data sets instead of the modest subsets")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small subsets: checks the pipeline in minutes (bench/results/quick/)",
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated benchmark names (default: {', '.join(DEFAULT_MODULES)}; all = every one): "
        f"{', '.join(discover())}",
    )
    parser.add_argument("--report-only", action="store_true", help="re-render docs/results.md, run nothing")
    parser.add_argument(
        "--import-result", metavar="NAME=PATH", help="merge a standalone module run's JSON, then re-render"
    )
    args = parser.parse_args(argv)
    if args.import_result:
        write_report(import_result(args.import_result))
        return
    if args.report_only:
        write_report(latest_results())
        return
    only = [n.strip().removeprefix("bench_") for n in args.only.split(",")] if args.only else None
    if args.full and args.quick:
        parser.error("--full and --quick exclude each other")
    write_report(run(only, args.full, args.quick))


if __name__ == "__main__":
    main()
