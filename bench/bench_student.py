"""Long-document student (Burian): quality of the student before and after distillation against its teachers,
and encode throughput/memory against SBERT reading 256-token chunks.

Quality: linear-probe accuracy (LogisticRegression, C by inner 3-fold CV) on frozen embeddings for IMDB and
20 Newsgroups, on a seeded random test sample and on its long documents (> 512 student tokens; the sample is
topped up with extra long test documents so that subset is not tiny: "all" is measured on the random part
only), and 20NG retrieval MAP@100 (each random-sample test document queries the others; relevant = same
newsgroup). The models are read from RUNS (see `prepare` and the report for the commands that built them).

Throughput: documents cut to exactly N student tokens (N = 512 .. 4096) encoded by the student, against the
SBERT teacher encoding the same text as consecutive 256-token chunks whose vectors are averaged; peak memory
is the process' peak RSS while encoding (Linux VmHWM, reset once the weights are loaded) minus its RSS
before, measured in a fresh subprocess per point.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_student.py --full   # writes bench/results/student.json

The measured students (one CPU thread each; 113 steps = what the sbert-only run reached in 20 minutes):

    export OMP_NUM_THREADS=1
    .venv/bin/python bench/bench_student.py --prepare-only --full    # runs/student-data: seeded subsets
    .venv/bin/docembed train-pv runs/student-data/pv-corpus.jsonl -o runs/student-pv-teacher --mode dbow \
        --dim 256 --epochs 10 --no-dbow-words --workers 1 --encode-workers 1   # all IMDB + 20NG train text
    COMMON="runs/student-data/distill.jsonl --student sbert --max-length 1024 --attention-window 128 \
        --batch-size 16 --lr 5e-5 --warmup-steps 5 --save-every 20 --cache-dir runs/student-cache"
    CCA="--pv-model runs/student-pv-teacher --pv-projection linear --cca-dim 32"
    docembed --seed 0 train-distill $COMMON -o runs/s2-student-sbert --teacher sbert --time-budget 1200
    docembed --seed 0 train-distill $COMMON -o runs/s2-student-pv --teacher pv $CCA --max-steps 113
    docembed --seed 0 train-distill $COMMON -o runs/s2-student-both --teacher sbert,pv $CCA --max-steps 113
    .venv/bin/python bench/bench_student.py --full --students s2-student-
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
RUNS = Path(os.environ.get("DOCEMBED_STUDENT_RUNS", ROOT / "runs"))
DATA = RUNS / "student-data"
EVAL_MAX_LENGTH = 1024  # student tokens read at evaluation (the students were trained at this length)


def _sizes(full: bool) -> dict[str, int]:
    if full:
        return {"distill_per_set": 1000, "probe_train": 200, "test_random": 150, "test_long_extra": 50}
    return {"distill_per_set": 40, "probe_train": 40, "test_random": 30, "test_long_extra": 10}


def prepare(data_dir: Path = DATA, full: bool = True, seed: int = 0) -> dict[str, Path]:
    """Seeded subsets: the distillation corpus (IMDB + 20NG train), probe-train sets disjoint from it, and
    test samples. Written once as JSONL under data_dir (git-ignored runs/)."""
    from docembed.datasets import records
    from docembed.evaluation.statistics import LONG_DOCUMENT_TOKENS, minilm_lengths

    sizes = _sizes(full)
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "distill": data_dir / "distill.jsonl",
        **{f"{d}-{s}": data_dir / f"{d}-{s}.jsonl" for d in ("imdb", "20ng") for s in ("probe", "test")},
    }
    if all(p.exists() for p in paths.values()):
        return paths
    rng = random.Random(seed)
    distill = []
    for name, source in (("imdb", "imdb"), ("20ng", "20newsgroups")):
        train = [r for r in records(f"{source}/train") if r["text"].strip()]
        rng.shuffle(train)
        distill += train[: sizes["distill_per_set"]]
        probe = train[sizes["distill_per_set"] : sizes["distill_per_set"] + sizes["probe_train"]]
        test = [r for r in records(f"{source}/test") if r["text"].strip()]
        rng.shuffle(test)
        sample = test[: sizes["test_random"]]
        for r in sample:
            r["sample"] = "random"
        rest = test[sizes["test_random"] : sizes["test_random"] + 40 * sizes["test_long_extra"]]
        lengths = minilm_lengths([r["text"] for r in rest])
        long = [r for r, n in zip(rest, lengths, strict=True) if n > LONG_DOCUMENT_TOKENS]
        extra = long[: sizes["test_long_extra"]]
        for r in extra:
            r["sample"] = "long-extra"
        _write(paths[f"{name}-probe"], probe)
        _write(paths[f"{name}-test"], sample + extra)
    rng.shuffle(distill)
    _write(paths["distill"], distill)
    return paths


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for r in rows:
            handle.write(
                json.dumps(
                    {
                        "id": r["id"],
                        "text": r["text"],
                        "label": r["label"],
                        **({"sample": r["sample"]} if "sample" in r else {}),
                    }
                )
                + "\n"
            )


def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


# --- models -------------------------------------------------------------------------------------------
# The distilled students are RUNS/<prefix>sbert, <prefix>pv, <prefix>both (--students PREFIX).
STUDENT_PREFIX = "student-"


def model_specs() -> dict[str, str]:
    return {
        "student-before": str(RUNS / "student-before"),
        "sbert (teacher)": "sbert",
        "sbert-chunked-256": "sbert-chunks",
        "pv (teacher)": str(RUNS / "student-pv-teacher"),
        **{f"student-{t}": str(RUNS / f"{STUDENT_PREFIX}{t}") for t in ("sbert", "pv", "both")},
    }


def cut_to_tokens(texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut to its first `max_tokens` MiniLM tokens ([CLS] and [SEP] included): what the
    students read at evaluation, so the chunked SBERT baseline reads the same text."""
    from transformers import AutoTokenizer

    from docembed.models.offline import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    ids = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return [tokenizer.decode(row[: max_tokens - 2]) for row in ids]


