"""`make bench`: the leaderboard. Runs bench/bench_quality.py (every built-in and every baseline on every
task, one table) and bench/bench_speed.py by default, merges their dicts into bench/results/<date>.json, and
renders docs/results.md from it: the one results page (`make bench-quick` checks the pipeline in minutes).

    .venv/bin/python bench/run.py                 # the leaderboard + speed, modest subsets
    .venv/bin/python bench/run.py --quick         # small subsets: minutes, for checking
    .venv/bin/python bench/run.py --full          # the full data sets (hours on a CPU)
    .venv/bin/python bench/run.py --only nugget,student   # family benches (any bench/bench_*.py; `all`)
    .venv/bin/python bench/run.py --report-only   # re-render docs/results.md from the latest results file
    .venv/bin/python bench/run.py --import-result speed=DIR/bench_speed.json   # add a standalone run

A run with --only merges into the same day's results file, keeping the other modules' earlier entries.
Each module also writes its own JSON into bench/results/<date>/.
"""

from __future__ import annotations

import argparse
import datetime as dt
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

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DOCS_PAGE = ROOT / "docs" / "results.md"
# What `make bench` runs; the family benches (nugget, student, setenc, ...) run with --only.
DEFAULT_MODULES = ("quality", "speed")

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


def run(only: list[str] | None, full: bool, quick: bool = False) -> pathlib.Path:
    modules = discover()
    if only == ["all"]:
        only = list(modules)
    only = only or list(DEFAULT_MODULES)
    unknown = sorted(set(only or []) - set(modules))
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(modules)}")
    date = dt.date.today().isoformat()
    target = RESULTS_DIR / f"{date}.json"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    merged = json.loads(target.read_text()) if target.exists() else {"date": date, "benchmarks": {}}
    merged["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }
    fresh: dict[str, dict] = {}
    for name, path in modules.items():
        if only and name not in only:
            continue
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            main = _load_module(name, path).main
            extra = {"quick": True} if quick and "quick" in inspect.signature(main).parameters else {}
            entry = main(RESULTS_DIR / date, full, **extra)
        except Exception as error:  # one module failing must not lose the others' results
            entry = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc(limit=5)}
        seconds = round(time.perf_counter() - started, 1)
        fresh[name] = {
            "full": full,
            "quick": quick,
            "seconds": seconds,
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "result": entry,
        }
        # re-read before writing: another `run.py --only` may have finished a module in the meantime
        if target.exists():
            merged["benchmarks"] = json.loads(target.read_text()).get("benchmarks", {})
        merged["benchmarks"].update(fresh)
        target.write_text(json.dumps(merged, indent=2, default=str) + "\n")
        print(f"[bench] {name} done in {seconds}s", file=sys.stderr, flush=True)
    return target


# --- markdown ----------------------------------------------------------------------------------------------
def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines


def _cell(outcome: dict | None, metric: str | None = None) -> str:
    if outcome is None:
        return "–"
    if "error" in outcome:
        return "error"
    if "missing" in outcome:
        return "missing"
    value = outcome["metrics"].get(metric) if metric else outcome.get("score")
    error = outcome["metrics"].get(f"{metric}_se") if metric else None
    return _fmt(value) if error is None else f"{_fmt(value)} ± {_fmt(error, 1)}"


LONG_TASKS = (
    ("imdb-long", "accuracy"),
    ("imdb-long", "map@100"),
    ("20newsgroups-long", "accuracy"),
    ("20newsgroups-long", "map@100"),
    ("halves", "mrr"),
)


def _paired_differences(results: dict, model: str) -> list[str]:
    """`model` minus each other model on the long-document tasks, with the standard error of the paired
    difference (the same documents: per-item values), so "beats" means more than noise."""
    import numpy as np

    if model not in results:
        return []
    rows = []
    for task, metric in LONG_TASKS:
        mine = results[model].get(task, {}).get("metrics", {}).get("per_item", {}).get(metric)
        if mine is None:
            continue
        cells = []
        for other in results:
            theirs = results[other].get(task, {}).get("metrics", {}).get("per_item", {}).get(metric)
            if other == model or theirs is None or len(theirs) != len(mine):
                cells.append("–")
                continue
            diff = 100.0 * (np.asarray(mine) - np.asarray(theirs))
            cells.append(f"{diff.mean():+.2f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.2f}")
        rows.append([f"{task} {metric} (n={len(mine)})", *cells])
    if not rows:
        return []
    header = f"{model} minus each model on the long-document tasks (paired standard error):"
    return ["", header, "", *_table(["task", *results], rows)]


