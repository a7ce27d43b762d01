"""Set encoder on 20 Newsgroups against tfidf, Paragraph Vector (same training text) and glove-avg, one run.

For every model, on the 20 Newsgroups test split (7,532 posts):
- the evaluation harness' numbers: linear-probe accuracy (`docembed evaluate 20newsgroups`: probe trained on
  the train split) and leave-one-out kNN accuracy (k=10) and MAP@100 (`20newsgroups-retrieval`: each test
  post queries the others, same newsgroup = relevant);
- Wang & Isola's geometry of its test embeddings, L2-normalised: alignment = mean ||f(a) - f(b)||^2 over
  the two random halves (a, b) of each test post (one seeded shuffle of its word tokens, split at len // 2,
  the same halves for every model; posts with < 2 tokens left out), and uniformity = log mean_{i<j}
  exp(-t ||f(x_i) - f(x_j)||^2) over all pairs of whole test posts, for t = 2 (the paper's) and t = 3 (our
  training default). tfidf is measured on the sparse tf-idf rows it retrieves with;
- encode throughput (docs/s) on 2,000 test posts, one thread, and its ratio to tfidf's and PV's inference;
- t-SNE maps of the set encoder and tfidf (its 256-d LSA `encode()` output) test embeddings, coloured by
  newsgroup: setenc_20ng_tsne.png and tfidf_20ng_tsne.png in out_dir.

Models: the set encoder from `SETENC_MODEL` (default runs/setenc-20ng-final), else one trained here on
20newsgroups/train with the train-setenc defaults, which are the settings selected on a validation split of
20NG train (bench/sweep_setenc.py; at most 20 minutes; `docembed --seed 0 train-setenc 20newsgroups/train
-o runs/setenc-20ng-final`, 10 epochs in ~2 min);
PV from `PV_MODEL` (default runs/pv-20ng), else trained here: `docembed train-pv` PV-DBOW, 300-d,
--no-dbow-words, 20 epochs (quick: 5), one worker; tfidf fitted on 20newsgroups/train by the harness;
glove-avg as shipped. Quick mode (default) evaluates a stratified 2,000 test and train posts; full=True the
whole splits. The four models are evaluated
in parallel processes (one thread each; at most $BENCH_JOBS of them), then timed one at a time.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_setenc.py [--full] [--out DIR]
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCEMBED = [str(pathlib.Path(sys.executable).with_name("docembed"))]


def _docembed(*args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    subprocess.run([*DOCEMBED, "-q", *args], check=True, env=env, cwd=ROOT)


def _setenc_model(full: bool, out_dir: pathlib.Path) -> tuple[pathlib.Path, str]:
    path = pathlib.Path(os.environ.get("SETENC_MODEL", ROOT / "runs" / "setenc-20ng-final"))
    if (path / "config.json").exists():
        return path, "existing"
    path = out_dir / "setenc-model"
    _docembed(
        "--seed",
        "0",
        "train-setenc",
        "20newsgroups/train",
        "-o",
        str(path),
        "--time-budget",
        "1200",
    )
    # the defaults are the settings selected on the validation split (bench/sweep_setenc.py), not on test
    return path, "trained here: train-setenc defaults (validation-selected), --time-budget 1200"


def _pv_model(full: bool, out_dir: pathlib.Path) -> tuple[pathlib.Path, str]:
    from docembed import datasets

    path = pathlib.Path(os.environ.get("PV_MODEL", ROOT / "runs" / "pv-20ng"))
    if (path / "config.json").exists():
        return path, "existing"
    path = out_dir / "pv-model"
    corpus = str(datasets.dataset_path("20newsgroups/train"))
    extra = [] if full else ["--epochs", "5"]
    _docembed(
        "train-pv",
        corpus,
        "-o",
        str(path),
        "--no-dbow-words",
        "--workers",
        "1",
        "--encode-workers",
        "1",
        *extra,
    )
    return path, "trained here" + ("" if full else " (5 epochs)")


def halves(texts: list[str], seed: int = 0) -> tuple[list[str], list[str], list[int]]:
    """Two random disjoint halves of each text's word tokens (joined by spaces), and which texts had them."""
    from docembed.models.setenc import word_tokens
    from docembed.training.setenc_recipe import split_views

    rng = np.random.default_rng(seed)
    lefts, rights, kept = [], [], []
    for i, text in enumerate(texts):
        tokens = np.array(word_tokens(text), dtype=object)
        if len(tokens) < 2:
            continue
        left, right = split_views(tokens, rng)
        lefts.append(" ".join(left))
        rights.append(" ".join(right))
        kept.append(i)
    return lefts, rights, kept


