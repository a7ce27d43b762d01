"""Speed, as ratios measured side by side in one process on the same inputs:

- static: the `static` model vs `sbert` and `glove-avg` through `docembed.load(...).encode`, same reviews;
- encode: docembed's encode path (`encode_documents` with the `sbert` zoo model, what `docembed encode`
  runs) vs sentence-transformers' `SentenceTransformer.encode` called directly; same MiniLM weights, same
  texts (IMDB train reviews), same batch size 32;
- workers: `docembed encode --workers N` (N processes, one thread each) vs one process with torch's
  intra-op threads, docs/s after start-up (`bench_workers`);
- MaxSim: `docembed.scoring.maxsim_pairs` (batched) vs a per-pair Python loop (numpy) vs
  `sentence_transformers.util.mean_maxsim_pairwise`, and the one-query-vs-many form
  (`maxsim_one_to_many` vs `util.mean_maxsim`), on token-vector sets of realistic sizes (random unit
  vectors, 384-d, 32..256 vectors per text);
- search: faiss `IndexFlatIP` (through `docembed.index.VectorIndex`) vs numpy exact top-k (matrix product
  + argpartition) on 100k unit vectors, 384-d, 10 nearest for each of 1,000 queries.

PV inference with 1 vs 2 processes is measured by bench/bench_pv.py. Each timing is the best of `repeats`
runs after a warm-up; peak memory is the largest resident-set growth seen by a 2 ms sampler during the
call (the process's own memory; worker processes are not included).

    .venv/bin/python bench/bench_speed.py [--full] [--out DIR]
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import threading
import time

import numpy as np

SIZES = {
    False: {
        "encode_texts": 256,
        "workers_texts": 500,
        "maxsim_pairs": 500,
        "maxsim_docs": 2000,
        "search_vectors": 100_000,
        "search_queries": 1000,
        "repeats": 2,
    },
    True: {
        "encode_texts": 2048,
        "workers_texts": 2000,
        "maxsim_pairs": 4000,
        "maxsim_docs": 10000,
        "search_vectors": 100_000,
        "search_queries": 10000,
        "repeats": 3,
    },
}


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(fn, repeats: int, warmup=None):
    """(best seconds, peak RSS growth in MiB, last result) of `fn()` after one warm-up call (`warmup()`, or
    `fn()` itself when none is given)."""
    (warmup or fn)()
    best, peak, result = float("inf"), 0, None
    for _ in range(repeats):
        baseline = _rss()
        top = [baseline]
        done = threading.Event()

        def sample(top=top, done=done):
            while not done.is_set():
                top[0] = max(top[0], _rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
        best = min(best, seconds)
        peak = max(peak, top[0] - baseline)
    return best, peak / 2**20, result


def _row(name: str, seconds: float, peak_mib: float, items: int, unit: str) -> dict:
    return {
        "method": name,
        "seconds": round(seconds, 4),
        f"{unit}_per_s": round(items / seconds, 1),
        "peak_rss_growth_mib": round(peak_mib, 1),
    }


def bench_encode(n_texts: int, repeats: int) -> dict:
    from sentence_transformers import SentenceTransformer

    from docembed import datasets
    from docembed.encoding import encode_documents
    from docembed.io.readers import Document
    from docembed.models.offline import minilm_path
    from docembed.models.registry import load_model

    texts = list(datasets.iter_texts("imdb/train", limit=n_texts))
    documents = [Document(str(i), t) for i, t in enumerate(texts)]
    ours = load_model("sbert")
    ours.set_long_documents("truncate")  # one pass over 256 tokens, as SentenceTransformer.encode reads
    theirs = SentenceTransformer(str(minilm_path()), device="cpu")

    def run_ours():
        return encode_documents(ours, documents, batch_size=32).data

    def run_theirs():
        return theirs.encode(
            texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )

    # warm-up on a few texts only: the model's first call pays for lazy initialisation, not the texts
    t_ours, m_ours, v_ours = measure(run_ours, repeats, lambda: ours.encode(texts[:8], batch_size=32))
    t_theirs, m_theirs, v_theirs = measure(
        run_theirs, repeats, lambda: theirs.encode(texts[:8], batch_size=32)
    )
    return {
        "data": f"imdb/train, first {len(texts)} reviews, batch size 32, all-MiniLM-L6-v2 (256 tokens)",
        "rows": [
            _row("docembed encode_documents(sbert)", t_ours, m_ours, len(texts), "docs"),
            _row("SentenceTransformer.encode", t_theirs, m_theirs, len(texts), "docs"),
        ],
        "ratio_docembed_over_st_time": round(t_ours / t_theirs, 3),
        "max_abs_difference": float(np.abs(v_ours - v_theirs).max()),
    }


def bench_static(n_texts: int, repeats: int) -> dict:
    """The `static` model (a table lookup per token, every token read) against `sbert` (MiniLM, 256 tokens)
    and `glove-avg`, through the public API on the same IMDB reviews, whatever threads torch has."""
    import docembed
    from docembed import datasets

    texts = list(datasets.iter_texts("imdb/train", limit=n_texts))
    rows, seconds = [], {}
    for name in ("static", "glove-avg", "sbert"):
        options = {"long_documents": "truncate"} if name == "sbert" else {}
        model = docembed.load(name, device="cpu", **options)
        t, m, _ = measure(
            lambda model=model: model.encode(texts, batch_size=32),
            repeats,
            lambda model=model: model.encode(texts[:8]),
        )
        seconds[name] = t
        rows.append(_row(f"docembed.load({name!r}).encode", t, m, len(texts), "docs"))
    return {
        "data": f"imdb/train, first {len(texts)} reviews (static and glove-avg read every token, sbert 256)",
        "rows": rows,
        "ratio_sbert_over_static_time": round(seconds["sbert"] / seconds["static"], 1),
        "ratio_glove_over_static_time": round(seconds["glove-avg"] / seconds["static"], 2),
    }


# `docembed encode --workers/--threads` settings compared by bench_workers: (row label, CLI options)
WORKER_SETTINGS = (
    ("1 process x 1 thread", ("--workers", "1")),
    ("2 processes x 1 thread", ("--workers", "2")),
    ("1 process x 2 threads (torch intra-op)", ("--threads", "2")),
)


def bench_workers(n_texts: int, model: str = "sbert") -> dict:
    """`docembed encode --workers N` (N processes, one thread each) beside torch's own intra-op threads, on
    IMDB train reviews, through the command itself. A run's wall time includes loading the model and
    starting the workers, so each setting also encodes 8 reviews: docs/s after start-up is
    (n - 8) / (wall(n) - wall(8)), the rate a long input sees."""
    import subprocess
    import tempfile

    from docembed import datasets

    texts = list(datasets.iter_texts("imdb/train", limit=n_texts))
    command = [str(pathlib.Path(sys.executable).with_name("docembed")), "-q", "encode"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as scratch:
        inputs = {}
        for count in (8, len(texts)):
            inputs[count] = pathlib.Path(scratch, f"imdb{count}.jsonl")
            lines = (json.dumps({"id": str(i), "text": t}) for i, t in enumerate(texts[:count]))
            inputs[count].write_text("\n".join(lines) + "\n", encoding="utf-8")

        def wall(count: int, options: tuple[str, ...]) -> float:
            output = pathlib.Path(scratch, "out.npy")
            started = time.perf_counter()
            subprocess.run(
                [*command, str(inputs[count]), "-m", model, "--long", "truncate", "-o", str(output)]
                + ["--overwrite", *options],
                check=True,
                capture_output=True,
            )
            return time.perf_counter() - started

        for label, options in WORKER_SETTINGS:
            start_up, whole = wall(8, options), wall(len(texts), options)
            rows.append(
                {
                    "setting": label,
                    "options": " ".join(options),
                    "wall_s": round(whole, 2),
                    "start_up_wall_s": round(start_up, 2),
                    "docs_per_s_end_to_end": round(len(texts) / whole, 1),
                    "docs_per_s_after_start_up": round((len(texts) - 8) / max(whole - start_up, 1e-9), 1),
                }
            )
    single = rows[0]["docs_per_s_after_start_up"]
    for row in rows:
        row["speed_up_after_start_up"] = round(row["docs_per_s_after_start_up"] / single, 2)
    return {
        "data": f"imdb/train, first {len(texts)} reviews, `docembed encode -m {model} --long truncate`, "
        f"batch size 32; {os.cpu_count()} CPUs",
        "load_average_after": os.getloadavg(),  # other work on the machine takes cores from the workers
        "rows": rows,
    }


def _token_sets(n: int, rng: np.random.Generator, dim: int = 384):
    from docembed.types import MultiVectors, l2_normalize

    lengths = rng.integers(32, 257, size=n)
    vectors = l2_normalize(rng.standard_normal((int(lengths.sum()), dim)).astype(np.float32))
    return MultiVectors(vectors, np.concatenate([[0], np.cumsum(lengths)]))


def bench_maxsim(n_pairs: int, n_docs: int, repeats: int) -> dict:
    import torch
    from sentence_transformers import util

    from docembed.scoring import maxsim_one_to_many, maxsim_pairs

    rng = np.random.default_rng(0)
    queries, docs = _token_sets(n_pairs, rng), _token_sets(n_pairs, rng)
    q_list = [torch.from_numpy(queries[i]) for i in range(len(queries))]
    d_list = [torch.from_numpy(docs[i]) for i in range(len(docs))]

    def python_loop():
        return np.array([float((queries[i] @ docs[i].T).max(axis=1).mean()) for i in range(len(queries))])

    def st_pairwise():
        return util.mean_maxsim_pairwise(q_list, d_list).numpy()

    t_ours, m_ours, s_ours = measure(lambda: maxsim_pairs(queries, docs), repeats)
    t_loop, m_loop, s_loop = measure(python_loop, repeats)
    t_st, m_st, s_st = measure(st_pairwise, repeats)

    pool = _token_sets(n_docs, rng)
    query = _token_sets(1, rng)[0]
    pool_list = [torch.from_numpy(pool[i]) for i in range(len(pool))]
    t_one, m_one, s_one = measure(lambda: maxsim_one_to_many(query, pool), repeats)
    t_st1, m_st1, s_st1 = measure(
        lambda: util.mean_maxsim(torch.from_numpy(query), pool_list).numpy()[0], repeats
    )
    return {
        "data": f"{n_pairs} aligned pairs and 1 query vs {n_docs} docs; random unit vectors, 384-d, "
        "32..256 vectors per text",
        "pairs": [
            _row("docembed scoring.maxsim_pairs", t_ours, m_ours, n_pairs, "pairs"),
            _row("per-pair Python loop (numpy)", t_loop, m_loop, n_pairs, "pairs"),
            _row("sentence_transformers.util.mean_maxsim_pairwise", t_st, m_st, n_pairs, "pairs"),
        ],
        "one_to_many": [
            _row("docembed scoring.maxsim_one_to_many", t_one, m_one, n_docs, "docs"),
            _row("sentence_transformers.util.mean_maxsim", t_st1, m_st1, n_docs, "docs"),
        ],
        "ratio_loop_over_docembed_time": round(t_loop / t_ours, 2),
        "ratio_st_over_docembed_time_pairs": round(t_st / t_ours, 2),
        "ratio_st_over_docembed_time_one_to_many": round(t_st1 / t_one, 2),
        "max_abs_difference": float(
            max(np.abs(s_ours - s_loop).max(), np.abs(s_ours - s_st).max(), np.abs(s_one - s_st1).max())
        ),
    }


def bench_search(n_vectors: int, n_queries: int, k: int, repeats: int) -> dict:
    from docembed.faiss_index import VectorIndex
    from docembed.types import EmbeddingSet, l2_normalize

    rng = np.random.default_rng(0)
    base = l2_normalize(rng.standard_normal((n_vectors, 384)).astype(np.float32))
    queries = l2_normalize(rng.standard_normal((n_queries, 384)).astype(np.float32))
    started = time.perf_counter()
    index = VectorIndex.build(EmbeddingSet(base, [str(i) for i in range(n_vectors)]), "flat")
    build_seconds = time.perf_counter() - started

    def faiss_search():
        return index.index.search(queries, k)[1]

    def numpy_topk():
        out = np.empty((n_queries, k), dtype=np.int64)
        for start in range(0, n_queries, 256):
            scores = queries[start : start + 256] @ base.T
            top = np.argpartition(-scores, k, axis=1)[:, :k]
            order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
            out[start : start + 256] = np.take_along_axis(top, order, axis=1)
        return out

    t_faiss, m_faiss, r_faiss = measure(faiss_search, repeats)
    t_np, m_np, r_np = measure(numpy_topk, repeats)
    same = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(r_faiss, r_np, strict=True)]))
    return {
        "data": f"{n_vectors} random unit vectors, 384-d; {n_queries} queries, top-{k}",
        "rows": [
            _row("faiss IndexFlatIP (docembed.index)", t_faiss, m_faiss, n_queries, "queries"),
            _row("numpy matmul + argpartition", t_np, m_np, n_queries, "queries"),
        ],
        "faiss_build_seconds": round(build_seconds, 3),
        "ratio_numpy_over_faiss_time": round(t_np / t_faiss, 2),
        "top_k_overlap": same,
    }


def main(out_dir: pathlib.Path, full: bool = False) -> dict:
    import torch

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = SIZES[bool(full)]
    result = {
        "sizes": sizes,
        "threads": {"torch": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "load_before": os.getloadavg(),
        "encode": bench_encode(sizes["encode_texts"], sizes["repeats"]),
        "static": bench_static(sizes["encode_texts"], sizes["repeats"]),
        "workers": bench_workers(sizes["workers_texts"]),
        "maxsim": bench_maxsim(sizes["maxsim_pairs"], sizes["maxsim_docs"], sizes["repeats"]),
        "search": bench_search(sizes["search_vectors"], sizes["search_queries"], 10, sizes["repeats"]),
        "pv_inference": "see bench_pv (inference docs/s with 1 and 2 encode processes)",
    }
    result["load_after"] = os.getloadavg()
    (out_dir / "bench_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    json.dump(main(pathlib.Path(args.out), args.full), sys.stdout, indent=2)
    print()
