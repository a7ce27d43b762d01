"""The Ray engine against the local engine on the same documents, end to end as a user runs them:

- local: `docembed encode DOCS -o local.parquet`, one process with W torch threads;
- ray:   `docembed encode DOCS --engine ray --num-workers W -o DIR`, a local Ray instance with W actors of
         1 CPU (and 1 torch thread) each, so both use the same W cores.

Both timings include process start and model loading; the Ray one also includes starting the Ray instance
and the actors (seconds, so it matters on small inputs). Documents: the first N short texts of SentEval MR,
SUBJ and MPQA (in that order, read from $DOCEMBED_DATA), model `sbert` (all-MiniLM-L6-v2), batch size 32.
The outputs are compared row by row: ids, and the largest absolute difference of any vector component.

    .venv/bin/python bench/bench_ray.py [--docs 20000] [--workers 2] [--local-threads W] [--out bench/results]

writes OUT/ray.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

SOURCES = ("senteval/mr", "senteval/subj", "senteval/mpqa")
MODEL = "sbert"
TOLERANCE = 1e-5
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))


def build_corpus(path: pathlib.Path, n: int) -> int:
    """The first `n` texts of SOURCES as JSON Lines with ids; returns how many there were."""
    from docembed import datasets

    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        for name in SOURCES:
            for doc in datasets.documents(name):
                if written == n:
                    return written
                record = {"id": f"{name.split('/')[-1]}-{doc.id}", "text": doc.text}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
    return written


def _timed(args: list[str], threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    started = time.perf_counter()
    proc = subprocess.run([DOCEMBED, "-q", *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise RuntimeError(f"docembed {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def run(n_docs: int, workers: int, local_threads: int, rows_per_shard: int | None) -> dict:
    import numpy as np
    import ray

    from docembed.io.embeddings import load_embeddings

    with tempfile.TemporaryDirectory(prefix="bench_ray_") as tmp:
        root = pathlib.Path(tmp)
        corpus = root / "docs.jsonl"
        n = build_corpus(corpus, n_docs)
        rows_per_shard = rows_per_shard or math.ceil(n / (4 * workers))  # 4 shards per worker: balance
        load_before = os.getloadavg()[0]
        local_seconds = _timed(
            ["encode", str(corpus), "-m", MODEL, "-o", str(root / "local.parquet")], local_threads
        )
        ray_args = ["encode", str(corpus), "-m", MODEL, "--engine", "ray", "--num-workers", str(workers)]
        ray_args += ["--rows-per-shard", str(rows_per_shard), "-o", str(root / "ray")]
        ray_seconds = _timed(ray_args, 1)  # the driver only plans and waits; each actor sets 1 thread itself
        load_after = os.getloadavg()[0]
        local, sharded = load_embeddings(str(root / "local.parquet")), load_embeddings(str(root / "ray"))
        manifest = json.loads((root / "ray" / "manifest.json").read_text())
    ids_identical = local.ids == sharded.ids
    difference = float(np.abs(local.data - sharded.data).max()) if ids_identical else None
    return {
        "data": f"first {n} texts of {', '.join(SOURCES)} (short sentences)",
        "docs": n,
        "model": MODEL,
        "batch_size": 32,
        "local": {
            "seconds": round(local_seconds, 2),
            "docs_per_s": round(n / local_seconds, 1),
            "processes": 1,
            "torch_threads": local_threads,
        },
        "ray": {
            "seconds": round(ray_seconds, 2),
            "docs_per_s": round(n / ray_seconds, 1),
            "workers": workers,
            "cpus_per_worker": 1,
            "rows_per_shard": rows_per_shard,
            "shards": manifest["num_shards"],
            "encode_seconds_per_worker": round(sum(s["seconds"] for s in manifest["shards"]) / workers, 2),
            "ray_version": ray.__version__,
        },
        "ratio_local_over_ray_time": round(local_seconds / ray_seconds, 3),
        "ids_identical": ids_identical,
        "max_abs_difference": difference,
        "outputs_identical": bool(ids_identical and difference is not None and difference <= TOLERANCE),
        "tolerance": TOLERANCE,
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": round(load_before, 2),
            "load_after": round(load_after, 2),
        },
    }


def main(out_dir: pathlib.Path, full: bool, **overrides) -> dict:
    """bench/run.py's entry point: 20,000 documents with --full, 2,000 otherwise."""
    workers = overrides.get("workers") or 2
    result = run(
        overrides.get("docs") or (20_000 if full else 2_000),
        workers,
        overrides.get("local_threads") or workers,
        overrides.get("rows_per_shard"),
    )
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ray.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(description="docembed encode: --engine ray vs the local engine.")
    parser.add_argument("--docs", type=int, default=20_000, help="documents to encode (default 20000)")
    parser.add_argument("--workers", type=int, default=2, help="Ray actors, 1 CPU each (default 2)")
    parser.add_argument(
        "--local-threads", type=int, help="torch threads of the local engine (default: --workers)"
    )
    parser.add_argument("--rows-per-shard", type=int, help="default: 4 shards per worker")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results")
    args = parser.parse_args()
    outcome = main(
        args.out,
        True,
        docs=args.docs,
        workers=args.workers,
        local_threads=args.local_threads,
        rows_per_shard=args.rows_per_shard,
    )
    print(json.dumps(outcome, indent=2))
    print(f"[bench] wrote {args.out / 'ray.json'}", file=sys.stderr)
