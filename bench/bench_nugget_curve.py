"""NUGGET against the rules that also keep fewer token vectors (issue 30): quality against vectors kept and
bytes per document, on four kinds of text, every row on the same queries (paired standard errors).

Tasks (`--split test`, the table; `--split val`, for choosing a model):
- pi: PI dev, MRR x100 (1,024 queries; `--quick`: 256). PI has no test side: dev is what every NUGGET row
  of this project reports, and was the validation split of the shipped model's own settings.
- docs: documentation paragraphs, the first sentence -> the rest of its paragraph among every paragraph of the
  split (up to 4 per page) of this machine's long man pages (bench_long's pages and val/test halves by page
  name), MRR x100.
- halves: first half -> second half of long IMDB/20NG documents (test: `halves`; val: `halves-val`), the
  first `--halves` documents, MRR x100.
- 20ng: 20 Newsgroups query-by-document, MAP@100 x100, a seeded `--news` sample of test (val: of train).
Rows (one nugget model, its MiniLM token states computed once per task and shared by every row):
- nugget: the model as it loads (`--model`: the shipped one, which lets every token join its nearest nugget,
  `aggregate="assign"`), at r = 0.05 / 0.1 / 0.25; "nugget, no assign": its learned selection alone;
- idf: the k = ceil(r n) tokens of highest IDF; idf+assign: the same with the shipped assignment; pool:
  hierarchical token pooling into k clusters (Clavie et al. 2024); prune T: every token but the T most
  frequent vocabulary entries (Acquavia et al. 2023); cap 32: 32 pooled vectors per 256-token window (a
  fixed count, as ConstBERT's); all: every token vector (sbert-tokens, read whole in windows);
- the r = 0.1 rows, the caps, prune and all again stored as float16 and int8 (`--storage`'s arithmetic:
  `docembed.save_embeddings(..., storage=)` written and read back);
- `--variant LABEL=DIR`: another trained nugget's learned rows on the same shared states.
Every row reads whole documents in 256-token windows (the shipped model's default). Each row is paired
with "nugget" at its r (nugget minus the row, with the standard error of the paired difference).

    .venv/bin/python bench/bench_nugget_curve.py [--split test|val] [--model DIR] [--quick]
    .venv/bin/python bench/bench_nugget_curve.py --tasks pi,docs --out a.json   # two processes, then
    .venv/bin/python bench/bench_nugget_curve.py --merge a.json b.json          # one table
    .venv/bin/python bench/run.py --only nugget_curve
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

BENCH_DIR = pathlib.Path(__file__).resolve().parent
OUT = BENCH_DIR / "results" / "nugget" / "curve.json"
RATIOS = (0.05, 0.1, 0.25)
PRUNE = (1000, 5000, 15000)  # vocabulary entries dropped (MiniLM has 30,522)
CAP = 32
ASSIGN_WEIGHT = 0.75  # the shipped model's (chosen on the val side of these tasks)
STORAGES = ("float32", "float16", "int8")
BYTES = {"float32": 4, "float16": 2, "int8": 1}
PARAGRAPHS_PER_PAGE = 4


def rows_to_run() -> list[tuple[str, dict, tuple[str, ...]]]:
    """(label, nugget settings, storages) of every row. "nugget" is the model as configured (the shipped
    one: the learned selection with `assign`); "nugget, no assign" its selection alone."""
    rows = []
    plain = {"aggregate": "none"}
    for ratio in RATIOS:
        storages = STORAGES if ratio == 0.1 else ("float32",)
        rows.append((f"nugget r={ratio}", {"selector": "scorer", "ratio": ratio}, storages))
        alone = {"selector": "scorer", "ratio": ratio, **plain}
        rows.append((f"nugget, no assign r={ratio}", alone, storages))
        rows.append((f"idf r={ratio}", {"selector": "idf", "ratio": ratio, **plain}, storages))
        rows.append((f"pool r={ratio}", {"selector": "pool", "ratio": ratio, **plain}, storages))
        assign = {"aggregate": "assign", "assign_weight": ASSIGN_WEIGHT}
        rows.append((f"idf+assign r={ratio}", {"selector": "idf", "ratio": ratio, **assign}, ("float32",)))
    for frequent in PRUNE:
        settings = {"selector": "prune", "ratio": 1.0, "prune": frequent, **plain}
        rows.append((f"prune {frequent}", settings, STORAGES))
    rows.append((f"cap {CAP} (pool)", {"selector": "pool", "ratio": 1.0, "cap": CAP, **plain}, STORAGES))
    rows.append(("all (sbert-tokens)", {"selector": "idf", "ratio": 1.0, **plain}, STORAGES))
    return rows


# --- the tasks ------------------------------------------------------------------------------------------
def doc_paragraph_pairs(split: str) -> tuple[list[str], list[str]]:
    """(first sentence, rest of the paragraph) of up to PARAGRAPHS_PER_PAGE paragraphs of 30 to 200 words
    per long man page of `split` (seeded per page)."""
    from bench_long import pages, split_of

    queries, answers = [], []
    for page in pages(10**6):
        if split_of(page["id"]) != split:
            continue
        found = []
        for paragraph in page["text"].split("\n"):
            match = re.search(r"[.!?] (?=[A-Z])", paragraph)
            if match and 30 <= len(paragraph.split()) <= 200:
                first, rest = paragraph[: match.end()].strip(), paragraph[match.end() :].strip()
                if len(first.split()) >= 5 and len(rest.split()) >= 15:
                    found.append((first, rest))
        rng = np.random.default_rng(int.from_bytes(page["id"].encode()[:8].ljust(8, b"\0"), "little"))
        for i in sorted(rng.permutation(len(found))[:PARAGRAPHS_PER_PAGE]):
            queries.append(found[i][0])
            answers.append(found[i][1])
    return queries, answers


TASKS = ("pi", "docs", "halves", "20ng")


def build_tasks(split: str, quick: bool, halves: int, news: int, names=TASKS) -> dict:
    """name -> (evaluator, metric): built once; each row sets the evaluator's `embed_function`."""
    from docembed.evaluation import EvalOptions, Halves, LabelRetrieval, PairedRetrieval, get_evaluator
    from docembed.evaluation.tasks import labelled_sample

    tasks = {}
    if "pi" in names:
        pi = get_evaluator("paraphrase-identification", EvalOptions(limit=256 if quick else None))
        tasks["pi"] = (pi, "mrr")
    if "docs" in names:
        tasks["docs"] = (PairedRetrieval(*doc_paragraph_pairs(split), EvalOptions()), "mrr")
    if "halves" in names:
        whole = get_evaluator("halves" if split == "test" else "halves-val", EvalOptions())
        tasks["halves"] = (Halves(whole.documents[:halves], EvalOptions()), "mrr")
    if "20ng" in names:
        source = "20newsgroups/test" if split == "test" else "20newsgroups/train"
        news_options = EvalOptions(limit=news)
        tasks["20ng"] = (LabelRetrieval(*labelled_sample(source, news_options), news_options), "map@100")
    return tasks


