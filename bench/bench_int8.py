"""int8 CPU inference (issue 18): documents per second of each inference path against plain
sentence-transformers (PyTorch fp32), and what int8 costs in quality.

Speed: the same 512 IMDB test reviews (a seeded sample; all-MiniLM-L6-v2 truncates at 256 tokens), batch 32,
each (path, output, threads) in its own process: load, one warm-up batch, then `repeats` timed passes over the
512 texts; the median is reported, and the ratio to plain sentence-transformers measured in the same run.
Paths: `st-fp32` (SentenceTransformer.encode, the reference), `torch-fp32` (docembed's default path),
`openvino-int8` (static int8 via NNCF, calibrated on pydoc_data text), `openvino-fp32`, `onnx-int8`
(ONNX Runtime dynamic int8). Outputs: `sbert` (mean), `sbert-tokens` (every token's vector), the zoo
`nugget` (its encoder pass on the path's engine, selection and MaxSim in PyTorch) and the zoo `student`
(its Longformer pass, sliding-window attention included, on the path's engine; whole reviews); nugget and
student are compared with their own torch-fp32 as well as with plain sentence-transformers' sbert.
Quality (fp32 vs each int8 path): STS-B test Spearman and PI dev MRR (all queries, shuffled candidates,
pessimistic ties) through the evaluation harness, without its embedding cache; for the student its five
long-document metrics instead (imdb-long and 20newsgroups-long accuracy and MAP@100, halves MRR; their 600
long documents each, the probes trained on PROBE_LIMIT train documents); cosine of each int8 embedding to
the fp32 one on the 512 reviews (per document for `sbert` and `student`, per token for `sbert-tokens`).
Export: the one-off conversion's seconds and bytes on disk (from a fresh cache).

    .venv/bin/python bench/bench_int8.py              # 1 and 2 threads, 3 repeats -> results/int8.json
    .venv/bin/python bench/bench_int8.py --threads 1 --quality sbert --paths st-fp32 torch-fp32 openvino-int8
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
WORK = ROOT / "runs" / "bench_int8"
PATHS = ("st-fp32", "torch-fp32", "openvino-int8", "openvino-fp32", "onnx-int8")
INT8_PATHS = ("openvino-int8", "onnx-int8")
OUTPUTS = {"sbert": "mean", "sbert-tokens": "tokens", "nugget": "nugget", "student": "student"}
ZOO_OUTPUTS = ("nugget", "student")  # docembed's own families: no sentence-transformers path of their own
LONG_TASKS = ("imdb-long", "20newsgroups-long", "halves")
PROBE_LIMIT = 200
N_TEXTS, BATCH, SEED = 512, 32, 0


def _texts() -> list[str]:
    from docembed import datasets

    rows = [r["text"] for r in datasets.records("imdb/test")]
    return random.Random(SEED).sample(rows, N_TEXTS)


def _encoder(path: str, output: str):
    backend, precision = path.split("-")
    if output == "nugget":  # the zoo model, its encoder pass on the path's engine (selection in PyTorch)
        import docembed

        model = docembed.load("nugget", device="cpu", long_documents="truncate")
        return model.encoder.set_inference(backend, precision)
    if output == "student":  # the zoo model, its Longformer pass on the path's engine (pooling in PyTorch)
        import docembed

        return docembed.load("student", device="cpu").encoder.set_inference(backend, precision)
    from docembed.models.sbert import SBertConfig, SBertEncoder

    return SBertEncoder(SBertConfig(output=output, backend=backend, precision=precision))


def _encode_fn(path: str, output: str):
    """A function texts -> embeddings for one path, and whether its output is multi-vector."""
    if path == "st-fp32":
        from sentence_transformers import SentenceTransformer

        from docembed.models.offline import minilm_path

        model = SentenceTransformer(str(minilm_path()), device="cpu")
        if output == "mean":
            return lambda texts: model.encode(texts, batch_size=BATCH, normalize_embeddings=True)
        return lambda texts: model.encode(texts, batch_size=BATCH, output_value="token_embeddings")
    encoder = _encoder(path, output)
    return lambda texts: encoder.encode(texts, batch_size=BATCH)


def worker_speed(path: str, output: str, threads: int, repeats: int, save: str | None) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    texts = _texts()
    started = time.perf_counter()
    encode = _encode_fn(path, output)
    encode(texts[:BATCH])  # warm-up (and, for an engine, the export or the cache read)
    load_seconds = time.perf_counter() - started
    times, cpu_times, result = [], [], None
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = encode(texts)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    if save:
        if output in ("mean", "student"):  # one vector per document
            np.save(save, np.asarray(result, dtype=np.float32))
        else:
            vectors = (
                result.vectors if hasattr(result, "vectors") else np.concatenate([t.numpy() for t in result])
            )
            np.save(save, vectors.astype(np.float32))
    median = statistics.median(times)
    return {
        "docs_per_s": round(N_TEXTS / median, 2),
        # CPU time of this process (all its threads): steadier than wall time on a shared machine
        "docs_per_cpu_s": round(N_TEXTS / statistics.median(cpu_times), 2),
        "seconds": [round(t, 2) for t in times],
        "cpu_seconds": [round(t, 2) for t in cpu_times],
        "load_and_warmup_s": round(load_seconds, 1),
    }


def worker_quality(path: str, output: str) -> dict:
    from docembed.evaluation import EvalOptions, get_evaluator

    encoder = _encoder(path, output)
    scores = {}
    if output == "student":
        tasks, options = LONG_TASKS, EvalOptions(cache=False, limit=PROBE_LIMIT)
    else:
        tasks, options = ("stsb", "paraphrase-identification"), EvalOptions(cache=False)
    for task in tasks:
        result = get_evaluator(task, options).run(encoder)
        scores[task] = round(result.score, 2)
        if "map@100" in result.metrics:
            scores[f"{task}_map@100"] = round(result.metrics["map@100"], 2)
        scores[f"{task}_seconds"] = round(result.seconds, 1)
    return scores


def worker_export(path: str, output: str = "mean") -> dict:
    from docembed.models import inference_backends

    if (
        output in ZOO_OUTPUTS
    ):  # no folder of its own to fingerprint: time the first encode, measure what it added
        cache = WORK / "home" / "inference"
        before = {f for f in cache.rglob("*") if f.is_file()} if cache.exists() else set()
        started = time.perf_counter()
        _encoder(path, output).encode(["warm"])
        added = [f for f in cache.rglob("*") if f.is_file() and f not in before]
        return {
            "seconds": round(time.perf_counter() - started, 1),
            "bytes": sum(f.stat().st_size for f in added),
        }
    encoder = _encoder(path, "mean")
    encoder.encode(["warm"])  # exports into the (fresh) cache
    fingerprint = inference_backends.weights_fingerprint(encoder.weights_dir)
    backend, precision = path.split("-")
    return inference_backends.export_info(fingerprint, backend, precision)


def _subprocess(args: list[str], threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.update(DOCEMBED_HOME=str(WORK / "home"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, cwd=str(ROOT)
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _available(path: str) -> bool:
    from docembed.models import inference_backends

    backend = path.split("-")[0]
    return backend in ("st", "torch") or inference_backends.engine_available(backend)


def _cosines(output: str, path: str, threads: int) -> dict:
    import numpy as np

    reference = np.load(WORK / f"{output}-torch-fp32-{threads}.npy")
    other = np.load(WORK / f"{output}-{path}-{threads}.npy")
    if reference.shape != other.shape:  # nugget: the int8 scorer chose another number of tokens
        return {"shapes": [list(reference.shape), list(other.shape)]}
    cos = np.sum(reference * other, 1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(other, axis=1))
    return {"mean": round(float(cos.mean()), 4), "min": round(float(cos.min()), 4)}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(
    threads: list[int],
    repeats: int,
    quality: tuple[str, ...] = tuple(OUTPUTS),
    fresh_export: bool = True,
    save=None,
    paths: tuple[str, ...] = PATHS,
    names: tuple[str, ...] = tuple(OUTPUTS),
) -> dict:
    """Every measurement (`quality`: the models whose STS-B/PI scores to measure); `save(out)` is called
    after each one, so an interrupted run keeps its numbers."""
    save = save or (lambda out: None)
    WORK.mkdir(parents=True, exist_ok=True)
    if fresh_export:
        shutil.rmtree(WORK / "home" / "inference", ignore_errors=True)
    paths = [p for p in paths if _available(p)]
    out: dict = {
        "setup": {
            "model": "all-MiniLM-L6-v2 (256 tokens)",
            "texts": f"{N_TEXTS} IMDB test reviews (seed {SEED})",
            "batch_size": BATCH,
            "repeats": repeats,
            "cpus": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "paths_missing": [p for p in PATHS if p not in paths],
        },
        "export": {},
        "speed": {},
        "quality": {},
        "cosine_to_fp32": {},
    }
    for path in paths:
        if path.split("-")[0] in ("openvino", "onnx"):
            _log(f"[int8] export {path}")
            out["export"][path] = _subprocess(["--export", path, "mean"], max(threads))
            for name in ZOO_OUTPUTS:
                if name in names:
                    out["export"][f"{name} {path}"] = _subprocess(["--export", path, name], max(threads))
            save(out)
    for t in threads:
        for name in (
            "sbert",
            *[n for n in names if n != "sbert"],
        ):  # sbert's st-fp32 is every row's reference
            output = OUTPUTS[name]
            row = out["speed"].setdefault(name, {}).setdefault(f"{t}_thread", {})
            for path in paths:
                if path == "openvino-fp32" and output in ("tokens", "nugget"):
                    continue
                if path == "st-fp32" and output in ZOO_OUTPUTS:  # the reference is the sbert row's
                    continue
                vectors = str(WORK / f"{output}-{path}-{t}.npy")
                _log(f"[int8] speed {name} {path} {t} thread(s)")
                row[path] = _subprocess(["--speed", path, output, str(t), str(repeats), vectors], t)
                save(out)
            reference = out["speed"]["sbert"][f"{t}_thread"].get("st-fp32", {})
            for key, ratio in (("docs_per_s", "ratio_vs_st"), ("docs_per_cpu_s", "cpu_ratio_vs_st")):
                base, own = reference.get(key), row.get("torch-fp32", {}).get(key)
                for entry in row.values():
                    if base and key in entry:
                        entry[ratio] = round(entry[key] / base, 2)
                    if own and key in entry:  # the goal for nugget and student: >= 3x their own fp32
                        entry[ratio.replace("_st", "_own_fp32")] = round(entry[key] / own, 2)
            for path in INT8_PATHS:
                if path in row and "error" not in row[path] and "error" not in row.get("torch-fp32", {}):
                    out["cosine_to_fp32"].setdefault(name, {})[path] = _cosines(output, path, t)
    for name in quality:
        output = OUTPUTS[name]
        for path in ("torch-fp32", *INT8_PATHS):
            if path in paths:
                _log(f"[int8] quality {name} {path}")
                out["quality"].setdefault(name, {})[path] = _subprocess(
                    ["--quality-of", path, output], max(threads)
                )
                save(out)
    out["setup"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    save(out)
    return out


def _writer(path: pathlib.Path, note: str = ""):
    def save(out: dict) -> None:
        out["setup"]["note"] = note
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")

    return save


def main(out_dir: pathlib.Path, full: bool, **overrides) -> dict:
    """bench/run.py's entry point: 1 and 2 threads, 3 repeats, quality included; writes results/int8.json."""
    save = _writer(BENCH_DIR / "results" / "int8.json")
    return run(overrides.get("threads") or [1, 2], overrides.get("repeats") or 3, save=save)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DOCEMBED_DATA", str(ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description="int8 CPU inference vs plain sentence-transformers.")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument(
        "--quality",
        dest="quality_models",
        nargs="*",
        default=list(OUTPUTS),
        choices=list(OUTPUTS),
        help="models whose STS-B/PI scores to measure (none: speed, cosine and export only)",
    )
    parser.add_argument("--models", nargs="+", default=list(OUTPUTS), choices=list(OUTPUTS))
    parser.add_argument("--keep-export", action="store_true", help="reuse cached exports (no export timing)")
    parser.add_argument("--note", default="", help="a line saved with the results (e.g. the machine's load)")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH_DIR / "results" / "int8.json")
    # internal: one configuration in this (child) process, one JSON line on stdout
    parser.add_argument("--speed", nargs=5, metavar=("PATH", "OUTPUT", "THREADS", "REPEATS", "SAVE"))
    parser.add_argument("--quality-of", nargs=2, metavar=("PATH", "OUTPUT"))
    parser.add_argument("--export", nargs=2, metavar=("PATH", "OUTPUT"))
    args = parser.parse_args()
    if args.speed:
        path, output, threads, repeats, save = args.speed
        print(json.dumps(worker_speed(path, output, int(threads), int(repeats), save)))
    elif args.quality_of:
        print(json.dumps(worker_quality(*args.quality_of)))
    elif args.export:
        print(json.dumps(worker_export(*args.export)))
    else:
        save = _writer(args.out, args.note)
        result = run(
            args.threads,
            args.repeats,
            tuple(args.quality_models),
            not args.keep_export,
            save,
            tuple(args.paths),
            tuple(args.models),
        )
        print(json.dumps(result, indent=2))
