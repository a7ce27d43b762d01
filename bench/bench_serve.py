"""`docembed serve` under load (#49): N clients released at once by a barrier, each sending one request on
its own connection, against a server started as users start it (`docembed serve`, one process). Counts the
requests lost (a reset, a refused connection, a timeout or a status other than 200) and the latency of the
others (p50, p99, max), for `POST /encode` (the glove-avg model) and `POST /search` on a collection of the
same model (a Lance table, the default store, with stored text). Not a timed comparison: the figures say
that no request is lost and how long the last one waits.

    .venv/bin/python bench/bench_serve.py [--clients 200] [--rounds 3]   # -> bench/results/serve.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

BENCH_DIR = pathlib.Path(__file__).resolve().parent
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
SENTENCE = "the committee met on tuesday to review the budget for pumps rivers and the spring vote"


def _corpus(path: pathlib.Path, count: int) -> pathlib.Path:
    words = SENTENCE.split()
    rows = [
        {"id": f"d{i}", "text": " ".join(words[(i * k) % len(words)] for k in range(1, 12))}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _start(args: list[str]) -> tuple[subprocess.Popen, int]:
    """`docembed serve ARGS --port 0`, and the port it says it listens on."""
    proc = subprocess.Popen(
        [DOCEMBED, "serve", *args, "--port", "0"], env=ENV, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    for line in proc.stderr:
        found = re.search(rb"http://[^:]+:(\d+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, int(found.group(1))
    raise RuntimeError(f"serve did not start: exit {proc.wait()}")


def _load(port: int, path: str, body: dict, clients: int) -> dict:
    payload = json.dumps(body).encode()
    barrier = threading.Barrier(clients)

    def one(_):
        barrier.wait()
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request("POST", path, payload, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            ok = response.status == 200
        except OSError:
            ok = False
        finally:
            connection.close()
        return ok, time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(one, range(clients)))
    seconds = sorted(s for ok, s in results if ok)

    def at(q: float) -> float:
        return round(1000 * seconds[min(len(seconds) - 1, int(q * len(seconds)))], 1) if seconds else None

    lost = sum(not ok for ok, _ in results)
    return {"requests": clients, "lost": lost, "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


def main(out_dir: pathlib.Path | None = None, clients: int = 200, rounds: int = 3, **_) -> dict:
    out_dir = pathlib.Path(out_dir or BENCH_DIR / "results")
    summary = {"bench": "serve", "clients": clients, "rounds": rounds, "threads": 1, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        corpus = _corpus(work / "docs.jsonl", 2000)
        run = lambda *a: subprocess.run([DOCEMBED, "-q", *map(str, a)], env=ENV, check=True)  # noqa: E731
        run("encode", corpus, "-m", "glove-avg", "-o", work / "docs.npy")
        run("index", "build", work / "docs.npy", "-o", work / "docs.lance", "--text-from", corpus)
        index = str(work / "docs.lance")
        cases = {
            "encode": (["-m", "glove-avg"], "/encode", {"texts": ["the budget for pumps", "a spring vote"]}),
            "search": (["--index", index], "/search", {"queries": ["pumps and rivers"], "k": 5}),
        }
        for name, (args, path, body) in cases.items():
            proc, port = _start(args)
            try:
                summary["rows"][name] = [_load(port, path, body, clients) for _ in range(rounds)]
            finally:
                proc.terminate()
                proc.wait(30)
            print(f"{name}: {summary['rows'][name]}", file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "serve.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200, help="requests released at once")
    parser.add_argument("--rounds", type=int, default=3, help="times each case is run")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH_DIR / "results")
    args = parser.parse_args()
    main(args.out, args.clients, args.rounds)