# --- one row --------------------------------------------------------------------------------------------
def stored(vectors, storage: str):
    """The vectors as `docembed encode --storage` writes and reads them back."""
    import docembed

    if storage == "float32":
        return vectors
    with tempfile.TemporaryDirectory() as folder:
        path = str(pathlib.Path(folder) / "v.npz")
        docembed.save_embeddings(
            docembed.EmbeddingSet(vectors, [str(i) for i in range(len(vectors))]), path, storage=storage
        )
        return docembed.load_embeddings(path).data


def run_row(model, settings: dict, storage: str, evaluator, metric: str, states: dict) -> dict:
    encoder = model.encoder
    encoder.set_ratio(settings["ratio"])
    encoder.set_selection(
        settings["selector"],
        max_nuggets=settings.get("cap"),
        prune_frequent=settings.get("prune", 1000),
        aggregate=settings["aggregate"],
        assign_weight=settings["assign_weight"],
    )
    counts = []

    def embed(_model, texts):
        with encoder.sharing_states(states):
            vectors = encoder.encode(texts)
        counts.extend(np.diff(vectors.offsets).tolist())
        return stored(vectors, storage)

    evaluator.embed_function = embed
    started = time.perf_counter()
    result = evaluator.run(encoder)
    per_vector = encoder.dim * BYTES[storage] + (4 if storage == "int8" else 0)
    vectors = float(np.mean(counts))
    return {
        "score": round(result.score, 2),
        "se": round(result.metrics.get(f"{metric}_se", float("nan")), 2),
        "vectors_per_doc": round(vectors, 1),
        "bytes_per_doc": round(vectors * per_vector),
        "seconds": round(time.perf_counter() - started, 1),
        "per_item": result.metrics["per_item"][metric],
    }


