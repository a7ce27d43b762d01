"""faiss (today's VectorIndex) vs LanceDB (docembed.lance_index) as the store of a collection (#46).

Synthetic data, seeded: random unit vectors, 100,000 dense 384-d documents and 20,000 multi-vector documents
of 10-20 vectors (15 on average) of 384-d; queries are random unit vectors (multi-vector queries: 8 each).
Random directions are the hardest case for approximate indexes (no clusters), so recall here is a floor.
One thread (OMP, faiss, LANCE_CPU_THREADS), in this process, through the Python API both stores offer the CLI:
- build: embeddings in memory -> the index on disk (faiss: build + save; Lance: table + id B-tree + vector
  index), seconds and bytes on disk;
- search: the index opened from disk, one warm-up query, then every query in the CLI's batches; queries/s
  (wall) and the CPU seconds, recall@10 against exact search (numpy / docembed.scoring's mean-MaxSim);
- filtered search (Lance, a prefilter keeping 10 % / 1 % of the rows) against unfiltered;
- add 1 % vs rebuild at 101 % (flat; Lance's add is one commit, its compaction folds the rows in).
Multi-vector: faiss flat (today's: every vector indexed, candidates rescored) and Lance flat (its MaxSim
over every document); Lance's multivector IVF_PQ only with --quick (its build is ~10 min at full size).
Writes bench/results/lance.json (summary only); a --quick run writes only to the folder it is given.

    .venv/bin/python bench/bench_lance.py --quick     # 10,000 dense, 2,000 multi-vector documents
    .venv/bin/python bench/bench_lance.py             # the sizes above

Real vectors (--dense FILE, a dense `docembed encode` output): the dense cases only, over FILE's documents
less 200 seeded ones that become the queries (document vectors as queries: more like this, as `search
--id`), each approximate kind at the settings docembed records at build and, for the faiss HNSW row the
goal names, the recall it reaches. Writes bench/results/lance_dense.json.

    .venv/bin/python bench/bench_lance.py --dense static-imdb-halves.npy

A million documents (--million, synthetic): 1,000,000 384-d vectors drawn around 2,000 seeded centres (so
that an approximate index has structure to find, unlike uniform directions), 200 fresh queries from the same
mixture; the Lance table built as `index build --store lance -t ivf_pq` builds it: build seconds, bytes on
disk, queries/s and recall@10 against exact search, and the flat table's queries/s beside it. Writes
bench/results/lance_million.json.

    .venv/bin/python bench/bench_lance.py --million
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LANCE_CPU_THREADS"):
    os.environ[_name] = "1"  # before numpy, faiss or lancedb start their thread pools

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

BENCH_DIR = pathlib.Path(__file__).resolve().parent
K = 10
NPROBES_SWEEP = (20, 50, 100, 200)
EF_SWEEP = (128, 256, 512, 1024, 2048)  # up to the list recall@10 0.99 needs, if any


def _unit(rng, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _bytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _clock():
    return time.perf_counter(), time.process_time()


def _since(start) -> tuple[float, float]:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _recall(found: list[list[tuple[str, float]]], exact: list[list[str]]) -> float:
    return float(
        np.mean([len({i for i, _ in f} & set(e)) / len(e) for f, e in zip(found, exact, strict=True)])
    )


def _timed_search(search, queries, batch: int, count: int):
    """Every query through `search` in batches of `batch` (the CLI's 256), after one warm-up query."""
    search(queries[:1] if not hasattr(queries, "select") else queries.select([0]))
    start, found = _clock(), []
    for lo in range(0, count, batch):
        part = (
            queries[lo : lo + batch]
            if not hasattr(queries, "select")
            else queries.select(range(lo, min(lo + batch, count)))
        )
        found.extend(search(part))
    wall, cpu = _since(start)
    return found, {"queries_per_s": round(count / wall, 2), "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}


def _searched_row(index, build, folder: pathlib.Path, queries, exact, batch: int) -> dict:
    """A built index's row: build seconds, bytes on disk, its search's speed and recall@10."""
    found, speed = _timed_search(lambda q: index.search(q, K), queries, batch, len(exact))
    return {
        "build_s": round(build[0], 2),
        "bytes": _bytes(folder),
        **speed,
        "recall@10": _recall(found, exact),
    }


def _faiss_case(emb, kind: str, folder: pathlib.Path, queries, exact, batch: int) -> dict:
    from docembed.faiss_index import VectorIndex

    start = _clock()
    VectorIndex.build(emb, kind).save(folder)
    build = _since(start)
    index = VectorIndex.load(folder)
    row = _searched_row(index, build, folder, queries, exact, batch)
    if kind == "hnsw" and not emb.is_multi:  # the graph's candidate list (docembed builds with 128)
        row["ef_search_sweep"] = {}
        for ef in EF_SWEEP:
            index.index.hnsw.efSearch = ef  # the faiss object VectorIndex searches
            swept, speed = _timed_search(lambda q: index.search(q, K), queries, batch, len(exact))
            row["ef_search_sweep"][str(ef)] = {**speed, "recall@10": _recall(swept, exact)}
            _log(f"    efSearch {ef}: {row['ef_search_sweep'][str(ef)]}")
    return row


def _lance_case(emb, kind: str, folder: pathlib.Path, queries, exact, batch: int, fields=None) -> dict:
    from docembed.lance_index import LanceIndex

    start = _clock()
    LanceIndex.build(folder, emb, kind, fields=fields)
    build = _since(start)
    index = LanceIndex.open(folder)
    row = _searched_row(index, build, folder, queries, exact, batch)
    row["search_settings"] = index.metadata.get("search", {})
    if kind != "flat" and not emb.is_multi:  # what more probed lists buy (LanceDB's default nprobes is 20)
        row["nprobes_sweep"] = {}
        for nprobes in NPROBES_SWEEP:
            swept, speed = _timed_search(
                lambda q, n=nprobes: index.search(q, K, nprobes=n), queries, batch, len(exact)
            )
            row["nprobes_sweep"][str(nprobes)] = {**speed, "recall@10": _recall(swept, exact)}
            _log(f"    nprobes {nprobes}: {row['nprobes_sweep'][str(nprobes)]}")
    return row


def _filtered(folder: pathlib.Path, queries, count: int, buckets: np.ndarray) -> dict:
    """Lance search with a prefilter on `bucket` (0..99 per row) keeping 10 % and 1 % of the rows; the
    recall of each against the exact top 10 among the rows the filter keeps."""
    from docembed.lance_index import LanceIndex

    index = LanceIndex.open(folder)
    rows = {}
    for share, where in ((1.0, None), (0.1, "bucket < 10"), (0.01, "bucket < 1")):
        found, speed = _timed_search(lambda q, w=where: index.search(q, K, where=w), queries, 256, count)
        keep = np.flatnonzero(buckets < share * 100)
        rows[f"{share:g}"] = {"where": where, **speed, "rows_kept": int(len(keep))}
        rows[f"{share:g}"]["all_hits_pass"] = all(
            buckets[int(i[1:])] < share * 100 for hits in found for i, _ in hits
        )
    return rows


def _dense_rows(emb, queries, exact, buckets: np.ndarray, tmp: pathlib.Path) -> dict:
    """Every dense case over `emb` (faiss flat and hnsw, Lance flat, ivf_pq and ivf_hnsw_sq), and for the
    Lance flat and ivf_pq tables, which hold a bucket field (0..99, `buckets` by row), the filtered searches
    against the unfiltered one."""
    ids = emb.ids
    fields = {"bucket": {ids[i]: int(buckets[i]) for i in range(len(ids))}}
    cases = {
        "faiss flat": lambda f: _faiss_case(emb, "flat", f, queries, exact, 256),
        "faiss hnsw": lambda f: _faiss_case(emb, "hnsw", f, queries, exact, 256),
        "lance flat": lambda f: _lance_case(emb, "flat", f, queries, exact, 256, fields),
        "lance ivf_pq": lambda f: _lance_case(emb, "ivf_pq", f, queries, exact, 256, fields),
        "lance ivf_hnsw_sq": lambda f: _lance_case(emb, "ivf_hnsw_sq", f, queries, exact, 256),
    }
    rows = {}
    for name, case in cases.items():
        folder = tmp / name.replace(" ", "-")
        _log(f"dense {name}")
        rows[name] = case(folder)
        _log(f"  {rows[name]}")
        if name in ("lance flat", "lance ivf_pq"):
            rows[f"{name} filtered"] = _filtered(folder, queries, len(exact), buckets)
            _log(f"  {rows[f'{name} filtered']}")
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _add_vs_rebuild(emb_all, n: int, extra: int, tmp: pathlib.Path, kind: str) -> dict:
    from docembed.faiss_index import VectorIndex
    from docembed.lance_index import LanceIndex
    from docembed.types import EmbeddingSet

    base = EmbeddingSet(emb_all.data[:n], emb_all.ids[:n], emb_all.metadata)
    more = EmbeddingSet(emb_all.data[n : n + extra], emb_all.ids[n : n + extra], emb_all.metadata)
    rows = {}
    faiss_dir = tmp / f"faiss-add-{kind}"
    VectorIndex.build(base, kind).save(faiss_dir)
    start = _clock()
    VectorIndex.append_saved(faiss_dir, more)
    rows["faiss_add_s"] = round(_since(start)[0], 3)
    start = _clock()
    VectorIndex.build(emb_all, kind).save(tmp / f"faiss-rebuild-{kind}")
    rows["faiss_rebuild_s"] = round(_since(start)[0], 3)
    lance_kind = {"flat": "flat", "hnsw": "ivf_hnsw_sq"}[kind]
    lance_dir = tmp / f"lance-add-{kind}"
    LanceIndex.build(lance_dir, base, lance_kind)
    start = _clock()
    LanceIndex.open(lance_dir).add(more)
    rows["lance_add_s"] = round(_since(start)[0], 3)
    start = _clock()
    LanceIndex.open(lance_dir).compact()  # the new rows into the vector index
    rows["lance_compact_after_add_s"] = round(_since(start)[0], 3)
    start = _clock()
    LanceIndex.build(tmp / f"lance-rebuild-{kind}", emb_all, lance_kind)
    rows["lance_rebuild_s"] = round(_since(start)[0], 3)
    for name in ("faiss-add", "faiss-rebuild", "lance-add", "lance-rebuild"):
        shutil.rmtree(tmp / f"{name}-{kind}", ignore_errors=True)
    return rows


def _log(message: str) -> None:
    print(f"[bench_lance] {message}", file=sys.stderr, flush=True)


def dense_on_file(path: str, nq: int = 200) -> dict:
    """The dense cases over real vectors: `path`'s rows less `nq` seeded ones, which are the queries."""
    import faiss
    import lancedb  # noqa: F401

    import docembed
    from docembed.types import EmbeddingSet, l2_normalize

    faiss.omp_set_num_threads(1)
    loaded = docembed.load_embeddings(path)
    x = l2_normalize(np.asarray(loaded.data, dtype=np.float32))
    rng = np.random.default_rng(46)
    held_out = np.zeros(len(x), dtype=bool)
    held_out[rng.choice(len(x), nq, replace=False)] = True
    docs, queries = x[~held_out], x[held_out]
    ids = [f"d{i}" for i in range(len(docs))]  # row numbers: the filtered cases read buckets by them
    emb = EmbeddingSet(docs, ids, loaded.metadata)
    exact = [[ids[j] for j in np.argsort(-row)[:K]] for row in queries @ docs.T]
    result = {
        "data": f"{path}: {loaded.metadata.get('model')} vectors, {x.shape[1]}-d",
        "queries_are": f"{nq} seeded documents held out of the index",
        "threads": 1,
        "k": K,
        "documents": len(ids),
        "queries": nq,
        "load_average": list(os.getloadavg()),
    }
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_lance_dense"))
    try:
        result.update(_dense_rows(emb, queries, exact, rng.integers(0, 100, size=len(ids)), tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (BENCH_DIR / "results" / "lance_dense.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _mixture(rng, centres: np.ndarray, n: int, spread: float = 0.6, block: int = 100_000) -> np.ndarray:
    """`n` unit vectors, each a random centre plus Gaussian noise of `spread` per unit length."""
    out = np.empty((n, centres.shape[1]), dtype=np.float32)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        picked = centres[rng.integers(0, len(centres), hi - lo)]
        noise = rng.standard_normal(picked.shape, dtype=np.float32) * (spread / np.sqrt(centres.shape[1]))
        x = picked + noise
        out[lo:hi] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def million(n: int = 1_000_000, nq: int = 200, dim: int = 384) -> dict:
    """Lance ivf_pq (and flat) over a million synthetic documents: build, bytes, queries/s, recall@10."""
    import lancedb  # noqa: F401

    from docembed.types import EmbeddingSet

    rng = np.random.default_rng(46)
    centres = _unit(rng, 2000, dim)
    x, queries = _mixture(rng, centres, n), _mixture(rng, centres, nq)
    ids = [f"d{i}" for i in range(n)]
    emb = EmbeddingSet(x, ids, {"model": "synthetic-mixture"})
    scores = np.concatenate([queries @ x[lo : lo + 100_000].T for lo in range(0, n, 100_000)], axis=1)
    exact = [[ids[j] for j in np.argsort(-row)[:K]] for row in scores]
    del scores
    result = {
        "data": f"{n:,} synthetic {dim}-d unit vectors around 2,000 seeded centres; {nq} fresh queries",
        "threads": 1,
        "k": K,
        "load_average": list(os.getloadavg()),
    }
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_lance_million"))
    try:
        for name, kind in (("lance ivf_pq", "ivf_pq"), ("lance flat", "flat")):
            _log(f"million {name}")
            result[name] = _lance_case(emb, kind, tmp / kind, queries, exact, 256)
            result[name]["bytes_per_doc"] = round(result[name]["bytes"] / n, 1)
            _log(f"  {result[name]}")
            shutil.rmtree(tmp / kind, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (BENCH_DIR / "results" / "lance_million.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(out_dir: pathlib.Path | None = None, full: bool = False, quick: bool = False) -> dict:
    import faiss
    import lancedb  # noqa: F401  (imported before any clock starts: 3 s of it)

    from docembed.scoring import maxsim_one_to_many
    from docembed.types import EmbeddingSet, MultiVectors

    faiss.omp_set_num_threads(1)
    n, n_multi, nq, nq_multi, dim = (
        (10_000, 2_000, 100, 20, 384) if quick else (100_000, 20_000, 200, 20, 384)
    )
    rng = np.random.default_rng(46)
    extra = n // 100
    x = _unit(rng, n + extra, dim)
    ids = [f"d{i}" for i in range(n + extra)]
    meta = {"model": "random-unit-vectors"}
    emb_all = EmbeddingSet(x, ids, meta)
    emb = EmbeddingSet(x[:n], ids[:n], meta)
    queries = _unit(rng, nq, dim)
    exact = [[ids[j] for j in np.argsort(-row)[:K]] for row in queries @ x[:n].T]
    result = {
        "data": "random unit vectors (seeded), 384-d",
        "threads": 1,
        "k": K,
        "dense": {"documents": n, "queries": nq},
        "multi": {},
    }
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_lance"))
    try:
        result["dense"].update(_dense_rows(emb, queries, exact, rng.integers(0, 100, size=n), tmp))

        _log("add 1 % vs rebuild")
        result["add_1_percent"] = {
            "documents": n,
            "added": extra,
            "flat": _add_vs_rebuild(emb_all, n, extra, tmp, "flat"),
        }
        _log(f"  {result['add_1_percent']}")

        # multi-vector: 10-20 vectors per document, queries of 8 vectors
        counts = rng.integers(10, 21, size=n_multi)
        docs = MultiVectors(_unit(rng, int(counts.sum()), dim), np.concatenate([[0], np.cumsum(counts)]))
        multi = EmbeddingSet(docs, [f"m{i}" for i in range(n_multi)], meta)
        mq = MultiVectors(_unit(rng, nq_multi * 8, dim), np.arange(0, nq_multi * 8 + 1, 8))
        exact_multi = []
        for i in range(nq_multi):
            scores = maxsim_one_to_many(mq[i], docs)
            exact_multi.append([f"m{j}" for j in np.argsort(-scores, kind="stable")[:K]])
        result["multi"] = {"documents": n_multi, "vectors": int(counts.sum()), "queries": nq_multi}
        multi_cases = {
            "faiss flat": lambda f: _faiss_case(multi, "flat", f, mq, exact_multi, 256),
            "lance flat": lambda f: _lance_case(multi, "flat", f, mq, exact_multi, 256),
        }
        if quick:  # LanceDB's multivector IVF_PQ took 55 s for 30,000 vectors here: ~10 min at full size
            multi_cases["lance ivf_pq"] = lambda f: _lance_case(multi, "ivf_pq", f, mq, exact_multi, 256)
        for name, case in multi_cases.items():
            folder = tmp / f"multi-{name.replace(' ', '-')}"
            _log(f"multi {name}")
            result["multi"][name] = case(folder)
            _log(f"  {result['multi'][name]}")
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["quick"] = quick
    # a quick run (a check) never replaces the committed summary: it goes to its own folder, if one is given
    target = (
        BENCH_DIR / "results" / "lance.json"
        if not quick
        else out_dir and pathlib.Path(out_dir) / "lance.json"
    )
    if target:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 dense and 2,000 multi-vector documents")
    parser.add_argument(
        "--dense", help="real dense vectors (a docembed encode output): the dense cases over them"
    )
    parser.add_argument("--million", action="store_true", help="Lance over a million synthetic documents")
    arguments = parser.parse_args()
    if arguments.million:
        print(json.dumps(million(), indent=2))
    elif arguments.dense:
        print(json.dumps(dense_on_file(arguments.dense), indent=2))
    else:
        print(json.dumps(main(quick=arguments.quick), indent=2))
