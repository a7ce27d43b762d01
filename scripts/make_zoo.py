"""`make zoo`: retrain every shipped model from the data root with fixed seeds and the exact settings, export
each into src/docembed/zoo/ (scripts/zoo.py export), and print how long each took.

    python scripts/make_zoo.py                      # every model whose recipe is filled in
    python scripts/make_zoo.py --only quickthoughts
    python scripts/make_zoo.py --export-only        # re-export runs/zoo/<name>/ without retraining

Runs go to runs/zoo/<name>/ (replaced). Data sets are named relative to $DOCEMBED_DATA (the Makefile sets it
to ../shared/data). Training uses one torch thread unless OMP_NUM_THREADS says otherwise, as the cards state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "zoo"
DOCEMBED = str(Path(sys.executable).with_name("docembed"))

# name -> (training steps, each a docembed argument list; the last one writes {out}), export options.
# `{out}` is runs/zoo/<name>; `{runs}` is runs/zoo. None = the lead has not filled the recipe in yet.
# fmt: off
RECIPES: dict[str, dict | None] = {
    "quickthoughts": {
        "steps": [
            [
                "--seed", "0", "train-quickthoughts",
                "imdb/train", "imdb/test", "20newsgroups/train", "20newsgroups/test",
                "-o", "{out}", "--context", "1", "--epochs", "20",
                "--time-budget", "3900", "--log-every", "50",
            ],
        ],
        "drop": [],
    },
    # TODO(lead): the NUGGET recipe of issue 14 (the NUGGET helper's final command, ~17:30), e.g.
    #   [["--seed", "0", "train-nugget", "{runs}/pi_train_pairs.jsonl", "-o", "{out}", "--objective", ...]]
    # with any data preparation as earlier steps. The decoder is not shipped (encoding never runs it).
    "nugget": None,
    # TODO(lead): the student recipe of issue 15; it must train with --freeze-embeddings so only the encoder
    # layers ship, e.g. [["--seed", "0", "train-distill", CORPUS, "-o", "{out}", "--freeze-embeddings", ...]]
    "student": None,
}
# fmt: on
DROP = {"nugget": ["backbone.decoder."]}


def _fmt(args: list[str], out: Path) -> list[str]:
    return [a.replace("{out}", str(out)).replace("{runs}", str(RUNS)) for a in args]


def train(name: str, recipe: dict) -> tuple[float, str]:
    out = RUNS / name
    shutil.rmtree(out, ignore_errors=True)
    RUNS.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.setdefault("MKL_NUM_THREADS", env["OMP_NUM_THREADS"])
    started = time.perf_counter()
    commands = []
    for step in recipe["steps"]:
        args = _fmt(step, out)
        commands.append("docembed " + " ".join(args))
        print(f"[zoo] {name}: {commands[-1]}", file=sys.stderr, flush=True)
        subprocess.run([DOCEMBED, *args], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - started, " && ".join(commands)


def export(name: str, seconds: float | None, command: str | None) -> None:
    args = [sys.executable, str(ROOT / "scripts" / "zoo.py"), "export", str(RUNS / name), "--name", name]
    for prefix in DROP.get(name, []):
        args += ["--drop", prefix]
    if command:
        args += ["--command", command]
    if seconds:
        args += ["--seconds", f"{seconds:.0f}", "--threads", os.environ.get("OMP_NUM_THREADS", "1")]
    subprocess.run(args, check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated: {', '.join(RECIPES)}")
    parser.add_argument("--export-only", action="store_true", help="export runs/zoo/<name>/ as it is")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        sys.exit(f"unknown zoo model(s) {unknown}; known: {', '.join(RECIPES)}")
    timings = []
    for name in names:
        recipe = RECIPES[name]
        if recipe is None:
            print(
                f"[zoo] {name}: recipe not filled in yet (scripts/make_zoo.py RECIPES) - skipped",
                file=sys.stderr,
            )
            timings.append((name, None, None, "skipped: no recipe"))
            continue
        seconds, command = (None, None) if args.export_only else train(name, recipe)
        started = time.perf_counter()
        export(name, seconds, command)
        timings.append((name, seconds, time.perf_counter() - started, "exported"))
    print("\nmodel            train (s)   export (s)   status")
    for name, seconds, export_seconds, status in timings:
        train_text = f"{seconds:9.0f}" if seconds else "        –"
        export_text = f"{export_seconds:10.0f}" if export_seconds else "         –"
        print(f"{name:<15} {train_text}   {export_text}   {status}")
    (RUNS / "times.json").parent.mkdir(parents=True, exist_ok=True)
    (RUNS / "times.json").write_text(json.dumps(timings, indent=2) + "\n")


if __name__ == "__main__":
    main()
