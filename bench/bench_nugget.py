"""NUGGET benchmark: PI dev MRR at several ratios beside tfidf / sbert / sbert-tokens (with vectors per
document), reconstruction BLEU from the nuggets, nugget token statistics, encode throughput relative to
the plain encoder, and the training run's tokens/s.

    python bench/bench_nugget.py --out bench/results/nugget [--model runs/nugget-pi-mt] [--full]
    python bench/bench_nugget.py --make-pairs runs/pi_train_pairs.jsonl   # the training data (see below)

Training data of the measured model: paraphrase pairs of the PI *train* split (task source -> gold
candidate, and the reverse), written by `--make-pairs`; see models/nugget.py for the training command.
PI is scored by the evaluation harness (shuffled candidates, pessimistic ties). The transformer models
(sbert, sbert-tokens, NUGGET) cut every document to the same `--max-length` tokens; tfidf sees whole
documents. Quick mode (the default, sized for a shared 2-core CPU): a seeded subset of 256 of the 1,024
dev queries (the harness's `limit`), 128 tokens, BLEU on 8 held-out documents, timing on 32. --full: all
queries, 256 tokens, BLEU on 64 documents, plus the rule-based chunk selector and the untrained
(warm-start) model at r = 0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

RATIOS = (0.05, 0.1, 0.25)
QUICK_QUERIES = 256  # quick mode: a seeded subset of the 1,024 PI dev queries (the harness's --limit)
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "runs" / "nugget-pi-mt"


def write_pi_pairs(path: Path, split: str = "train") -> int:
    """JSON Lines {"source", "target"} paraphrase pairs from a PI split's tasks, both directions."""
    from docembed import datasets

    docs = {d.id: d.text for d in datasets.documents(f"paraphrase_identification/{split}/docs")}
    written = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for task in datasets.records(f"paraphrase_identification/{split}/task"):
            source, gold = docs[task["source"]], docs[task["candidates"][task["answer"]]]
            if source.strip() and gold.strip():
                for a, b in ((source, gold), (gold, source)):
                    out.write(json.dumps({"source": a, "target": b}, ensure_ascii=False) + "\n")
                    written += 1
    return written


