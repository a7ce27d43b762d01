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
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "zoo"
DOCEMBED = str(Path(sys.executable).with_name("docembed"))

# fmt: off
# The student's settings, shared by its two steps (the second resumes the first to cool the LR down).
_STUDENT = [
    "--seed", "0", "train-distill", "{runs}/student-corpus.jsonl", "-o", "{out}/distilled",
    "--teacher", "sbert,pv", "--depth-target", "chunks", "--depth-weight", "2",
    "--max-length", "2048", "--freeze-embeddings", "--batch-size", "8",
    "--lr", "5e-5", "--warmup-steps", "20", "--log-every", "10", "--save-every", "50",
]
# fmt: on
# name -> (training steps, each a docembed argument list; the last one writes {out}), export options.
# `{out}` is runs/zoo/<name>; `{runs}` is runs/zoo.
# fmt: off
RECIPES: dict[str, dict | None] = {
    # QuickThoughts (issue 16): 7,615 steps of 400 consecutive sentences = 3.05M sentences (3.2 passes over
    # 955,730 sentences of IMDB and 20 Newsgroups), 99 minutes on one thread here. Vocabulary expansion is
    # train-quickthoughts' default (chosen on the STS-B / SICK-R dev splits) and costs no training.
    "quickthoughts": {
        "steps": [
            [
                "--seed", "0", "train-quickthoughts",
                "imdb/train", "imdb/test", "20newsgroups/train", "20newsgroups/test",
                "-o", "{out}", "--context", "1", "--epochs", "20",
                "--max-steps", "7615", "--log-every", "50",
            ],
        ],
        "drop": [],
    },
    # NUGGET (issue 14): the similarity objective on PI train pairs with all their hard negatives, the whole
    # encoder and W_V frozen (nuggets are MiniLM's own token vectors; only the selection learns), no feedback,
    # the learned score a correction to the IDF rule (--idf-prior, zero at start), trained selecting r = 0.25
    # so that the residual reaches the tokens around the 0.1 cut it encodes at: the best trained variant on
    # PI dev at r = 0.1 and 256 tokens (src/docembed/zoo/nugget/card.md has the table of variants).
    "nugget": {
        "steps": [
            [
                "python", "-c", "from docembed.training.nugget_recipe import write_training_pairs; "
                "write_training_pairs('{runs}/nugget_pairs_pi.jsonl', sts=False)",
            ],
            [
                "--seed", "0", "train-nugget", "{runs}/nugget_pairs_pi.jsonl", "-o", "{out}",
                "--objective", "sim", "--freeze", "encoder+value", "--no-feedback", "--idf-prior", "1",
                "--max-length", "256", "--ratio", "0.1", "--train-ratio", "0.25",
                "--batch-size", "16", "--epochs", "3",
                "--lr", "1e-4", "--warmup-steps", "10", "--negatives-per-pair", "14",
            ],
            # encode-time setting chosen after training on the val side of bench_nugget_curve's four tasks
            # (issue 30): every token joins its nearest nugget, which keeps 1/4 of itself + 3/4 their mean
            [
                "python", "-c", "import docembed; m = docembed.load('{out}', device='cpu'); "
                "m.encoder.set_selection(aggregate='assign', assign_weight=0.75); "
                "m.save('{out}', overwrite=True)",
            ],
        ],
        "drop": ["backbone.decoder."],
    },
    # The long-document student (issue 15): SBERT depth + PV breadth (Soft CCA) as in the thesis, except that
    # every document gets a depth target (SBERT averaged over its 256-token windows), weighted 2 (chosen
    # among 1 / 2 / 5 at 294 steps on the long *train* documents, `--tasks long-val`); MiniLM's embeddings
    # frozen so only the encoder layers ship; long IMDB and 20NG *train* documents. 450 steps at a constant
    # LR, then the same run resumed to cool down linearly over 150 more (warmup-stable-decay; chosen over
    # the uncooled 294 / 450 and a cool-down from 294 on the same validation tasks). Step counts, not a
    # time budget, so the run is the same on any machine (the budget only guards a stuck run).
    #
    # Then (issue 35) the distilled student continues with the same teachers on the corpus' first 3,000
    # documents plus the in-batch pair loss on Debian documentation (train split) and man pages of under
    # 2,000 words (so none of bench_long's): 32 pages of one manual per step, first half -> second half or
    # passage -> page; pair weight 1, 338 steps; then the result interpolated 0.7 with the distilled student
    # it started from (WiSE-FT). Chosen among pair weights 1 / 0.25 and interpolations 0.5 / 0.7 on
    # bench_student_kinds' val split under the long-val and PI dev conditions (bench/results/student/
    # pairs.md). 6 minutes on one H200; on one CPU thread, estimated at most of a day.
    "student": {
        "steps": [
            ["python", "scripts/student_corpus.py", "{runs}/student-corpus.jsonl"],
            [*_STUDENT, "--max-steps", "450", "--time-budget", "9000"],
            [*_STUDENT, "--max-steps", "600", "--decay-steps", "150", "--time-budget", "3600", "--resume"],
            [
                "python", "scripts/debian_docs.py", "{runs}/debian-docs/docs.jsonl",
                "--cache", "{runs}/debian-docs",
            ],
            [
                "python", "scripts/man_corpus.py", "{runs}/man-section1.jsonl",
                "--sections", "1", "--limit", "15768", "--min-bytes", "2000",
            ],
            [
                "python", "scripts/man_corpus.py", "{runs}/man-sections578.jsonl",
                "--sections", "5,7,8", "--limit", "500", "--min-bytes", "2500",
            ],
            [
                "python", "scripts/student_corpus.py", "{runs}/student-pairs.jsonl", "--varied-only",
                "--docs", "{runs}/debian-docs/docs.jsonl",
                "--man", "{runs}/man-section1.jsonl", "{runs}/man-sections578.jsonl",
                "--segment-words", "1000000", "--max-segments", "1", "--long-words", "300",
            ],
            [
                "--seed", "0", "train-distill", "{runs}/student-corpus.jsonl", "--limit", "3000",
                "-o", "{out}/pairs", "--student", "{out}/distilled",
                "--teacher", "sbert,pv", "--pv-model", "{out}/distilled/pv-teacher",
                "--depth-target", "chunks", "--depth-weight", "2", "--freeze-embeddings", "--batch-size", "8",
                "--pairs-from", "{runs}/student-pairs.jsonl", "--pair-weight", "1", "--pair-batch-size", "32",
                "--lr", "2e-5", "--warmup-steps", "20", "--max-steps", "338", "--log-every", "25",
            ],
            [
                "python", "-c", "import docembed; "
                "from docembed.training.weight_averaging import interpolate_weights; "
                "m = docembed.load('{out}/pairs'); "
                "interpolate_weights(m, docembed.load('{out}/distilled'), 0.7); m.encoder.save('{out}')",
            ],
        ],
        "drop": [],
    },
    # The retriever (issue 45): MiniLM's top 3 layers tuned to find the part of a long document a query is
    # about, on views of Debian documentation, man pages, 20 Newsgroups and IMDB train text (nothing the
    # long-document bench measures on), validated on held-out documents (Debian docs val pages, bench_long's
    # val man pages, held-out 20NG / IMDB train posts). An hour on one CPU thread: the time budget ends the
    # run (at step 200 here; the card says so), and the best-validated weights ship.
    "retriever": {
        "steps": [
            [
                "python", "scripts/debian_docs.py", "{runs}/debian-docs/docs.jsonl",
                "--cache", "{runs}/debian-docs",
            ],
            ["python", "scripts/man_corpus.py", "{runs}/man-2500.jsonl", "--min-bytes", "2500"],
            ["python", "scripts/man_corpus.py", "{runs}/man-long.jsonl", "--min-bytes", "12000"],
            [
                "python", "scripts/retriever_corpus.py", "{runs}/retriever-corpus",
                "--docs", "{runs}/debian-docs/docs.jsonl", "--man", "{runs}/man-2500.jsonl",
                "--man-val", "{runs}/man-long.jsonl",
            ],
            [
                "--seed", "0", "--device", "cpu", "train-retriever", "{runs}/retriever-corpus/train.jsonl",
                "--val", "{runs}/retriever-corpus/val.jsonl", "-o", "{out}",
                "--max-steps", "300", "--decay-steps", "150", "--eval-every", "40", "--time-budget", "3600",
                "--log-every", "5", "--passage-temperature", "0.01",
            ],
        ],
        "drop": [],
    },
    # The static model (issue 33): model2vec's recipe on the offline MiniLM, the token position's output,
    # PCA to 256, log(1 + frequency rank) token weights from IMDB and 20 Newsgroups train; settings chosen on
    # STS-B dev and SICK-R dev (scripts/static_selection.py -> bench/results/static/selection.json).
    "static": {
        "steps": [["--seed", "0", "distill-static", "imdb/train", "20newsgroups/train", "-o", "{out}"]],
        "drop": [],
    },
}
# fmt: on
DROP = {name: recipe["drop"] for name, recipe in RECIPES.items() if recipe}


def _fmt(args: list[str], out: Path) -> list[str]:
    # paths relative to the project root: the steps run there, and the cards show the commands as typed
    out, runs = out.relative_to(ROOT), RUNS.relative_to(ROOT)
    return [a.replace("{out}", str(out)).replace("{runs}", str(runs)) for a in args]


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
        # a step is a docembed command, or a project script that prepares its data ("python", path, ...)
        program = [sys.executable] if args[0] == "python" else [DOCEMBED]
        args = args[1:] if args[0] == "python" else args
        commands.append(("python " if program[0] == sys.executable else "docembed ") + shlex.join(args))
        print(f"[zoo] {name}: {commands[-1]}", file=sys.stderr, flush=True)
        subprocess.run([*program, *args], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - started, " && ".join(commands)


def export(name: str, seconds: float | None, command: str | None) -> None:
    run_dir = (RUNS / name).relative_to(ROOT)
    args = [sys.executable, str(ROOT / "scripts" / "zoo.py"), "export", str(run_dir), "--name", name]
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
