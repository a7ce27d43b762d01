"""Multi-vector search at scale (#46's goal): queries/s and recall@10 against exact mean-MaxSim, today's
index settings beside the settings chosen on validation queries, in the same run.

Input: a multi-vector embeddings file written by `docembed encode` (the goal's: the shipped `nugget` over
the 100,000 IMDB half-reviews of `bench_nugget_storage.py --corpus imdb-halves`). Queries are stored
documents (more like this, as `search --id` runs them, the document itself left out): a seeded sample of
`--queries` for validation, on which the settings are chosen, and a disjoint one for test, on which they
are reported. Exact top-10: docembed.scoring's mean-MaxSim of each query against every document, float32.

Rows, one thread, the index saved and loaded as the CLI does:
- `today`: `index build --type ivf --storage int8` with the search settings indexes had before they were
  recorded (nprobe = nlist / 8, 64 candidates per query vector, every document hit rescored);
- one row per (nprobe, candidates, rescore) of the sweep on validation queries (rescore: the documents
  rescored exactly, those whose hits promise the highest mean-MaxSim);
- `chosen`: the fastest sweep setting whose validation recall@10 is >= `--target`, on the test queries,
  against `today` on the same test queries;
- `pooled_first_stage` (validation): the recall@10 exact MaxSim would reach over the top-C documents by the
  cosine of their mean vectors (an exact pooled search: the ceiling of any ANN over one vector a document,
  the design a table store such as Lance could search), for several C.
Bytes per document: the index folder on disk / documents. Writes `--out` (summary only).

    .venv/bin/docembed encode imdb-halves.jsonl -m nugget --precision int8 -o nugget.npz
    .venv/bin/python bench/bench_multivector.py nugget.npz      # -> bench/results/multivector.json
    .venv/bin/python bench/run.py --only multivector            # encodes the first 10,000 halves first
                                                                # (--quick 2,000; --full all 100,000)
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"  # before numpy or faiss start their thread pools

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

BENCH_DIR = pathlib.Path(__file__).resolve().parent
OUT = BENCH_DIR / "results" / "multivector.json"
K = 10
SWEEP_NPROBE = (2, 4, 8, 16)
SWEEP_CANDIDATES = (64, 128, 256, 512)
SWEEP_RESCORE = (100, 200, 400)


def exact_top(embeddings, rows: np.ndarray) -> list[list[str]]:
    """The exact top-K ids (mean-MaxSim, float32) of each stored document of `rows`, itself left out."""
    from docembed.scoring import maxsim_one_to_many
    from docembed.types import l2_normalize

    multi = embeddings.data
    docs = type(multi)(l2_normalize(multi.vectors.astype(np.float32)), multi.offsets)
    found = []
    for row in rows:
        scores = maxsim_one_to_many(docs[row], docs)
        scores[row] = -np.inf
        found.append([embeddings.ids[j] for j in np.argsort(-scores, kind="stable")[:K]])
    return found


def timed_search(index, ids: list[str], **settings) -> tuple[float, list[list[str]]]:
    """(queries/s, top-K ids) of one search call over the stored vectors of `ids`, as `search --id`."""
    from docembed.types import concat_vectors

    queries = concat_vectors([index.stored(doc_id) for doc_id in ids])
    index.search(queries.select([0]), K + 1, **settings)  # warm: the direct map, caches
    started = time.perf_counter()
    hits = index.search(queries, K + 1, **settings)
    seconds = time.perf_counter() - started
    top = [[doc for doc, _ in found if doc != doc_id][:K] for doc_id, found in zip(ids, hits, strict=True)]
    return len(ids) / seconds, top


def pooled_ceiling(embeddings, rows: np.ndarray, exact: list[list[str]], depths=(50, 100, 200, 500, 1000)):
    """recall@10 of exact MaxSim over the top-C documents by mean-vector cosine, per C (`depths`)."""
    from docembed.scoring import maxsim_one_to_many
    from docembed.types import MultiVectors, l2_normalize

    multi = embeddings.data
    docs = MultiVectors(l2_normalize(multi.vectors.astype(np.float32)), multi.offsets)
    pooled = l2_normalize(docs.mean())
    found = {depth: [] for depth in depths}
    for row in rows:
        order = np.argsort(-(pooled @ pooled[row]), kind="stable")
        order = order[order != row]
        for depth in depths:
            top = order[:depth]
            scores = maxsim_one_to_many(docs[row], docs.select(top))
            found[depth].append([embeddings.ids[top[j]] for j in np.argsort(-scores, kind="stable")[:K]])
    return {str(depth): round(recall(found[depth], exact), 4) for depth in depths}


def recall(found: list[list[str]], exact: list[list[str]]) -> float:
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found, exact, strict=True)]))


def encode_halves(folder: pathlib.Path, documents: int) -> pathlib.Path:
    """The first `documents` IMDB half-reviews (bench_nugget_storage's corpus) encoded by the shipped
    nugget through the CLI, as the goal's 100,000 were (int8 inference)."""
    import subprocess
    import sys

    sys.path.insert(0, str(BENCH_DIR))
    from bench_nugget_storage import corpus_texts

    folder.mkdir(parents=True, exist_ok=True)
    corpus, output = folder / "halves.jsonl", folder / f"nugget-{documents}.npz"
    if not output.exists():
        texts = corpus_texts("imdb-halves", 0)[:documents]
        corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
        docembed_cli = str(pathlib.Path(sys.executable).with_name("docembed"))
        command = [docembed_cli, "-q", "encode", str(corpus), "-m", "nugget", "--precision", "int8"]
        subprocess.run([*command, "-o", str(output)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return output


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    quick: bool = False,
    embeddings_path: str | None = None,
    queries: int = 100,
    target: float = 0.95,
    out: pathlib.Path = OUT,
    limit: int | None = None,
) -> dict:
    import docembed
    from docembed.faiss_index import VectorIndex

    if embeddings_path is None:
        documents = 2_000 if quick else 100_000 if full else 10_000
        folder = pathlib.Path(out_dir or tempfile.mkdtemp(prefix="bench-multivector-"))
        embeddings_path = str(encode_halves(folder, documents))
        queries = min(queries, 50) if quick else queries
    path = embeddings_path
    embeddings = docembed.load_embeddings(path)
    if limit:
        embeddings = docembed.EmbeddingSet(
            embeddings.data.select(np.arange(limit)), embeddings.ids[:limit], embeddings.metadata
        )
    rng = np.random.default_rng(0)
    sample = rng.choice(len(embeddings), 2 * queries, replace=False)
    validation, test = sample[:queries], sample[queries:]
    started = time.perf_counter()
    # the exact rankings take minutes: kept beside the embeddings for the next run
    cache = pathlib.Path(f"{path}.exact-top{K}-{queries}-{limit or len(embeddings)}.json")
    if cache.exists():
        exact = json.loads(cache.read_text())
    else:
        exact = {"validation": exact_top(embeddings, validation), "test": exact_top(embeddings, test)}
        cache.write_text(json.dumps(exact))
    exact_seconds = time.perf_counter() - started
    ids = {"validation": [embeddings.ids[r] for r in validation], "test": [embeddings.ids[r] for r in test]}

    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench-multivector-")) / "e.index"
    started = time.perf_counter()
    VectorIndex.build(embeddings, "ivf", "int8").save(folder)
    build_seconds = time.perf_counter() - started
    index_bytes = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    index = VectorIndex.load(folder)
    nlist = index.nlist
    today = {"nprobe": max(1, nlist // 8), "candidates": 64, "rescore": 0}

    def row(split: str, **settings) -> dict:
        qps, top = timed_search(index, ids[split], **settings)
        return {
            **settings,
            "queries_per_s": round(qps, 2),
            "recall_at_10": round(recall(top, exact[split]), 4),
        }

    sweep = [
        row("validation", nprobe=nprobe, candidates=candidates, rescore=rescore)
        for nprobe in SWEEP_NPROBE
        for candidates in SWEEP_CANDIDATES
        for rescore in SWEEP_RESCORE
    ]
    good = [r for r in sweep if r["recall_at_10"] >= target]
    best = (
        max(good, key=lambda r: r["queries_per_s"]) if good else max(sweep, key=lambda r: r["recall_at_10"])
    )
    chosen = {key: best[key] for key in ("nprobe", "candidates", "rescore")}
    result = {
        "setup": {
            "embeddings": str(path),
            "model": embeddings.metadata.get("model"),
            "documents": len(embeddings),
            "vectors_per_doc": round(len(embeddings.data.vectors) / len(embeddings), 2),
            "queries": {"validation": queries, "test": queries, "seed": 0},
            "index": "ivf int8",
            "nlist": nlist,
            "threads": 1,
            "exact_seconds": round(exact_seconds, 1),
            "build_seconds": round(build_seconds, 1),
            "index_bytes_per_doc": round(index_bytes / len(embeddings)),
            "target_recall": target,
            "load_average": list(os.getloadavg()),
        },
        "validation_sweep": sweep,
        "pooled_first_stage": pooled_ceiling(embeddings, validation, exact["validation"]),
        "test": {"today": row("test", **today), "chosen": row("test", **chosen)},
    }
    result["test"]["speedup"] = round(
        result["test"]["chosen"]["queries_per_s"] / result["test"]["today"]["queries_per_s"], 2
    )
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["test"], indent=1))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "embeddings", nargs="?", help="multi-vector embeddings (default: encode 10,000 halves)"
    )
    parser.add_argument("--queries", type=int, default=100, help="queries per split (validation, test)")
    parser.add_argument("--target", type=float, default=0.95, help="recall@10 the chosen setting must reach")
    parser.add_argument("--limit", type=int, default=None, help="only the first N documents")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    main(
        None,
        embeddings_path=args.embeddings,
        queries=args.queries,
        target=args.target,
        out=args.out,
        limit=args.limit,
    )
