"""Paragraph Vector throughput: training words/s with 1 and 2 gensim threads, inference docs/s with 1 and 2
encode processes, on 20 Newsgroups (train for training, test for inference).

Quick run (default): PV-DBOW (dbow_words), 100-d, 5 epochs, the first 3,000 training documents and 500
test documents. `full=True`: all 11,314 training documents, 1,000 test documents, same model settings.
The machine may be shared: the load average before and after is recorded with the figures.

    .venv/bin/python bench/bench_pv.py [--full] [--out DIR]
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import platform
import resource
import sys
import time

import numpy as np

from docembed import datasets
from docembed.models.paragraph_vector import PVConfig, tokenize, train_paragraph_vectors


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Head:
    """The first `limit` documents of a re-iterable stream, itself re-iterable (training reads it often)."""

    def __init__(self, documents, limit: int | None):
        self.documents, self.limit = documents, limit

    def __iter__(self):
        return itertools.islice(iter(self.documents), self.limit)


def main(out_dir: pathlib.Path, full: bool = False) -> dict:
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_docs = None if full else 3000
    infer_docs = 1000 if full else 500
    settings = {"mode": "dbow", "vector_size": 100, "epochs": 5, "min_count": 2, "window": 10, "negative": 5}
    corpus = _Head(datasets.documents("20newsgroups/train"), train_docs)
    texts = list(datasets.iter_texts("20newsgroups/test", limit=infer_docs))
    result: dict = {
        "data": {
            "train": "20newsgroups/train" + ("" if full else f" (first {train_docs} docs)"),
            "infer": f"20newsgroups/test (first {infer_docs} docs)",
            "infer_tokens": sum(len(tokenize(t)) for t in texts),
        },
        "model": {**settings, "dbow_words": True, "sample": 1e-4, "infer_epochs": settings["epochs"]},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": os.getloadavg(),
        },
        "training": {},
        "inference": {},
    }
    model = None
    for workers in (1, 2):
        config = PVConfig(**settings, workers=workers, seed=0)
        model, stats = train_paragraph_vectors(corpus, config)
        (entry,) = stats
        result["training"][f"workers={workers}"] = entry.to_dict()
    reference = None
    for workers in (1, 2):
        model.set_workers(workers)
        cpu_before = _cpu_seconds()
        started = time.perf_counter()
        vectors = model.encode(texts)
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu_before
        reference = vectors if reference is None else reference
        result["inference"][f"workers={workers}"] = {
            "docs": len(texts),
            "seconds": round(seconds, 3),
            "docs_per_s": round(len(texts) / seconds, 1),
            "cpu_seconds": round(cpu, 3),  # this process + its finished worker processes
            "docs_per_cpu_s": round(len(texts) / cpu, 1),
            "identical_to_1_worker": bool(np.array_equal(vectors, reference)),
        }
    train = result["training"]
    infer = result["inference"]
    result["speedup"] = {
        "training_2_vs_1": round(train["workers=2"]["words_per_s"] / train["workers=1"]["words_per_s"], 2),
        "inference_2_vs_1": round(infer["workers=2"]["docs_per_s"] / infer["workers=1"]["docs_per_s"], 2),
    }
    result["machine"]["load_after"] = os.getloadavg()
    (out_dir / "bench_pv.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    json.dump(main(pathlib.Path(args.out), args.full), sys.stdout, indent=2)
    print()
