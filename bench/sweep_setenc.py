"""Model selection for the set encoder on a validation split carved from 20 Newsgroups *train*, never test.

20newsgroups/train is split 90 / 10 (stratified by newsgroup, seed 0). Each configuration in GRID is
trained with `docembed train-setenc` on the 90 % and scored on the 10 %: every validation post queries the
others (same newsgroup = relevant), MAP@100 and leave-one-out kNN accuracy (k = 10), x100; tfidf (fitted on
the 90 %) and PV-DBOW (trained on the 90 %) are scored the same way as the bar. The selection rule is the
mean of MAP@100 and kNN accuracy (averaged over training seeds with --seeds 0,1,2); the winner's flags
become train-setenc's defaults (by hand, in cli/train_setenc.py), and bench_setenc.py measures the model
trained with them on the full train split against the test split.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sweep_setenc.py [--only "LABEL;LABEL"] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "runs" / "setenc-sweep"
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
VALIDATION_FRACTION, SPLIT_SEED = 0.1, 0

# label -> train-setenc flags (the rest are train-setenc's defaults at the time of the sweep)
# fmt: off
GRID: dict[str, list[str]] = {
    "defaults (t 3)": [],
    "t 2": ["--temperature", "2"],
    "t 2, bag counts": ["--temperature", "2", "--counts", "bag"],
    "t 2, 2^18 buckets": ["--temperature", "2", "--buckets", str(1 << 18)],
    "t 2, softmax attention": ["--temperature", "2", "--attention", "softmax"],
    "t 2, 20 epochs": ["--temperature", "2", "--epochs", "20"],
    "t 2, dim 512": ["--temperature", "2", "--dim", "512"],
    # session 6: capacity and training length, after the neighbour analysis (bench_neighbours.py)
    "t 2, word dim 128": ["--temperature", "2", "--word-dim", "128"],
    "t 2, word dim 256, 8 heads, dim 512": [
        "--temperature", "2", "--word-dim", "256", "--heads", "8", "--dim", "512", "--hidden", "1024"],
    "t 2, all tokens": ["--temperature", "2", "--max-train-tokens", "8192"],
    "t 2, batch 128": ["--temperature", "2", "--batch-size", "128"],
    "t 2, batch 128, all tokens": ["--temperature", "2", "--batch-size", "128", "--max-train-tokens", "8192"],
    "t 2, batch 128, all tokens, dim 512": [
        "--temperature", "2", "--batch-size", "128", "--max-train-tokens", "8192", "--dim", "512"],
    "t 2, batch 64, all tokens": ["--temperature", "2", "--batch-size", "64", "--max-train-tokens", "8192"],
}
# fmt: on


def split_train() -> tuple[pathlib.Path, pathlib.Path]:
    """90 / 10 stratified split of 20newsgroups/train: two JSONL files under runs/ (derived, not shipped)."""
    from sklearn.model_selection import train_test_split

    from docembed import datasets

    train_path, val_path = WORK / "train90.jsonl", WORK / "val10.jsonl"
    if train_path.exists() and val_path.exists():
        return train_path, val_path
    rows = list(datasets.records("20newsgroups/train"))
    train_rows, val_rows = train_test_split(
        rows,
        test_size=VALIDATION_FRACTION,
        stratify=[r["label"] for r in rows],
        random_state=SPLIT_SEED,
    )
    WORK.mkdir(parents=True, exist_ok=True)
    for path, part in ((train_path, train_rows), (val_path, val_rows)):
        with open(path, "w", encoding="utf-8") as handle:
            for row in part:
                handle.write(json.dumps({"id": row["id"], "text": row["text"], "label": row["label"]}) + "\n")
    return train_path, val_path


def read(path: pathlib.Path) -> tuple[list[str], np.ndarray]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [r["text"] for r in rows], np.asarray([r["label"] for r in rows])


def score(similarities, labels: np.ndarray) -> dict[str, float]:
    from docembed.evaluation.retrieval import label_retrieval

    result = label_retrieval(similarities, labels, np.random.default_rng(1111))
    return {k: round(result[k], 2) for k in ("map@100", "knn_accuracy", "p@10")}


def dense_similarities(model, texts: list[str]) -> np.ndarray:
    from docembed.scoring import cosine_matrix

    vectors = model.encode(texts, batch_size=64)
    return cosine_matrix(vectors, vectors)


SELECTION_RULE = (
    "score = mean of validation MAP@100 and kNN accuracy, averaged over a row's training seeds; among the"
    " rows trained with two or more seeds, the fastest to train whose score is within one standard error"
    " of the best (the one-standard-error rule; SE = the seed SD pooled over those rows / sqrt(seeds))"
)


def choose(results: dict[str, dict]) -> tuple[str, float | None]:
    """(chosen label, pooled seed SD) by SELECTION_RULE; the best single-seed row when no row has seeds."""
    seeded = {k: r for k, r in results.items() if k in GRID and len(r.get("seeds", {})) > 1}
    if not seeded:
        return max((k for k in results if k in GRID), key=lambda k: results[k]["selection"]), None
    pooled = float(np.sqrt(np.mean([r["selection_sd"] ** 2 for r in seeded.values()])))
    best = max(seeded, key=lambda k: seeded[k]["selection"])
    floor = seeded[best]["selection"] - pooled / np.sqrt(len(seeded[best]["seeds"]))
    within = [k for k, r in seeded.items() if r["selection"] >= floor]
    return min(within, key=lambda k: seeded[k]["train_s"]), round(pooled, 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="labels of GRID, separated by semicolons (labels hold commas)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "setenc")
    parser.add_argument("--seeds", default="0", help="training seeds per configuration, comma-separated")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from docembed.models.baselines import TfidfConfig, TfidfEncoder
    from docembed.models.registry import load_model

    train_path, val_path = split_train()
    train_texts, _ = read(train_path)
    val_texts, val_labels = read(val_path)
    # Rows of earlier runs are kept (a run with --only adds or replaces its own rows).
    previous = args.out / "sweep.json"
    results: dict[str, dict] = json.loads(previous.read_text())["results"] if previous.exists() else {}

    tfidf = TfidfEncoder(TfidfConfig(), name="tfidf").fit(train_texts)
    sparse = tfidf.encode_sparse(val_texts)
    results["tfidf"] = score(np.asarray((sparse @ sparse.T).todense()), val_labels)
    print(f"tfidf: {results['tfidf']}", file=sys.stderr, flush=True)

    pv_dir = WORK / "pv"
    if not (pv_dir / "config.json").exists():
        pv_flags = ["--mode", "dbow", "--dim", "300", "--epochs", "20", "--no-dbow-words", "--workers", "1"]
        subprocess.run(
            [DOCEMBED, "-q", "--seed", "0", "train-pv", str(train_path), "-o", str(pv_dir), *pv_flags],
            check=True,
        )
    results["pv"] = score(dense_similarities(load_model(str(pv_dir)), val_texts), val_labels)
    print(f"pv: {results['pv']}", file=sys.stderr, flush=True)

    labels = [label.strip() for label in args.only.split(";")] if args.only else list(GRID)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    for label in labels:
        runs = []
        for seed in seeds:
            out = WORK / (
                label.replace(" ", "_").replace(",", "").replace("^", "") + (f"_seed{seed}" if seed else "")
            )
            if not (out / "config.json").exists():
                command = [
                    DOCEMBED,
                    "-q",
                    "--seed",
                    str(seed),
                    "train-setenc",
                    str(train_path),
                    "-o",
                    str(out),
                ]
                subprocess.run([*command, *GRID[label]], check=True)
            run = score(dense_similarities(load_model(str(out)), val_texts), val_labels)
            run["train_s"] = round(json.loads((out / "train_summary.json").read_text())["seconds"], 1)
            runs.append(run)
        row = {k: round(float(np.mean([r[k] for r in runs])), 2) for k in ("map@100", "knn_accuracy", "p@10")}
        selections = [(r["map@100"] + r["knn_accuracy"]) / 2 for r in runs]
        row["selection"] = round(float(np.mean(selections)), 2)
        if len(runs) > 1:  # the spread over seeds says how far apart two rows must be to differ
            row["selection_sd"] = round(float(np.std(selections, ddof=1)), 2)
            row["seeds"] = {str(seed): run for seed, run in zip(seeds, runs, strict=True)}
        row["train_s"] = round(float(np.mean([r["train_s"] for r in runs])), 1)
        row["flags"] = " ".join(GRID[label])
        results[label] = row
        print(f"{label}: {row}", file=sys.stderr, flush=True)

    chosen, pooled_sd = choose(results)
    summary = {
        "split": f"20newsgroups/train, {1 - VALIDATION_FRACTION:.0%} train / {VALIDATION_FRACTION:.0%} "
        f"validation, stratified, seed {SPLIT_SEED}: {len(train_texts)} / {len(val_texts)} posts",
        "rule": SELECTION_RULE,
        "pooled_seed_sd": pooled_sd,
        "results": results,
        "chosen": chosen,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "sweep_validation.md").write_text(markdown(summary))
    print(markdown(summary))


def markdown(summary: dict) -> str:
    """The sweep as a Markdown table (bench/results/setenc/sweep_validation.md)."""
    lines = [
        "# Set encoder: model selection on the validation split (generated by bench/sweep_setenc.py)",
        "",
        f"Split: {summary['split']}. Every validation post queries the others (same newsgroup = relevant).",
        f"Rule: {summary['rule']}. Pooled seed SD: {summary.get('pooled_seed_sd')}. "
        f"Chosen: **{summary['chosen']}**.",
        "",
        "| configuration | MAP@100 | kNN acc | P@10 | score | seed SD | seeds | train s | flags |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in summary["results"].items():
        seeds = ", ".join(row.get("seeds", {})) or ("0" if "selection" in row else "-")
        lines.append(
            f"| {label} | {row['map@100']:.2f} | {row['knn_accuracy']:.2f} | {row['p@10']:.2f} "
            f"| {row.get('selection', '-')} | {row.get('selection_sd', '-')} | {seeds} "
            f"| {row.get('train_s', '-')} | `{row.get('flags', '')}` |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