def _unit_rows(x):
    import scipy.sparse as sp

    if sp.issparse(x):
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1))).ravel()
        return sp.diags(1.0 / np.maximum(norms, 1e-12)) @ x
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def geometry(whole, left, right, ts=(2.0, 3.0), block: int = 1024) -> dict:
    """Wang & Isola's alignment (halves) and uniformity (whole documents, all pairs i<j) of unit rows.
    The pair sum runs over row blocks, so memory stays at block x n."""
    import scipy.sparse as sp

    left, right, whole = _unit_rows(left), _unit_rows(right), _unit_rows(whole)
    if sp.issparse(left):
        cos_pairs = np.asarray(left.multiply(right).sum(axis=1)).ravel()
    else:
        cos_pairs = np.einsum("ij,ij->i", left, right)
    out = {"align": float(np.mean(np.clip(2 - 2 * cos_pairs, 0, 4)))}
    n = whole.shape[0]
    sums = dict.fromkeys(ts, 0.0)
    for start in range(0, n, block):
        gram = whole[start : start + block] @ whole.T
        gram = np.asarray(gram.todense()) if sp.issparse(gram) else gram
        squared = np.clip(2 - 2 * gram, 0, 4)
        # keep only j > i: every unordered pair once, never a point with itself
        upper = np.arange(n)[None, :] > np.arange(start, start + len(squared))[:, None]
        for t in ts:
            sums[t] += float(np.exp(-t * squared[upper]).sum())
    pairs = n * (n - 1) / 2
    for t in ts:  # exp(-t d^2) >= exp(-4t) > 0, so the plain mean neither overflows nor underflows
        out[f"uniform_t{t:g}"] = float(np.log(sums[t] / pairs))
    return out


def _throughput(encode, texts: list[str]) -> float:
    started = time.perf_counter()
    encode(texts)
    return len(texts) / (time.perf_counter() - started)


def _test_split(limit: int | None, seed: int):
    from docembed import datasets
    from docembed.evaluation.statistics import sample_indices

    rows = list(datasets.records("20newsgroups/test"))
    keep = sample_indices(len(rows), limit, np.random.default_rng(seed), [r["label"] for r in rows])
    return [rows[i]["text"] for i in keep], [rows[i]["label"] for i in keep], [rows[i]["id"] for i in keep]


