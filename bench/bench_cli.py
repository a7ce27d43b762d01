"""The command line's own costs (#47), as a user meets them, each command a fresh process:

- mistakes: one wrong input or option per command (a missing file, a wrong field, a JSON array, a model
  that is nothing, a local folder not trained yet, rows that need --docs ...), the wall time until the
  one-line error; the goal is under 1 s for each, against the model's load (9-11 s) they once waited for;
- one-shot: `docembed similarity "a" "b" -m sbert` against a minimal Python script that imports
  sentence-transformers, loads all-MiniLM-L6-v2 and encodes the same two texts (the goal: at most 1.2x);
- server: 100 `docembed search INDEX --query ...` calls with and without `--server` (a running
  `docembed serve` holds the model; the goal: under 10 % of the time without it), with identical outputs;
- progress: seconds from the start of `docembed -v encode` (off a terminal) to its first progress line,
  against the seconds a one-pair `similarity` takes to load the same model, for each built-in family (the
  goal: the line within 2 s of the first batch).

Timings are ratios within this run; seconds depend on the machine and its load.

    .venv/bin/python bench/bench_cli.py [--quick]     # -> bench/results/cli.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", DOCEMBED_SERVER="")

TEXTS = [
    "The kernel schedules processes by priority and time slices.",
    "A recipe for bread: flour, water, salt and yeast, then patience.",
    "Version control keeps every change of a project and who made it.",
    "Rain is expected over the weekend, with clearing skies on Monday.",
    "The library lends books, films and music to anyone with a card.",
]


def _run(args: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(args, env=env or ENV, capture_output=True, text=True)
    return time.perf_counter() - started, done


def _fixtures(tmp: pathlib.Path) -> dict[str, str]:
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    (tmp / "docs.json").write_text(json.dumps([{"id": "d0", "text": TEXTS[0]}]) + "\n")
    (tmp / "pairs.jsonl").write_text(json.dumps({"text1": TEXTS[0], "text2": TEXTS[1]}) + "\n")
    (tmp / "tasks.jsonl").write_text(json.dumps({"source": "d0", "candidates": ["d1", "d2"]}) + "\n")
    (tmp / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    index = tmp / "docs.index"
    _, done = _run([DOCEMBED, "-q", "encode", str(docs), "-m", "sbert", "-o", str(tmp / "docs.npy")])
    done.check_returncode()
    _run([DOCEMBED, "-q", "index", "build", str(tmp / "docs.npy"), "-o", str(index)])[1].check_returncode()
    return {"docs": str(docs), "tmp": str(tmp), "index": str(index)}


def mistakes(files: dict[str, str]) -> dict[str, dict]:
    """Each command with one mistake: seconds to the error, its exit status and its one line."""
    docs, tmp, index = files["docs"], files["tmp"], files["index"]
    cases = {
        "encode: missing input": ["encode", f"{tmp}/missing.jsonl", "-m", "sbert"],
        "encode: wrong --text-field": ["encode", docs, "-m", "sbert", "--text-field", "body"],
        "encode: a JSON array": ["encode", f"{tmp}/docs.json", "-m", "sbert"],
        "encode: model folder not trained yet": ["encode", docs, "-m", "models/student"],
        "encode: misspelt model": ["encode", docs, "-m", "sbrt"],
        "encode: option after the command": ["encode", f"{tmp}/missing.jsonl", "-m", "sbert", "-q"],
        "similarity: wrong --left-field": [
            "similarity",
            "--pairs",
            f"{tmp}/pairs.jsonl",
            "--left-field",
            "a",
        ],
        "similarity: not-trained folder": ["similarity", "a", "b", "-m", "models/student"],
        "rerank: id rows without --docs": ["rerank", f"{tmp}/tasks.jsonl", "-m", "sbert"],
        "rerank: missing tasks": ["rerank", f"{tmp}/missing.jsonl", "--docs", docs, "-m", "sbert"],
        "search: missing query file": ["search", index, "--queries", f"{tmp}/missing.txt"],
        "search: not-trained folder": ["search", index, "--query", "x", "-m", "models/nugget"],
        "index build: missing input": ["index", "build", f"{tmp}/missing.npy", "-o", f"{tmp}/x.index"],
        "evaluate: not-trained folder": ["evaluate", "long-val", "-m", "models/student"],
        "inspect: not-trained folder": ["inspect", f"{tmp}/docs.txt", "-m", "models/nugget"],
        "export: misspelt model": ["export", "sbrt", "-o", f"{tmp}/exported"],
        "fit: missing corpus": ["fit", "tfidf", f"{tmp}/missing.jsonl", "-o", f"{tmp}/tfidf"],
        "train-pv: missing corpus": ["train-pv", f"{tmp}/missing.jsonl", "-o", f"{tmp}/pv"],
        "train-distill: missing corpus": ["train-distill", f"{tmp}/missing.jsonl", "-o", f"{tmp}/st"],
        "train-nugget: missing corpus": ["train-nugget", f"{tmp}/missing.jsonl", "-o", f"{tmp}/ng"],
        "train-setenc: missing corpus": ["train-setenc", f"{tmp}/missing.jsonl", "-o", f"{tmp}/se"],
        "train-quickthoughts: missing corpus": [
            "train-quickthoughts",
            f"{tmp}/missing.jsonl",
            "-o",
            f"{tmp}/q",
        ],
        "distill-static: missing corpus": ["distill-static", f"{tmp}/missing.jsonl", "-o", f"{tmp}/static"],
        "plot: missing labels": [
            "plot",
            f"{tmp}/docs.npy",
            "-l",
            f"{tmp}/missing.jsonl",
            "-o",
            f"{tmp}/p.png",
        ],
        "merge: missing part": ["merge", f"{tmp}/missing.npy", "-o", f"{tmp}/m.npy"],
        "serve: misspelt model": ["serve", "-m", "sbrt", "--port", "0"],
    }
    out = {}
    for name, args in cases.items():
        seconds, done = _run([DOCEMBED, *args])
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        out[name] = {
            "seconds": round(seconds, 3),
            "exit": done.returncode,
            "message": lines[-1][:200] if lines else "",
            "one_line": len(lines) == 1,
        }
        print(f"{name}: {seconds:.2f}s exit {done.returncode}: {out[name]['message'][:90]}", file=sys.stderr)
    return out


MINIMAL_SCRIPT = """
from sentence_transformers import SentenceTransformer
from docembed.models.offline import minilm_path
model = SentenceTransformer(str(minilm_path()), device="cpu")
a, b = model.encode(["a", "b"])
print(float((a @ b) / ((a @ a) ** 0.5 * (b @ b) ** 0.5)))
"""


def one_shot(repeats: int) -> dict:
    """`docembed similarity` against the minimal sentence-transformers script, median of `repeats`."""
    ours = [_run([DOCEMBED, "similarity", "a", "b", "-m", "sbert"])[0] for _ in range(repeats)]
    theirs = [_run([sys.executable, "-c", MINIMAL_SCRIPT])[0] for _ in range(repeats)]
    result = {"docembed_s": statistics.median(ours), "script_s": statistics.median(theirs)}
    result["ratio"] = round(result["docembed_s"] / result["script_s"], 3)
    print(f"one-shot similarity: {result}", file=sys.stderr)
    return {k: round(v, 3) for k, v in result.items()}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_server(files: dict[str, str], calls: int) -> dict:
    """`calls` search --query commands with and without --server; the outputs must be the same."""
    index, port = files["index"], _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [DOCEMBED, "serve", "--index", index, "--port", str(port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while "serving" not in (server.stderr.readline() or "serving"):
            pass
        queries = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(calls)]
        remote_s, local_s, same = 0.0, 0.0, True
        for i, query in enumerate(queries):
            seconds, remote = _run([DOCEMBED, "--server", url, "search", index, "--query", query, "-k", "3"])
            remote_s += seconds
            if i < 5:  # without the server: a few, each pays the whole load; scaled to `calls` below
                seconds, local = _run([DOCEMBED, "search", index, "--query", query, "-k", "3"])
                local_s += seconds
                same &= remote.stdout == local.stdout and remote.returncode == 0
        local_s *= calls / min(calls, 5)
    finally:
        server.terminate()
        server.wait()
    result = {"calls": calls, "with_server_s": round(remote_s, 2), "without_s": round(local_s, 2)}
    result["share"] = round(remote_s / local_s, 3)
    result["same_output"] = same
    print(f"search with a server: {result}", file=sys.stderr)
    return result


def progress(files: dict[str, str], models: list[str]) -> dict:
    """Seconds from the start of `docembed -v encode` (stderr not a terminal) to its first progress line,
    beside `load_s`, the seconds of a one-pair `similarity` with the same model (start-up, the model's load
    and one tiny encode): `after_load_s`, the difference, is the first batch plus the wait for its line."""
    tmp = pathlib.Path(files["tmp"])
    many = tmp / "many.jsonl"
    many.write_text("".join(json.dumps({"id": str(i), "text": TEXTS[i % 5] * 5}) + "\n" for i in range(160)))
    out = {}
    for model in models:
        started = time.perf_counter()
        process = subprocess.Popen(
            [
                DOCEMBED,
                "-v",
                "encode",
                str(many),
                "-m",
                model,
                "-o",
                str(tmp / f"{model}.npy"),
                "--overwrite",
            ],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        first_line = None
        for line in process.stderr:
            if first_line is None and "docs/s" in line:
                first_line = time.perf_counter() - started
        process.wait()
        total = time.perf_counter() - started
        load_s, _ = _run([DOCEMBED, "similarity", "a", "b", "-m", model])
        out[model] = {
            "first_progress_s": None if first_line is None else round(first_line, 2),
            "load_s": round(load_s, 2),
            "after_load_s": None if first_line is None else round(first_line - load_s, 2),
            "total_s": round(total, 2),
        }
        print(f"progress {model}: {out[model]}", file=sys.stderr)
    return out


def main(out_dir=None, full: bool = False, quick: bool = False) -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_cli"))
    try:
        files = _fixtures(tmp)
        result = {
            "mistakes": mistakes(files),
            "one_shot": one_shot(1 if quick else 3),
            "server": with_server(files, 10 if quick else 100),
            "progress": progress(
                files,
                ["glove-avg", "static", "sbert"]
                if quick
                else ["glove-avg", "static", "quickthoughts", "sbert", "nugget", "student"],
            ),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    slowest = max(result["mistakes"].values(), key=lambda m: m["seconds"])
    result["summary"] = {
        "slowest_mistake_s": slowest["seconds"],
        "mistakes_under_1s": sum(m["seconds"] < 1 for m in result["mistakes"].values()),
        "mistakes": len(result["mistakes"]),
        "one_shot_ratio": result["one_shot"]["ratio"],
        "server_share": result["server"]["share"],
    }
    if not quick:
        (BENCH_DIR / "results" / "cli.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    arguments = parser.parse_args()
    print(json.dumps(main(quick=arguments.quick)["summary"], indent=2))