def load_bench_model(spec: str):
    """The model of `spec`; students read at most EVAL_MAX_LENGTH tokens."""
    from docembed.models.registry import load_model

    model = load_model(spec)
    if getattr(model, "family", "") == "student":
        model.config.max_length = min(model.config.max_length, EVAL_MAX_LENGTH)
    return model


def _embeddings(name: str, spec: str, split: str, texts: list[str], cache: Path) -> np.ndarray:
    """Embeddings of one split, from docembed's embedding cache under runs/ (keyed by model identity)."""
    from docembed.encoding import EmbeddingCache

    if spec == "sbert-chunks":  # SBERT's 256-token windows over the text the students read
        texts = cut_to_tokens(texts, EVAL_MAX_LENGTH)
    model = load_bench_model(spec)
    return np.asarray(EmbeddingCache(cache).vectors(model, texts, batch_size=8), dtype=np.float32)


def quality(out_dir: Path, full: bool, only: list[str] | None = None) -> dict:
    from docembed.evaluation.probes import train_test_predictions
    from docembed.evaluation.retrieval import label_retrieval
    from docembed.evaluation.statistics import LONG_DOCUMENT_TOKENS, minilm_lengths
    from docembed.scoring import cosine_matrix

    paths = prepare(DATA if full else RUNS / "student-data-small", full)
    # Embedding caches are run-time data: under runs/ (git-ignored), not beside the results.
    cache = RUNS / ("student-embeddings" if full else "student-embeddings-small")
    results: dict[str, dict] = {}
    for name, spec in model_specs().items():
        if only and name not in only:
            continue
        if spec.startswith("/") and not (Path(spec) / "config.json").exists():
            results[name] = {"missing": spec}
            continue
        row: dict[str, float] = {}
        for dataset in ("imdb", "20ng"):
            probe, test = _read(paths[f"{dataset}-probe"]), _read(paths[f"{dataset}-test"])
            x_train = _embeddings(name, spec, f"{dataset}-probe", [r["text"] for r in probe], cache)
            x_test = _embeddings(name, spec, f"{dataset}-test", [r["text"] for r in test], cache)
            y_train = np.array([r["label"] for r in probe])
            y_test = np.array([r["label"] for r in test])
            lengths = minilm_lengths([r["text"] for r in test])
            predicted, _ = train_test_predictions(x_train, y_train, x_test)
            correct = predicted == y_test
            is_random = np.array([r.get("sample") == "random" for r in test])
            is_long = lengths > LONG_DOCUMENT_TOKENS
            row[f"{dataset}_acc_all"] = round(float(correct[is_random].mean()), 4)
            row[f"{dataset}_acc_long"] = round(float(correct[is_long].mean()), 4)
            row[f"{dataset}_n_all"], row[f"{dataset}_n_long"] = int(is_random.sum()), int(is_long.sum())
            if dataset == "20ng":
                # the harness's query-by-document retrieval (seeded tie order), as a fraction like the rest
                x = x_test[is_random]
                retrieval = label_retrieval(
                    cosine_matrix(x, x), y_test[is_random], np.random.default_rng(1111)
                )
                row["20ng_map@100"] = round(retrieval["map@100"] / 100.0, 4)
        results[name] = row
        print(name, row, file=sys.stderr, flush=True)
    return results