def _evaluate(name: str, spec: str, limit: int | None, out_dir: pathlib.Path) -> dict:
    """One model's harness metrics, geometry and (for setenc, tfidf) t-SNE map; runs in its own process."""
    import torch

    from docembed import datasets
    from docembed.evaluation import get_evaluator, load_evaluation_model
    from docembed.evaluation.base import EvalOptions, cached_encode

    torch.set_num_threads(1)
    # The harness' embedding cache lets the retrieval task reuse the probe task's test embeddings.
    options = EvalOptions(limit=limit)
    test_texts, test_labels, test_ids = _test_split(limit, options.seed)
    lefts, rights, _ = halves(test_texts)
    model = load_evaluation_model(spec)
    started = time.perf_counter()
    probe = get_evaluator("20newsgroups", options).run(model)
    retrieval = get_evaluator("20newsgroups-retrieval", options).run(model)
    if name == "tfidf":  # the harness fitted it per task; fit once more for the geometry
        model.fit(list(datasets.iter_texts("20newsgroups/train")))
    sparse = hasattr(model, "encode_sparse")
    embed = model.encode_sparse if sparse else model.encode
    # whole test posts: the harness already embedded them (its cache); tf-idf rows are cheap
    whole = embed(test_texts) if sparse else cached_encode(model, test_texts, options.batch_size)
    entry = {
        "probe_accuracy": probe.metrics["accuracy"],
        "probe_c": probe.metrics.get("c"),
        "knn_accuracy": retrieval.metrics["knn_accuracy"],
        "map@100": retrieval.metrics["map@100"],
        "p@10": retrieval.metrics["p@10"],
        **geometry(whole, embed(lefts), embed(rights)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if name in ("setenc", "tfidf"):
        _plot(model, name, test_texts, test_ids, test_labels, out_dir)
    print(f"{name}: {json.dumps(entry)}", file=sys.stderr, flush=True)
    return entry


def main(out_dir: pathlib.Path, full: bool = False) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from docembed.evaluation import load_evaluation_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    limit = None if full else 2000

    setenc_path, setenc_origin = _setenc_model(full, out_dir)
    pv_path, pv_origin = _pv_model(full, out_dir)
    specs = {"setenc": str(setenc_path), "tfidf": "tfidf", "pv": str(pv_path), "glove-avg": "glove-avg"}
    test_texts, _, _ = _test_split(limit, 1111)
    lefts, _, _ = halves(test_texts)
    result: dict = {
        "data": {
            "test": f"20newsgroups/test ({len(test_texts)} posts{'' if full else ', stratified subset'})",
            "train": "20newsgroups/train (11,314 posts): setenc, pv and tfidf fitted on it",
            "halves": f"{len(lefts)} test posts with >= 2 word tokens",
        },
        "models": {
            "setenc": {"path": str(setenc_path), "origin": setenc_origin},
            "pv": {"path": str(pv_path), "origin": pv_origin},
        },
        "throughput_docs": "the first 2,000 of those test posts, encoded once per model, sequentially",
        "load_average_before": os.getloadavg(),
    }
    for name in ("setenc", "pv"):
        summary = pathlib.Path(result["models"][name]["path"]) / "train_summary.json"
        if summary.exists():
            info = json.loads(summary.read_text())
            result["models"][name]["train_summary"] = {
                k: info.get(k) for k in ("steps", "seconds", "epochs_completed", "docs_per_s", "last")
            }
    jobs = max(1, min(len(specs), int(os.environ.get("BENCH_JOBS", len(specs)))))
    result["threads"] = f"1 per model; the models are evaluated in {jobs} process(es), then timed one by one"
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {name: pool.submit(_evaluate, name, spec, limit, out_dir) for name, spec in specs.items()}
        scores = {name: future.result() for name, future in futures.items()}
    # Throughput, one model at a time in this process (tfidf: its sparse rows, and its dense LSA encode()).
    from docembed import datasets

    timing_texts = test_texts[:2000]
    for name, spec in specs.items():
        model = load_evaluation_model(spec)
        if name == "tfidf":
            model.fit(list(datasets.iter_texts("20newsgroups/train")))
            scores[name]["encode_dense_lsa_docs_per_s"] = round(_throughput(model.encode, timing_texts), 1)
        embed = model.encode_sparse if hasattr(model, "encode_sparse") else model.encode
        scores[name]["encode_docs_per_s"] = round(_throughput(embed, timing_texts), 1)
    result["scores"] = scores
    base = scores["setenc"]["encode_docs_per_s"]
    result["encode_speed_ratio"] = {
        "setenc_vs_tfidf": round(base / scores["tfidf"]["encode_docs_per_s"], 3),
        "setenc_vs_pv": round(base / scores["pv"]["encode_docs_per_s"], 3),
    }
    result["setenc_beats"] = {
        peer: {
            m: scores["setenc"][m] > scores[peer][m] for m in ("knn_accuracy", "map@100", "probe_accuracy")
        }
        for peer in ("tfidf", "pv", "glove-avg")
    }
    result["load_average_after"] = os.getloadavg()
    (out_dir / "bench_setenc.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _plot(model, name: str, texts, ids, labels, out_dir: pathlib.Path) -> None:
    """t-SNE map via `docembed plot` (reads an embeddings file and a labels JSONL)."""
    import tempfile

    from docembed.io.embeddings import save_embeddings
    from docembed.types import EmbeddingSet

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_setenc_"))
    embeddings = work / f"{name}.npz"
    save_embeddings(EmbeddingSet(model.encode(texts), ids, {"model": name}), str(embeddings))
    labels_path = work / "labels.jsonl"
    with open(labels_path, "w", encoding="utf-8") as handle:
        for doc_id, label in zip(ids, labels, strict=True):
            handle.write(json.dumps({"id": doc_id, "label": label}) + "\n")
    png = out_dir / f"{name}_20ng_tsne.png"
    title = f"{name}: 20 Newsgroups test ({len(ids)} posts), t-SNE"
    try:
        _docembed(
            "plot",
            str(embeddings),
            "--labels",
            str(labels_path),
            "-o",
            str(png),
            "--overwrite",
            "--title",
            title,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "setenc"))
    args = parser.parse_args()
    print(json.dumps(main(pathlib.Path(args.out), full=args.full), indent=2))
