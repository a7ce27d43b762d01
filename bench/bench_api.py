"""The Python API's costs, as ratios measured in one run on one thread:

- `import docembed` (a fresh interpreter, less the interpreter's own start) and `docembed.load("sbert")`;
- encoding the same texts (IMDB train reviews, batch size 32, all-MiniLM-L6-v2) three ways: the API
  (`docembed.load("sbert").encode`), the CLI (`docembed encode`: the time for N texts less the time for one,
  so the process start and model load cancel out), and `SentenceTransformer.encode` directly;
- and that the API and the CLI give the same vectors (bit for bit) and sentence-transformers nearly so.

    .venv/bin/python bench/bench_api.py [--texts 500] [--out bench/results/api.json]
    .venv/bin/python bench/run.py --only api
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

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _best_wall(command: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, env=ONE_THREAD, capture_output=True)
        best = min(best, time.perf_counter() - started)
    return best


def _best_printed(code: str, repeats: int) -> float:
    """Best of `repeats` fresh interpreters of a number `code` prints (its own timing)."""
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], check=True, env=ONE_THREAD, capture_output=True, text=True
            ).stdout
        )
        for _ in range(repeats)
    ]
    return min(runs)


def startup_costs(repeats: int) -> dict:
    bare = _best_wall([sys.executable, "-c", "pass"], repeats)
    with_import = _best_wall([sys.executable, "-c", "import docembed"], repeats)
    load = _best_printed(
        "import time, docembed; t = time.perf_counter(); docembed.load('sbert', device='cpu'); "
        "print(time.perf_counter() - t)",
        repeats,
    )
    first_encode = _best_printed(
        "import time, docembed; t = time.perf_counter(); docembed.load('sbert', device='cpu').encode('x'); "
        "print(time.perf_counter() - t)",
        repeats,
    )
    return {
        "import_docembed_seconds": round(with_import - bare, 4),
        "python_start_seconds": round(bare, 4),
        "load_sbert_seconds": round(load, 3),
        "load_sbert_and_first_encode_seconds": round(first_encode, 3),
    }


def throughput(n_texts: int, repeats: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    import docembed
    from docembed import datasets
    from docembed.models.offline import minilm_path

    torch.set_num_threads(1)
    texts = list(datasets.iter_texts("imdb/train", limit=n_texts))
    # one pass over the first 256 tokens, as SentenceTransformer.encode reads (sbert's default reads it all)
    model = docembed.load("sbert", device="cpu", long_documents="truncate")
    theirs = SentenceTransformer(str(minilm_path()), device="cpu")

    def best(fn):
        fn(texts[:8])  # the first call pays for lazy initialisation
        times, out = [], None
        for _ in range(repeats):
            started = time.perf_counter()
            out = fn(texts)
            times.append(time.perf_counter() - started)
        return min(times), out

    t_api, v_api = best(lambda batch: model.encode(batch, batch_size=32))
    t_st, v_st = best(
        lambda batch: theirs.encode(batch, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    )
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for name, rows in (("all", texts), ("one", texts[:1])):
            paths[name] = pathlib.Path(folder, f"{name}.jsonl")
            paths[name].write_text(
                "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(rows))
            )

        def cli(name: str) -> list[str]:
            out = pathlib.Path(folder, f"{name}.npy")
            return [
                DOCEMBED, "-q", "encode", str(paths[name]), "-m", "sbert", "--long", "truncate",
                "-o", str(out), "--overwrite",
            ]  # fmt: skip

        t_cli_all, t_cli_one = _best_wall(cli("all"), repeats), _best_wall(cli("one"), repeats)
        v_cli = docembed.load_embeddings(str(pathlib.Path(folder, "all.npy"))).data
    t_cli = t_cli_all - t_cli_one  # the encoding of n-1 texts: start and load cancel out
    rate = {
        "api": n_texts / t_api,
        "cli": (n_texts - 1) / t_cli,
        "sentence_transformers": n_texts / t_st,
    }
    return {
        "data": f"imdb/train, first {n_texts} reviews, batch 32, all-MiniLM-L6-v2 (256 tokens), 1 thread",
        "docs_per_s": {k: round(v, 1) for k, v in rate.items()},
        "ratio_api_over_st": round(rate["api"] / rate["sentence_transformers"], 3),
        "ratio_cli_over_api": round(rate["cli"] / rate["api"], 3),
        "cli_whole_command_seconds": round(t_cli_all, 2),
        "api_equals_cli_bit_for_bit": bool(np.array_equal(v_api, v_cli)),
        "max_abs_difference_api_vs_st": float(np.abs(v_api - v_st).max()),
    }


def main(out_dir: pathlib.Path | None = None, full: bool = False, texts: int = 500, repeats: int = 3) -> dict:
    result = {
        "load_before": os.getloadavg(),
        "startup": startup_costs(repeats),
        "encode": throughput(texts, repeats),
    }
    result["load_after"] = os.getloadavg()
    target = BENCH_DIR / "results" / "api.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    os.environ.setdefault("DOCEMBED_DATA", str(BENCH_DIR.parents[1] / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    json.dump(main(texts=args.texts, repeats=args.repeats), sys.stdout, indent=2)
    print()