# --- throughput ---------------------------------------------------------------------------------------
_PROBE = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[4]))
sys.path.insert(0, sys.argv[5])
from docembed.models.registry import load_model
kind, length, docs = sys.argv[1], int(sys.argv[2]), json.loads(open(sys.argv[3]).read())
if kind == "student":
    model = load_model(sys.argv[6]); model.config.max_length = length
else:
    model = load_model("sbert-chunks")  # the documents are already cut to `length` tokens
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS (VmHWM) to the current RSS
before = status("VmRSS:")  # weights loaded, nothing encoded yet
model.encode(docs[:1], batch_size=1)  # warm-up (its activations count towards the peak)
started = time.perf_counter()
model.encode(docs, batch_size=1)
seconds = time.perf_counter() - started
peak = status("VmHWM:")
print(json.dumps({"seconds": seconds, "peak_growth_mb": peak - before, "peak_rss_mb": peak}))
"""


def throughput(out_dir: Path, full: bool, student_dir: Path) -> dict:
    from transformers import AutoTokenizer

    from docembed.datasets import iter_texts
    from docembed.models.offline import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    lengths = (512, 1024, 2048, 4096) if full else (512, 1024)
    count = 2 if full else 1
    # Long inputs: 20NG training posts joined until each reaches the longest length asked for.
    pool = [t for t in iter_texts("20newsgroups/train", limit=3000) if len(t) > 2000]
    docs, current = [], ""
    for text in pool:
        current += "\n\n" + text
        if len(tokenizer(current, truncation=False)["input_ids"]) > max(lengths) + 8:
            docs.append(current)
            current = ""
            if len(docs) == count:
                break
    results = {}
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    for length in lengths:
        cut = [
            tokenizer.decode(tokenizer(d, add_special_tokens=False)["input_ids"][: length - 2]) for d in docs
        ]
        doc_file = out_dir / f"student-throughput-{length}.json"
        doc_file.write_text(json.dumps(cut))
        for kind in ("student", "sbert-chunked"):
            command = [
                sys.executable,
                "-c",
                _PROBE,
                kind,
                str(length),
                str(doc_file),
                threads,
                str(Path(__file__).parent),
                str(student_dir),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            results[f"{kind}@{length}"] = {
                "docs_per_s": round(count / measured["seconds"], 3),
                "tokens_per_s": round(count * length / measured["seconds"], 1),
                "peak_growth_mb": round(measured["peak_growth_mb"], 1),
                "peak_rss_mb": round(measured["peak_rss_mb"], 1),
            }
            print(kind, length, results[f"{kind}@{length}"], file=sys.stderr, flush=True)
        doc_file.unlink()
        results[f"student_vs_chunked_speed@{length}"] = round(
            results[f"student@{length}"]["tokens_per_s"] / results[f"sbert-chunked@{length}"]["tokens_per_s"],
            3,
        )
    results["threads"] = threads
    return results


def training_speed() -> dict:
    out = {}
    for teacher in ("sbert", "pv", "both"):
        summary = RUNS / f"{STUDENT_PREFIX}{teacher}" / "train_summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            out[f"student-{teacher}"] = {k: data.get(k) for k in ("steps", "seconds", "tokens_per_s", "last")}
            out[f"student-{teacher}"]["model"] = str(summary.parent.relative_to(ROOT))
    return out


def main(
    out_dir: Path,
    full: bool = False,
    parts: tuple[str, ...] = ("quality", "throughput", "training"),
    only: list[str] | None = None,
) -> dict:
    from docembed.evaluation.statistics import LONG_DOCUMENT_TOKENS

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "full": full,
        "eval_max_length": EVAL_MAX_LENGTH,
        "long_threshold": LONG_DOCUMENT_TOKENS,
        "sizes": _sizes(full),
    }
    student_dir = RUNS / "student-before"
    if not (student_dir / "config.json").exists():
        from docembed.models.student import convert_long

        convert_long("sbert", 4096, 128).save(student_dir)
    if "quality" in parts:
        result["quality"] = quality(out_dir, full, only)
    if "throughput" in parts:
        result["throughput"] = throughput(out_dir, full, student_dir)
    if "training" in parts:
        result["training"] = training_speed()
    name = ("student.json" if full else "student-small.json") if not only else "student-partial.json"
    (out_dir / name).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--parts", default="quality,throughput,training")
    parser.add_argument("--students", default=STUDENT_PREFIX, help="Folder prefix of the students in runs/.")
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument("--only", default=None, help="Comma-separated model names (embeddings are cached).")
    args = parser.parse_args()
    STUDENT_PREFIX = args.students  # module scope: model_specs() and training_speed() read it
    if args.prepare_only:
        print(prepare(DATA, args.full))
    else:
        only = args.only.split(",") if args.only else None
        print(json.dumps(main(Path(args.out), args.full, tuple(args.parts.split(",")), only), indent=2))