QUALITY_ROWS = [
    ("paraphrase-identification", "mrr", "PI dev MRR"),
    ("mr", "accuracy", "MR acc"),
    ("cr", "accuracy", "CR acc"),
    ("subj", "accuracy", "SUBJ acc"),
    ("mpqa", "accuracy", "MPQA acc"),
    ("stsb", "spearman", "STS-B Spearman"),
    ("sick", "spearman", "SICK-R Spearman"),
    ("imdb", "accuracy", "IMDB acc"),
    ("imdb", "accuracy_long", "IMDB acc, >512 tokens"),
    ("20newsgroups", "accuracy", "20NG acc"),
    ("20newsgroups", "accuracy_long", "20NG acc, >512 tokens"),
    ("20newsgroups-retrieval", "map@100", "20NG MAP@100"),
    ("20newsgroups-retrieval", "p@10", "20NG P@10"),
    ("20newsgroups-retrieval", "knn_accuracy", "20NG kNN acc (k=10)"),
    ("imdb-long", "accuracy", "IMDB >512 tokens: acc ± SE"),
    ("imdb-long", "map@100", "IMDB >512 tokens: MAP@100 ± SE"),
    ("20newsgroups-long", "accuracy", "20NG >512 tokens: acc ± SE"),
    ("20newsgroups-long", "map@100", "20NG >512 tokens: MAP@100 ± SE"),
    ("halves", "mrr", "first half -> second half MRR ± SE"),
]


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
        "All numbers x100 except the last row. `–` = not run for that model; `missing` = not available "
        "(a shipped built-in whose weights are not exported yet, or an optional family).",
        "",
    ]
    parts_note = quality.get("parallel", {}).get("note")
    if parts_note:  # parts run by hand after the main run (a retrained model, an added row) say so
        lines[-1:-1] = [f"Parts: {parts_note}."]
    rows = []
    for task, metric, label in QUALITY_ROWS:
        if not any(task in results[m] for m in models):
            continue
        refs = (
            "; ".join(f"{name} {value}" for name, value in REFERENCES.get(task, []))
            if metric in ("mrr", "accuracy", "spearman")
            else ""
        )
        rows.append([label, *[_cell(results[m].get(task), metric) for m in models], refs])
    speed = quality.get("throughput", {})
    if speed.get("rows"):
        cells = []
        for m in models:
            row = speed["rows"].get(m)
            cells.append(
                "–" if row is None else ("missing" if "missing" in row else _fmt(row["docs_per_s"], 1))
            )
        rows.append([f"encode docs/s ({speed.get('data')}, {speed.get('threads')} thread(s))", *cells, ""])
    lines += _table(["task", *models, "published reference"], rows)
    lines += ["", *[f"- {note}" for note in REFERENCE_NOTES]]
    lines += _paired_differences(results, "student")
    notes = sorted(
        {
            n
            for m in models
            for o in results[m].values()
            for n in o.get("notes", [])
            if not n.startswith(("tfidf fitted", "bm25 fitted", "pv trained"))
        }
    )
    fits = sorted(
        {
            n.split(":")[-1].strip()
            for m in models
            for o in results[m].values()
            for n in o.get("notes", [])
            if n.startswith(("tfidf fitted", "bm25 fitted", "pv trained"))
        }
    )
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
        *_table(["model", "task", "seconds"], seconds),
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
                lines += _table(header, [[r.get(h) for h in header] for r in rows]) + [""]
        lines += [
            f"- {k}: {part.get(k)}"
            for k in ratio_keys + ["max_abs_difference", "faiss_build_seconds"]
            if k in part
        ] + [""]
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


def render(results_path: pathlib.Path) -> str:
    merged = json.loads(results_path.read_text())
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python bench/run.py --report-only` from `{results_path.relative_to(ROOT)}` "
        f"(machine: {merged.get('machine')}). Do not edit by hand.",
        "",
    ]
    # the leaderboard first, then speed, then the family benches
    benchmarks = sorted(
        merged.get("benchmarks", {}).items(), key=lambda kv: (kv[0] != "quality", kv[0] != "speed")
    )
    for name, entry in benchmarks:
        result = entry.get("result", {})
        origin = f"imported from {entry['imported_from']}" if entry.get("imported_from") else "run by run.py"
        lines += [
            f"<!-- {name}: {entry.get('seconds')} s, finished {entry.get('finished')}, "
            f"full={entry.get('full')}, {origin} -->"
        ]
        if "error" in result:
            lines += [f"## {name}", "", f"Failed: {result['error']}", ""]
        elif name == "quality":
            lines += render_quality(result)
        elif name == "speed":
            lines += render_speed(result)
        else:
            lines += render_generic(name, result)
    return "\n".join(lines).rstrip() + "\n"


def latest_results() -> pathlib.Path:
    # only run.py's own dated files (other modules may keep their own JSON files in bench/results/)
    files = sorted(p for p in RESULTS_DIR.glob("*.json") if re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.stem))
    if not files:
        raise SystemExit("no results yet: run `make bench` first")
    return files[-1]


def write_report(results_path: pathlib.Path) -> None:
    """docs/results.md is the one rendering of the results (the JSON beside it is the data)."""
    DOCS_PAGE.parent.mkdir(parents=True, exist_ok=True)
    DOCS_PAGE.write_text(render(results_path))
    print(f"[bench] wrote {DOCS_PAGE} from {results_path.relative_to(ROOT)}", file=sys.stderr)


def import_result(spec: str) -> pathlib.Path:
    """Merge the JSON a module wrote in a standalone run (`bench/bench_x.py --out DIR`) into today's results
    file as entry NAME, recording where it came from."""
    name, _, path = spec.partition("=")
    source = pathlib.Path(path)
    if not name or not source.is_file():
        raise SystemExit(f"--import-result expects NAME=PATH to a module's JSON, got {spec!r}")
    date = dt.date.today().isoformat()
    target = RESULTS_DIR / f"{date}.json"
    merged = json.loads(target.read_text()) if target.exists() else {"date": date, "benchmarks": {}}
    stamp = dt.datetime.fromtimestamp(source.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")
    merged["benchmarks"][name] = {
        "full": None,
        "seconds": None,
        "finished": stamp,
        "imported_from": str(source),
        "result": json.loads(source.read_text()),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(merged, indent=2, default=str) + "\n")
    return target


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(description="Run the docembed benchmarks (bench/bench_*.py).")
    parser.add_argument("--full", action="store_true", help="full data sets instead of the modest subsets")
    parser.add_argument("--quick", action="store_true", help="small subsets: checks the pipeline in minutes")
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
