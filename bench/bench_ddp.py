"""torchrun DDP on CPU: the same training recipe in 1 process and in N gloo processes, one run each.

Recipe: `docembed train-setenc` on 20 Newsgroups train (the fastest recipe, so the comparison fits in a few
minutes on 2 cores), every process on one thread, the same seed and per-rank batch. Under N ranks one
optimizer step consumes N batches, so the loss curves are compared per documents seen (step x batch x
ranks), not per step. Reported: training docs/s of each run and their ratio, the logged loss / align /
uniform at matched numbers of documents seen, and both final models' 20NG retrieval MAP@100 / kNN.

    .venv/bin/python bench/bench_ddp.py [--ranks 2] [--epochs 3] [--out bench/results/ddp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def _train(out: pathlib.Path, ranks: int, epochs: int, batch: int) -> float:
    args = ["-q", "--seed", "0", "train-setenc", "20newsgroups/train", "-o", str(out)]
    args += ["--epochs", str(epochs), "-b", str(batch), "--temperature", "2", "--log-every", "5"]
    if ranks == 1:
        cmd = [PYTHON, "-m", "docembed", *args]
    else:
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", "29561", "-m", "docembed", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return time.perf_counter() - started


def _curve(out: pathlib.Path, ranks: int, batch: int) -> list[dict]:
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    terms = ("loss", "align", "uniform")
    return [{"docs_seen": r["step"] * batch * ranks, **{k: r[k] for k in terms}} for r in rows]


def _retrieval(model: pathlib.Path) -> dict:
    cmd = [PYTHON, "-m", "docembed", "-q", "evaluate", "20newsgroups-retrieval", "-m", str(model)]
    proc = subprocess.run(
        [*cmd, "--no-cache", "--overwrite", "-o", str(model / "eval")],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="2"),
        cwd=ROOT,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    metrics = result.get("metrics", result)
    return {k: round(metrics[k], 2) for k in ("map@100", "knn_accuracy")}


def _at(curve: list[dict], docs: int) -> dict:
    """The logged row closest to `docs` documents seen."""
    return min(curve, key=lambda row: abs(row["docs_seen"] - docs))


def measure(ranks: int, epochs: int, batch: int, out_path: pathlib.Path) -> dict:
    work = pathlib.Path(tempfile.mkdtemp(prefix="docembed-ddp-"))
    try:
        runs = {}
        for n in (1, ranks):
            out = work / f"ranks{n}"
            wall = _train(out, n, epochs, batch)
            summary = json.loads((out / "train_summary.json").read_text())
            runs[n] = {
                "ranks": n,
                "wall_s": round(wall, 1),
                "train_s": summary["seconds"],
                "steps": summary["steps"],
                "docs_per_s": summary["docs_per_s"],
                "curve": _curve(out, n, batch),
                "retrieval": _retrieval(out),
            }
        one, many = runs[1], runs[ranks]
        checkpoints = [many["curve"][i]["docs_seen"] for i in (0, len(many["curve"]) // 2, -1)]
        result = {
            "recipe": f"train-setenc 20newsgroups/train --epochs {epochs} -b {batch} --t 2 --seed 0",
            "threads_per_process": 1,
            "cpus": os.cpu_count(),
            "runs": {str(k): v for k, v in runs.items()},
            "throughput_ratio": round(many["docs_per_s"] / one["docs_per_s"], 3),
            "loss_at_matched_docs": [
                {"docs_seen": d, "1 rank": _at(one["curve"], d), f"{ranks} ranks": _at(many["curve"], d)}
                for d in checkpoints
            ],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(out_dir: pathlib.Path, full: bool = False) -> dict:
    """bench/run.py's entry point: 2 ranks, 3 epochs (full: 10)."""
    return measure(2, 10 if full else 3, 256, pathlib.Path(out_dir) / "ddp.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results" / "ddp.json")
    args = parser.parse_args()
    result = measure(args.ranks, args.epochs, args.batch, args.out)
    summary = {k: v for k, v in result.items() if k != "runs"}
    runs = result["runs"].items()
    summary["runs"] = {k: {key: value for key, value in v.items() if key != "curve"} for k, v in runs}
    print(json.dumps(summary, indent=2))
