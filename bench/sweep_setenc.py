"""Model selection for the set encoder on a validation split carved from 20 Newsgroups *train*, never test.

20newsgroups/train is split 90 / 10 (stratified by newsgroup, seed 0). Each configuration in GRID is
trained with `docembed train-setenc` on the 90 % and scored on the 10 %: every validation post queries the
others (same newsgroup = relevant), MAP@100 and leave-one-out kNN accuracy (k = 10), x100; tfidf (fitted on
the 90 %) and PV-DBOW (trained on the 90 %) are scored the same way as the bar. The selection rule is the
mean of MAP@100 and kNN accuracy; the winner's flags become train-setenc's defaults (by hand, in
cli/train_setenc.py), and bench_setenc.py measures the model trained with them on the full train split
against the test split.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sweep_setenc.py [--only LABEL,...] [--out bench/results/setenc]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "runs" / "setenc-sweep"
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
VALIDATION_FRACTION, SPLIT_SEED = 0.1, 0

# label -> train-setenc flags (the rest are train-setenc's defaults at the time of the sweep)
GRID: dict[str, list[str]] = {
    "defaults (t 3)": [],
    "t 2": ["--temperature", "2"],
    "t 2, bag counts": ["--temperature", "2", "--counts", "bag"],
    "t 2, 2^18 buckets": ["--temperature", "2", "--buckets", str(1 << 18)],
    "t 2, softmax attention": ["--temperature", "2", "--attention", "softmax"],
    "t 2, 20 epochs": ["--temperature", "2", "--epochs", "20"],
    "t 2, dim 512": ["--temperature", "2", "--dim", "512"],
}


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated labels of GRID")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "setenc")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from docembed.models.baselines import TfidfConfig, TfidfEncoder
    from docembed.models.registry import load_model

    train_path, val_path = split_train()
    train_texts, _ = read(train_path)
    val_texts, val_labels = read(val_path)
    results: dict[str, dict] = {}

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

    labels = args.only.split(",") if args.only else list(GRID)
    for label in labels:
        out = WORK / label.replace(" ", "_").replace(",", "").replace("^", "")
        started = time.perf_counter()
        if not (out / "config.json").exists():
            command = [
                DOCEMBED,
                "-q",
                "--seed",
                "0",
                "train-setenc",
                str(train_path),
                "-o",
                str(out),
                *GRID[label],
            ]
            subprocess.run(command, check=True)
        seconds = time.perf_counter() - started
        row = score(dense_similarities(load_model(str(out)), val_texts), val_labels)
        row["selection"] = round((row["map@100"] + row["knn_accuracy"]) / 2, 2)
        row["train_s"] = round(seconds, 1)
        row["flags"] = " ".join(GRID[label])
        results[label] = row
        print(f"{label}: {row}", file=sys.stderr, flush=True)

    chosen = max((k for k in results if k in GRID), key=lambda k: results[k]["selection"])
    summary = {
        "split": f"20newsgroups/train, {1 - VALIDATION_FRACTION:.0%} train / {VALIDATION_FRACTION:.0%} "
        f"validation, stratified, seed {SPLIT_SEED}: {len(train_texts)} / {len(val_texts)} posts",
        "rule": "mean of validation MAP@100 and kNN accuracy",
        "results": results,
        "chosen": chosen,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'config':<26} {'MAP@100':>8} {'kNN':>6} {'P@10':>6}")
    for label, row in results.items():
        print(f"{label:<26} {row['map@100']:8.2f} {row['knn_accuracy']:6.2f} {row['p@10']:6.2f}")
    print(f"chosen: {chosen}")


if __name__ == "__main__":
    main()
