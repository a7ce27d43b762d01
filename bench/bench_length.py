"""Speed and memory against document length (issue 29): one document of 1k, 4k, 16k and 64k MiniLM tokens
per family in its whole-document mode, each (family, length) in a fresh process, one thread.

The document is IMDB train reviews joined until it has the length (MiniLM's tokenizer). Per cell: seconds
of the encode call (after a warm-up on a short text), tokens/s, and the process's peak resident memory
before and after the call (`ru_maxrss`: what loading cost, and what the long document added). Time and the
added memory should grow linearly with length: tokens/s about constant, added memory about proportional.

    .venv/bin/python bench/bench_length.py [--lengths 1000 4000 16000 64000] [--models sbert nugget ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
OUT = BENCH_DIR / "results" / "length.json"
LENGTHS = (1000, 4000, 16000, 64000)
# (label, docembed.load name, options): each family reading whole documents
MODELS = (
    ("sbert", "sbert", {}),
    ("sbert-windows", "sbert-windows", {}),
    ("nugget", "nugget", {}),
    ("student", "student", {}),
    ("student --max-length 8192", "student", {"max_length": 8192}),
    ("static", "static", {}),
)


def document(tokens: int) -> str:
    """IMDB train reviews joined until the text has `tokens` MiniLM tokens (cut at a word)."""
    import docembed
    from docembed import datasets

    tokenizer = docembed.load("sbert", device="cpu").encoder.tokenizer
    words: list[str] = []
    for text in datasets.iter_texts("imdb/train"):
        words += text.split()
        if len(words) > tokens:  # a word is at least one token
            break
    low, high = 0, len(words)
    while low < high:  # the most words whose text has at most `tokens` tokens
        middle = (low + high + 1) // 2
        count = len(tokenizer(" ".join(words[:middle]), add_special_tokens=False, verbose=False)["input_ids"])
        low, high = (middle, high) if count <= tokens else (low, middle - 1)
    return " ".join(words[:low])


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def cell(name: str, options: dict, tokens: int) -> dict:
    """In the child process: load, warm up, encode one document of `tokens` tokens."""
    import warnings

    import torch

    import docembed

    torch.set_num_threads(1)
    text = document(tokens)
    model = docembed.load(name, device="cpu", **options)
    model.encode(["a short warm-up text"])
    loaded = peak_mb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        model.encode([text])
        seconds = time.perf_counter() - started
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "peak_mb_loaded": round(loaded, 1),
        "peak_mb_after": round(peak_mb(), 1),
        "added_mb": round(peak_mb() - loaded, 1),
    }


def run(lengths=LENGTHS, models=None) -> dict:
    chosen = [m for m in MODELS if models is None or m[0] in models]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    table: dict = {}
    for label, name, options in chosen:
        for tokens in lengths:
            print(f"[length] {label} {tokens} tokens", file=sys.stderr, flush=True)
            args = [sys.executable, __file__, "--cell", name, json.dumps(options), str(tokens)]
            done = subprocess.run(args, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                lines = done.stderr.strip().splitlines()
                table.setdefault(label, []).append({"tokens": tokens, "error": lines[-1] if lines else "?"})
                continue
            table.setdefault(label, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
        rows = [r for r in table[label] if "error" not in r]
        if len(rows) >= 2:  # linear growth: tokens/s of the longest over the shortest (1.0 = linear time)
            table[label].append(
                {
                    "speed_ratio_longest_over_shortest": round(
                        rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"], 2
                    )
                }
            )
    return {
        "data": "one document per length: IMDB train reviews joined, MiniLM tokens; 1 thread, a fresh "
        "process per cell, after a warm-up encode",
        "cpus": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "models": table,
    }


def main(out_dir: pathlib.Path | None = None, full: bool = False) -> dict:
    """bench/run.py's entry point: writes results/length.json."""
    result = run()
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("DOCEMBED_DATA", str(BENCH_DIR.parent.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--models", nargs="+", help="labels (default: all)")
    parser.add_argument("--cell", nargs=3, metavar=("NAME", "OPTIONS", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, options, tokens = args.cell
        print(json.dumps(cell(name, json.loads(options), int(tokens))))
    else:
        result = run(args.lengths, args.models)
        if args.models and OUT.exists():  # a subset re-measured: the other rows stay as they were
            result["models"] = {**json.loads(OUT.read_text())["models"], **result["models"]}
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=1))