def encode_times(model, documents: int = 200) -> dict:
    """bench_nugget's encode time against the plain encoder's forward (first 256 tokens of PI dev
    documents, one thread), for the learned selection alone, with `assign` (the shipped model), and for
    token pooling."""
    from bench_nugget import encode_time

    encoder = model.encoder
    encoder.set_long_documents("truncate")  # the plain forward reads one window: so does encode here
    times = {}
    for label, selector, aggregate in (
        ("nugget, no assign", "scorer", "none"),
        ("nugget", "scorer", "assign"),
        ("pool", "pool", "none"),
    ):
        encoder.set_selection(selector, max_nuggets=None, aggregate=aggregate, assign_weight=ASSIGN_WEIGHT)
        times[label] = encode_time(encoder, documents)
    encoder.set_long_documents("windows")
    return times


# --- the whole bench ------------------------------------------------------------------------------------
def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    quick: bool = False,
    *,
    split: str = "test",
    model_path: str = "nugget",
    halves: int | None = None,
    news: int | None = None,
    out: pathlib.Path | None = OUT,
    rows: list | None = None,
    tasks: tuple[str, ...] = TASKS,
    variants: dict[str, str] | None = None,
    timing: bool = True,
) -> dict:
    """run.py's entry (`out_dir` unused: the summary goes to `out`); `quick`: 256 PI queries and small
    halves / 20NG samples, `full`: 600 halves documents and 1,000 20NG posts."""
    import docembed
    from docembed.evaluation.statistics import paired_difference

    sys.path.insert(0, str(BENCH_DIR))
    if halves is None:
        halves = 60 if quick else (600 if full else 200)
    if news is None:
        news = 150 if quick else (1000 if full else 300)
    model = docembed.load(model_path, device="cpu")
    # other trained models over the same frozen MiniLM: their learned rows, on the same shared states
    others = {label: docembed.load(path, device="cpu") for label, path in (variants or {}).items()}
    own = {m: (m.encoder.config.aggregate, m.encoder.config.assign_weight) for m in [model, *others.values()]}
    results: dict = {
        "split": split,
        "model": str(model_path),
        "variants": variants or {},
        "tasks": {},
        "rows": {},
    }
    for task, (evaluator, metric) in build_tasks(split, quick, halves, news, tasks).items():
        states: dict = {}  # token ids of a window -> its MiniLM states: the encoder runs once per window
        table = {}
        runs = [(label, model, *rest) for label, *rest in rows or rows_to_run()]
        for variant, other in others.items():
            chosen = [row for row in rows or rows_to_run() if row[1]["selector"] == "scorer"]
            runs += [(f"{variant}: {label}", other, settings, ("float32",)) for label, settings, _ in chosen]
        for label, encoder_of, settings, storages in runs:
            # a row that names no aggregation runs the model's own (what loading it gives)
            settings = {"aggregate": own[encoder_of][0], "assign_weight": own[encoder_of][1], **settings}
            for storage in storages:
                name = label if storage == "float32" else f"{label} {storage}"
                table[name] = run_row(encoder_of, settings, storage, evaluator, metric, states)
                print(
                    f"{task} {name}: {table[name]['score']} ({table[name]['vectors_per_doc']} vectors)",
                    file=sys.stderr,
                )
        for name, row in table.items():
            ratio = re.search(r"r=([0-9.]+)$", name)
            reference = table.get(f"nugget r={ratio.group(1)}") if ratio else None
            if reference is not None and row is not reference:
                row["vs_nugget"] = paired_difference(reference["per_item"], row["per_item"])
            if name != "all (sbert-tokens)":
                row["vs_all"] = paired_difference(row["per_item"], table["all (sbert-tokens)"]["per_item"])
        results["tasks"][task] = {"metric": metric, "queries": len(table["all (sbert-tokens)"]["per_item"])}
        for name, row in table.items():
            results["rows"].setdefault(name, {})[task] = row
        states.clear()
    if timing:
        results["encode_time"] = encode_times(model)
    summary = {
        **results,
        "sizes": {"halves": halves, "20ng": news, "pi": 256 if quick else "all"},
        "rows": {
            name: {task: {k: v for k, v in row.items() if k != "per_item"} for task, row in by_task.items()}
            for name, by_task in results["rows"].items()
        },
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        out.with_suffix(".md").write_text(render(summary), encoding="utf-8")
    return summary


def merged(paths: list[pathlib.Path]) -> dict:
    """One summary from runs of disjoint task sets (two processes, one thread each)."""
    parts = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    summary = {**parts[0], "tasks": {}, "rows": {}}
    for part in parts:
        summary["tasks"].update(part["tasks"])
        summary["sizes"] = {**summary.get("sizes", {}), **part.get("sizes", {})}
        for name, by_task in part["rows"].items():
            summary["rows"].setdefault(name, {}).update(by_task)
        if "encode_time" in part:
            summary["encode_time"] = part["encode_time"]
    return summary


def render(summary: dict) -> str:
    tasks = list(summary["tasks"])
    lines = [
        f"NUGGET against the vector-reducing rules ({summary['split']} side; model {summary['model']}). "
        "Score x100 (vectors per document, bytes per document); nugget minus the row at the same r, and the "
        "row as % of all vectors.",
        "",
        "| row | " + " | ".join(f"{t} ({summary['tasks'][t]['metric']})" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, by_task in summary["rows"].items():
        cells = []
        for task in tasks:
            row = by_task[task]
            cell = f"{row['score']:.2f} ({row['vectors_per_doc']:g}, {row['bytes_per_doc']:,} B)"
            if "vs_nugget" in row:
                cell += f"; nugget {row['vs_nugget']['diff']:+.2f} ± {row['vs_nugget']['se']:.2f}"
            all_score = summary["rows"]["all (sbert-tokens)"][task]["score"]
            if all_score:
                cell += f"; {100 * row['score'] / all_score:.1f} %"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if "encode_time" in summary:
        times = ", ".join(
            f"{label} {row['nugget_time_over_plain']:.2f}x" for label, row in summary["encode_time"].items()
        )
        lines += ["", f"Encode time over the plain encoder's forward pass (r = 0.1, one thread): {times}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--model", default="nugget", help="a nugget model: built-in name or saved folder")
    parser.add_argument("--quick", action="store_true", help="256 PI dev queries, small samples elsewhere")
    parser.add_argument("--halves", type=int, help="documents of the halves task (default 200)")
    parser.add_argument("--news", type=int, help="20NG documents (default 300)")
    parser.add_argument("--no-timing", action="store_true", help="skip the encode-time measurement")
    parser.add_argument("--merge", nargs="+", type=pathlib.Path, help="merge runs of other tasks into --out")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--rows", help="comma-separated row labels to run (default: all)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks to run")
    parser.add_argument("--variant", action="append", default=[], help="LABEL=DIR: another trained nugget")
    args = parser.parse_args()
    if args.merge:
        summary = merged(args.merge)
        args.out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        args.out.with_suffix(".md").write_text(render(summary), encoding="utf-8")
        print(render(summary))
        sys.exit(0)
    chosen = None
    if args.rows:
        wanted = set(args.rows.split(","))
        chosen = [r for r in rows_to_run() if r[0] in wanted]
    summary = main(
        quick=args.quick,
        split=args.split,
        model_path=args.model,
        halves=args.halves,
        news=args.news,
        out=args.out,
        rows=chosen,
        tasks=tuple(args.tasks.split(",")),
        variants=dict(v.split("=", 1) for v in args.variant),
        timing=not args.no_timing,
    )
    print(render(summary))