def _pi(model, label: str, results: dict, limit: int | None, max_length: int | None = None) -> None:
    from docembed.evaluation import EvalOptions, get_evaluator
    from docembed.evaluation.base import cached_encode

    started = time.perf_counter()
    evaluator = get_evaluator("paraphrase-identification", EvalOptions(limit=limit))
    result = evaluator.run(model)
    row = {
        "mrr": round(result.score, 2),
        "top1": round(result.metrics["top1"], 2),
        "queries": result.metrics["queries"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    if getattr(model, "multi_vector", False):
        texts = _pi_texts(evaluator)
        vectors = cached_encode(model, texts, 32)  # the harness's own texts and order: a cache hit
        row["vectors_per_doc"] = round(float(vectors.counts.mean()), 2)
        if label == "nugget r=0.1":  # kept for the token statistics
            results["_vectors"] = {label: (texts, vectors)}
    if max_length:
        row["max_length"] = max_length
    results["pi_dev"][label] = row
    print(f"PI dev {label}: {row}", file=sys.stderr, flush=True)


def _pi_texts(evaluator) -> list[str]:
    """The documents the PI harness embeds, in its order (every id its chosen queries use, sorted)."""
    from docembed.evaluation.tasks import _subset

    docs, queries = evaluator._load()
    chosen = [queries[i] for i in _subset(len(queries), evaluator.options.limit, evaluator.rng())]
    return [docs[i] for i in sorted({i for q in chosen for i in [q["source"], *q["candidates"]]})]


def pi_model(spec: str, max_length: int, model_dir: Path = DEFAULT_MODEL):
    """The models compared on PI; the transformer ones cut every document to `max_length` tokens."""
    from docembed.evaluation import load_evaluation_model
    from docembed.models.registry import load_model
    from docembed.models.sbert import SBertConfig, SBertEncoder

    if spec in ("sbert", "sbert-tokens"):
        output = "tokens" if spec == "sbert-tokens" else "mean"
        return SBertEncoder(SBertConfig(output=output, max_seq_length=max_length), name=spec)
    if spec.startswith("nugget"):
        nugget = load_model(str(model_dir))
        nugget.config.max_length = max_length
        return nugget
    return load_evaluation_model(spec)


def main(
    out_dir: Path,
    full: bool = False,
    model_dir: Path = DEFAULT_MODEL,
    max_length: int | None = None,
    limit: int | None = None,
) -> dict:
    import torch

    from docembed import datasets
    from docembed.models.nugget import (
        NuggetConfig,
        NuggetEncoder,
        nugget_token_statistics,
        reconstruction_bleu,
    )

    max_length = max_length or (256 if full else 128)
    limit = limit if limit is not None else (None if full else QUICK_QUERIES)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no trained NUGGET model at {model_dir}: train one first (see models/nugget.py)")
    results: dict = {
        "model": str(model_dir),
        "pi_dev": {},
        "pi_setup": {"queries": limit or "all", "max_length": max_length, "candidates": 20},
        "threads": torch.get_num_threads(),
    }
    summary_path = model_dir / "train_summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        results["training"] = {k: summary.get(k) for k in ("steps", "seconds", "tokens_per_s", "device")}
        results["training"]["last_loss"] = summary.get("last", {}).get("loss")

    # --- PI: baselines and NUGGET at each ratio ------------------------------------------------------
    for spec in ("tfidf", "sbert", "sbert-tokens"):
        _pi(pi_model(spec, max_length), spec, results, limit, None if spec == "tfidf" else max_length)
    nugget = pi_model("nugget", max_length, model_dir)
    for ratio in RATIOS:
        nugget.set_ratio(ratio)
        _pi(nugget, f"nugget r={ratio}", results, limit, max_length)
    if full:
        for label, options in (("nugget-chunk r=0.1", {"selector": "chunk"}), ("nugget-untrained r=0.1", {})):
            config = NuggetConfig(
                ratio=0.1, max_length=max_length, decoder_layers=nugget.config.decoder_layers, **options
            )
            model = NuggetEncoder(config, name=label)
            if options:  # the chunk ablation keeps the trained weights; only the selector differs
                model.model.load_state_dict(nugget.model.state_dict())
            _pi(model, label, results, limit, max_length)
    _write(out_dir, {k: v for k, v in results.items() if k != "_vectors"})

    # --- token statistics and reconstruction on held-out (dev) documents ------------------------------
    dev_texts = [t for t in datasets.iter_texts("paraphrase_identification/dev/docs") if t.strip()]
    texts, vectors = results.pop("_vectors")["nugget r=0.1"]
    ids = nugget.tokenize(texts)
    items = [
        (None, vectors.positions[vectors.offsets[i] : vectors.offsets[i + 1]], ids[i])
        for i in range(len(ids))
    ]
    stats = nugget_token_statistics(items, nugget.tokenizer)
    results["token_statistics"] = {
        "ratio": 0.1,
        "documents": stats["documents"],
        "tokens": stats["tokens"],
        "nuggets": stats["nuggets"],
        "top_chosen": [_rounded(row) for row in stats["rows"][:15]],
        "most_frequent": [_rounded(row) for row in stats["frequent"][:10]],
    }
    _write(out_dir, results)
    bleu_docs = dev_texts[-(64 if full else 8) :]
    results["reconstruction_bleu"] = {"documents": len(bleu_docs), "max_length": 128, "beams": 5}
    for ratio in RATIOS:
        nugget.set_ratio(ratio)
        started = time.perf_counter()
        score = reconstruction_bleu(nugget, bleu_docs, beams=5, max_length=128)
        results["reconstruction_bleu"][f"r={ratio}"] = {
            "bleu": round(score["bleu"], 2),
            "precisions": [round(p, 1) for p in score["precisions"]],
            "brevity_penalty": round(score["brevity_penalty"], 3),
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"BLEU r={ratio}: {results['reconstruction_bleu'][f'r={ratio}']}", file=sys.stderr, flush=True)
        _write(out_dir, results)

    # --- encode throughput vs the plain encoder's forward pass -----------------------------------------
    nugget.set_ratio(0.1)
    timing_texts = dev_texts[: 32 if not full else 256]
    ids = nugget.tokenize(timing_texts)
    tokens = sum(len(i) for i in ids)
    encoder_only = nugget.model.backbone.encoder

    def plain() -> None:  # tokenise + the backbone encoder's own forward pass, same batching
        with torch.no_grad():
            for _, input_ids, attention in nugget._batches(nugget.tokenize(timing_texts), 32):
                encoder_only(input_ids=input_ids, attention_mask=attention)

    timings = {}
    for label, run in (
        ("plain_encoder_forward", plain),
        ("nugget_encode", lambda: nugget.encode(timing_texts)),
    ):
        run()  # warm-up
        best = min(_timed(run) for _ in range(2))
        timings[label] = {"seconds": round(best, 3), "tokens_per_s": round(tokens / best, 1)}
    timings["nugget_relative_to_plain"] = round(
        timings["plain_encoder_forward"]["seconds"] / timings["nugget_encode"]["seconds"], 3
    )
    results["encode_throughput"] = {"documents": len(timing_texts), "tokens": tokens, **timings}
    results["note"] = "CPU shared with other jobs: throughput figures are noisy; ratios are from the same run"
    _write(out_dir, results)
    return results


def _rounded(row: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _write(out_dir: Path, results: dict) -> None:
    (out_dir / "nugget.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/nugget"))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--max-length", type=int, help="Tokens per document (default 128 quick, 256 full).")
    parser.add_argument("--limit", type=int, help="PI queries (default 256 quick, all with --full).")
    parser.add_argument("--full", action="store_true")
    parser.add_argument(
        "--make-pairs", type=Path, help="Only write the PI train paraphrase pairs to this file."
    )
    args = parser.parse_args()
    if args.make_pairs:
        print(f"{write_pi_pairs(args.make_pairs)} pairs -> {args.make_pairs}", file=sys.stderr)
    else:
        print(json.dumps(main(args.out, args.full, args.model, args.max_length, args.limit), indent=2))
