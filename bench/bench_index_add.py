"""`docembed index add` vs a rebuild (#32): adding 1 % to a 100k-vector index, faiss flat, ivf and hnsw.

Stand-in data: random unit vectors (dim 64, seeded), written with the public `docembed.save_embeddings`;
both sides timed as the CLI runs them (`docembed index add INDEX extra.npy` on a copy of the base index,
`docembed index build all.npy`), in fresh processes, one thread, the median of `repeats`. Both include
start-up and reading/writing the index; `startup_s` is the time of the same add with an empty file (the
command's start-up and imports, no vectors), subtracted in `*_less_startup`. The add
writes a segment that loading adds to the index, so the time a search takes (`search --id`, one query) is
measured on the grown index and on the rebuilt one as well: what the deferred add costs each later load.

    .venv/bin/python bench/bench_index_add.py            # -> bench/results/index_add.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))


def _timed(*args: str) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started = time.perf_counter()
    subprocess.run([DOCEMBED, "-q", *args], check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    n: int = 100_000,
    dim: int = 64,
    share: float = 0.01,
    repeats: int = 3,
) -> dict:
    import docembed

    rng = np.random.default_rng(0)
    extra = int(n * share)
    vectors = rng.standard_normal((n + extra, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"doc{i}" for i in range(n + extra)]
    meta = {"model": "random-unit-vectors"}
    result = {"n": n, "added": extra, "dim": dim, "repeats": repeats, "threads": 1, "kinds": {}}
    with tempfile.TemporaryDirectory(prefix="bench_index_add") as tmp:
        tmp = pathlib.Path(tmp)
        docembed.save_embeddings(docembed.EmbeddingSet(vectors[:n], ids[:n], meta), str(tmp / "base.npy"))
        docembed.save_embeddings(docembed.EmbeddingSet(vectors[n:], ids[n:], meta), str(tmp / "extra.npy"))
        docembed.save_embeddings(docembed.EmbeddingSet(vectors, ids, meta), str(tmp / "all.npy"))
        empty = tmp / "empty.npy"
        docembed.save_embeddings(docembed.EmbeddingSet(vectors[:0], [], meta), str(empty))
        for kind in ("flat", "ivf", "hnsw"):
            base = tmp / f"base-{kind}.index"
            _timed("index", "build", "--store", "faiss", str(tmp / "base.npy"), "-o", str(base), "-t", kind)
            if "startup_s" not in result:
                startup = [_timed("index", "add", str(base), str(empty)) for _ in range(repeats)]
                result["startup_s"] = statistics.median(startup)
            add_times, build_times, grown_search, rebuilt_search = [], [], [], []
            for _ in range(repeats):
                grown = tmp / f"grown-{kind}.index"
                shutil.rmtree(grown, ignore_errors=True)
                shutil.copytree(base, grown)
                add_times.append(_timed("index", "add", str(grown), str(tmp / "extra.npy")))
                rebuilt = tmp / f"rebuilt-{kind}.index"
                build_times.append(
                    _timed(
                        "index",
                        "build",
                        "--store",
                        "faiss",
                        str(tmp / "all.npy"),
                        "-o",
                        str(rebuilt),
                        "-t",
                        kind,
                        "--overwrite",
                    )
                )
                grown_search.append(_timed("search", str(grown), "--id", ids[-1], "-k", "5"))
                rebuilt_search.append(_timed("search", str(rebuilt), "--id", ids[-1], "-k", "5"))
            add_s, build_s = statistics.median(add_times), statistics.median(build_times)
            result["kinds"][kind] = {
                "add_s": round(add_s, 3),
                "rebuild_s": round(build_s, 3),
                "add_over_rebuild": round(add_s / build_s, 3),
                "search_grown_s": round(statistics.median(grown_search), 3),
                "search_rebuilt_s": round(statistics.median(rebuilt_search), 3),
                "add_over_rebuild_less_startup": round(
                    max(add_s - result["startup_s"], 0) / max(build_s - result["startup_s"], 1e-9), 3
                ),
            }
            print(f"{kind}: add {add_s:.2f}s, rebuild {build_s:.2f}s", file=sys.stderr)
    result["startup_s"] = round(result["startup_s"], 3)
    target = BENCH_DIR / "results" / "index_add.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    print(json.dumps(main(n=arguments.n, repeats=arguments.repeats), indent=2))
