"""NUGGET's vectors stored in fewer bytes (#30): output and index bytes per document, index queries/s and
the top-10 each storage shares with float32, through the CLI as a user runs it.

Corpus: the first `--docs` 20 Newsgroups test posts, encoded once by the shipped `nugget` (r = 0.1, whole
documents); the output written again as float16 and int8 (`docembed.save_embeddings(..., storage=)`, what
`encode --storage` writes); one `docembed index build --storage S` per storage (flat, and ivf); then
`docembed search INDEX --id ...` for `--queries` stored documents (more like this: the index's own first stage
and exact MaxSim, no query encoding), one thread; queries/s = (queries - 1) / (the time of that search - the
time of a search for one document), so start-up and loading the index are left out.

    .venv/bin/python bench/bench_nugget_storage.py [--docs 2000]    # -> bench/results/nugget/storage.json

At scale (#30's 100k-document corpus; not in `make bench`, about an hour on one thread): `--corpus
imdb-halves` is the two halves (cut at the middle word) of every IMDB train and test review, 100,000
documents; `--precision int8` encodes through the OpenVINO int8 path (a third of fp32's time, PI dev MRR
within 0.02); `--kinds ivf` leaves out flat indexes, whose exact search of every vector is what makes them
slow at this size; `--out` names the results file.

    .venv/bin/python bench/bench_nugget_storage.py --corpus imdb-halves --precision int8 --kinds ivf \
        --out bench/results/nugget/storage_100k.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
OUT = BENCH_DIR / "results" / "nugget" / "storage.json"
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
STORAGES = ("float32", "float16", "int8")


def _run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run([DOCEMBED, "-q", *args], check=True, env=env, capture_output=True, text=True).stdout


def _timed(*args: str, repeats: int = 1) -> tuple[float, str]:
    """(the best wall time of `repeats` runs, the output of the last)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = _run(*args)
        times.append(time.perf_counter() - started)
    return min(times), out


def _bytes(path: pathlib.Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir())
    return sum(f.stat().st_size for f in path.parent.glob(path.name.split(".")[0] + ".*"))


def corpus_texts(corpus: str, docs: int) -> list[str]:
    """The documents: a seeded sample of 20NG test posts, or the halves of every IMDB review."""
    if corpus == "20ng":
        from docembed.evaluation import EvalOptions
        from docembed.evaluation.tasks import labelled_sample

        return labelled_sample("20newsgroups/test", EvalOptions(limit=docs))[0]
    from docembed import datasets

    texts = []
    for split in ("imdb/train", "imdb/test"):
        for record in datasets.records(split):
            words = record["text"].split()
            texts += [" ".join(words[: len(words) // 2]), " ".join(words[len(words) // 2 :])]
    return texts


def main(
    out_dir=None,
    full: bool = False,
    corpus: str = "20ng",
    docs: int = 2000,
    queries: int = 100,
    repeats: int = 1,
    precision: str = "fp32",
    kinds: tuple[str, ...] = ("flat", "ivf"),
    out: pathlib.Path = OUT,
) -> dict:
    import docembed

    texts = corpus_texts(corpus, docs)
    work = pathlib.Path(tempfile.mkdtemp(prefix="nugget-storage-"))
    path = work / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    started = time.perf_counter()
    _run("encode", str(path), "-m", "nugget", "--precision", precision, "-o", str(work / "float32.npz"))
    encode_seconds = time.perf_counter() - started
    full_set = docembed.load_embeddings(str(work / "float32.npz"))
    for storage in STORAGES[1:]:
        docembed.save_embeddings(full_set, str(work / f"{storage}.npz"), storage=storage)
    ids = [item for i in range(queries) for item in ("--id", f"d{i * len(texts) // queries}")]
    result: dict = {
        "corpus": corpus,
        "precision": precision,
        "documents": len(texts),
        "vectors_per_doc": round(len(full_set.data.vectors) / len(texts), 1),
        "encode_seconds": round(encode_seconds, 1),
        "queries": queries,
        "rows": {},
    }
    reference: dict[str, list] = {}
    for kind in kinds:
        for storage in STORAGES:
            index = work / f"{kind}-{storage}.index"
            source = str(work / f"{storage}.npz")
            started = time.perf_counter()
            _run("index", "build", source, "-o", str(index), "-t", kind, "--storage", storage)
            build_seconds = time.perf_counter() - started
            seconds, printed = _timed("search", str(index), *ids, "-k", "10", repeats=repeats)
            seconds -= _timed("search", str(index), *ids[:2], "-k", "10", repeats=repeats)[0]
            hits = [[hit["id"] for hit in json.loads(line)["results"]] for line in printed.splitlines()]
            reference.setdefault(kind, hits)
            overlap = sum(len(set(a) & set(b)) for a, b in zip(hits, reference[kind], strict=True))
            result["rows"][f"{kind} {storage}"] = {
                "output_bytes_per_doc": round(_bytes(work / f"{storage}.npz") / len(texts)),
                "index_bytes_per_doc": round(_bytes(index) / len(texts)),
                "queries_per_s": round((queries - 1) / max(seconds, 1e-9), 1),
                "top10_shared_with_float32": round(overlap / (10 * queries), 4),
                "build_seconds": round(build_seconds, 1),
            }
            print(f"{kind} {storage}: {result['rows'][f'{kind} {storage}']}", file=sys.stderr)
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--corpus", choices=("20ng", "imdb-halves"), default="20ng")
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--kinds", default="flat,ivf", help="index types, comma-separated")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    result = main(
        None,
        False,
        args.corpus,
        args.docs,
        args.queries,
        1,
        args.precision,
        tuple(args.kinds.split(",")),
        args.out,
    )
    print(json.dumps(result, indent=1))
