"""NUGGET benchmark (issue 14's table): PI dev MRR at r = 0.05 / 0.1 / 0.25, every model reading the same
256 tokens, for the shipped NUGGET model, the other trained variants given with --variant, the untrained
warm start, the rule-based chunk and IDF selectors, beside sbert-tokens (all token vectors), sbert and
tfidf, with vectors per document; the same for the held-out PI *train* queries; what the shipped model
picks (the paper's Figure 5); its encode time against the plain encoder's forward pass.

    python bench/bench_nugget.py --make-pairs runs/nugget_pairs.jsonl     # the training data
    python bench/bench_nugget.py --out bench/results/nugget --model runs/nugget-zoo [--variant L=DIR ...]

Training data (`--make-pairs`: `docembed.training.nugget_recipe.write_training_pairs`): paraphrase pairs,
both directions, from PI *train* (task source -> gold candidate, the task's other candidates as hard
negatives) without the held-out queries, plus STS-B and SICK *train* pairs scored >= 4 (not with
`--pi-only`, which the shipped model's recipe uses); `--halves N` adds the two halves of N long IMDB /
20NG *train* documents, none in halves-val (tried in issue 30, not shipped: zoo/nugget/card.md). The
held-out check: the last 256 PI train queries, whose source and gold documents are never trained on. PI
is scored by the evaluation harness (shuffled candidates, pessimistic ties), all 1,024 dev queries; tfidf
sees whole documents. The IDF selector's table is fitted on the training text, as `train-nugget` fits the
shipped model's. Reconstruction BLEU is measured only for a model trained with a decoder objective (ae /
mt).
The quick mode (`main(full=False)`, `make bench`) uses 256 dev queries.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
RATIOS = (0.05, 0.1, 0.25)
MAX_LENGTH = 256  # sbert-tokens' length; every transformer model here reads the same tokens
QUICK_QUERIES = 256  # quick mode: a seeded subset of the 1,024 PI dev queries (the harness's --limit)
DEFAULT_MODEL = ROOT / "runs" / "nugget-zoo"
DEFAULT_PAIRS = ROOT / "runs" / "nugget_pairs.jsonl"


# (split, label) -> each query's reciprocal rank (the harness's per_item): rows pair up on the same queries
RECIPROCAL_RANKS: dict[tuple[str, str], list[float]] = {}
RULE = "idf selector"


@functools.cache
def _pi_data(split: str):
    """The PI split's documents and queries, read once (the evaluators are built from them)."""
    from docembed.evaluation import EvalOptions, get_evaluator

    name = "paraphrase-identification" if split == "dev" else "paraphrase-identification-train"
    whole = get_evaluator(name, EvalOptions())
    return whole.docs, whole.queries


def _evaluator(split: str, limit: int | None, embed=None):
    """The harness on PI dev (`limit` queries), or on the held-out last HELD_OUT_QUERIES train queries;
    `embed` replaces the embedding cache (the shared-state path)."""
    from docembed.evaluation import EvalOptions
    from docembed.evaluation.tasks import ParaphraseIdentification, ParaphraseIdentificationTrain
    from docembed.training.nugget_recipe import HELD_OUT_QUERIES

    docs, queries = _pi_data(split)
    if split == "dev":
        return ParaphraseIdentification(docs, queries, EvalOptions(limit=limit), embed=embed)
    return ParaphraseIdentificationTrain(docs, queries[-HELD_OUT_QUERIES:], EvalOptions(), embed=embed)


def _pi(model, label: str, table: dict, split: str, limit: int | None) -> dict:
    from docembed.evaluation import cached_encode

    started = time.perf_counter()
    evaluator = _evaluator(split, limit)
    result = evaluator.run(model)
    row = {
        "mrr": round(result.score, 2),
        "top1": round(result.metrics["top1"], 2),
        "queries": result.metrics["queries"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    RECIPROCAL_RANKS[split, label] = result.metrics["per_item"]["mrr"]
    if getattr(model, "multi_vector", False):
        # the harness's own texts and order: a cache hit
        vectors = cached_encode(model, evaluator.evaluated_texts(), 32)
        row["vectors_per_doc"] = round(float(vectors.counts.mean()), 2)
    table[label] = row
    print(f"PI {split} {label}: {row}", file=sys.stderr, flush=True)
    return row


def training_texts(pairs: Path) -> list[str]:
    rows = [json.loads(line) for line in pairs.read_text(encoding="utf-8").splitlines()]
    return list(dict.fromkeys([r["source"] for r in rows] + [r["target"] for r in rows]))


def warm_start(label: str, shipped, pairs: Path, **options):
    """An untrained NUGGET (MiniLM warm start, seeded), reading MAX_LENGTH tokens; an IDF table when its
    selector needs one (the shipped model's, else fitted on the training text)."""
    import torch

    from docembed.models.nugget import NuggetConfig, NuggetEncoder

    torch.manual_seed(0)
    encoder = NuggetEncoder(NuggetConfig(max_length=MAX_LENGTH, **options), name=label)
    if encoder.config.uses_idf:
        if shipped is not None and hasattr(shipped.model, "idf"):
            encoder.model.idf.copy_(shipped.model.idf)
            encoder.fitted_on = f"idf of {shipped.source}"
        else:
            encoder.fit_idf(training_texts(pairs))
    return encoder


def sbert(spec: str):
    from docembed.models.sbert import SBertConfig, SBertEncoder

    output = "tokens" if spec == "sbert-tokens" else "mean"
    return SBertEncoder(SBertConfig(output=output, max_seq_length=MAX_LENGTH), name=spec)


def shared_states(reference, texts: list[str]) -> dict:
    """The frozen MiniLM encoder's token states (layer l and last) of every document of a PI split,
    computed once. A NUGGET model whose states are these (`shares_states`: whole encoder frozen, no feedback,
    the MiniLM backbone) then encodes any r with selection + W_V alone (`NuggetEncoder.encode_from_states`).
    The bench checks that on the shipped model against its real `encode` (the `state_sharing_check`)."""
    return reference.token_states(texts)


def shares_states(model) -> bool:
    return model.model.cacheable and model.config.backbone == "minilm" and model.config.scorer_layer == 3


def _pi_states(model, shared: dict, label: str, table: dict, split: str, limit: int | None) -> dict:
    started = time.perf_counter()

    def from_states(model, texts):  # no embedding cache: nothing to reuse
        return model.encode_from_states(texts, shared)

    evaluator = _evaluator(split, limit, embed=from_states)
    result = evaluator.run(model)
    row = {
        "mrr": round(result.score, 2),
        "top1": round(result.metrics["top1"], 2),
        "queries": result.metrics["queries"],
        "seconds": round(time.perf_counter() - started, 1),
        "vectors_per_doc": round(float(from_states(model, evaluator.evaluated_texts()).counts.mean()), 2),
        "via": "shared token states",
    }
    RECIPROCAL_RANKS[split, label] = result.metrics["per_item"]["mrr"]
    table[label] = row
    print(f"PI {split} {label}: {row}", file=sys.stderr, flush=True)
    return row


def versus(mine, reference) -> dict:
    """`mine` minus `reference`, per-query reciprocal ranks of the same queries, in x100 points: the mean,
    the standard error of the paired difference and how many queries changed rank."""
    from docembed.evaluation.statistics import paired_difference

    paired = paired_difference(mine, reference)
    return {"diff": paired["diff"], "se": paired["se"], "queries_changed": paired["changed"]}


def pair_with_rule(table: dict, split: str) -> None:
    """Each NUGGET row minus the IDF rule at the same r on the same queries (`paired_difference`), as
    `vs_idf_rule`: so "above the rule" can be told from noise."""
    for label, row in table.items():
        if " r=" not in label or label.startswith(RULE):
            continue
        rule = RECIPROCAL_RANKS.get((split, f"{RULE} r={label.rsplit(' r=', 1)[1]}"))
        mine = RECIPROCAL_RANKS.get((split, label))
        if rule is not None and mine is not None and len(rule) == len(mine):
            row["vs_idf_rule"] = versus(mine, rule)


def _split_texts(split: str) -> list[str]:
    """Every document the harness embeds on the split (dev: all queries; train: the held-out ones)."""
    return _evaluator(split, None).evaluated_texts()


def long_training_documents(count: int, seed: int = 7) -> list[str]:
    """`count` long IMDB and 20NG *train* documents (half from each, seeded), none of them in halves-val
    (the validation task a halves-trained model is chosen on)."""
    import numpy as np

    from docembed.evaluation import EvalOptions
    from docembed.evaluation.long_documents import HalvesValidation, long_rows

    held = set(HalvesValidation.from_data_root(EvalOptions()).documents)
    rng = np.random.default_rng(seed)
    chosen = []
    for name in HalvesValidation.datasets:
        rows = [r["text"] for r in long_rows(name, None, rng, 10**9) if r["text"] not in held]
        picked = rng.choice(len(rows), size=min(count // 2, len(rows)), replace=False)
        chosen += [rows[i] for i in sorted(picked)]
    return chosen


def main(
    out_dir: Path,
    full: bool = False,
    model_dir: Path = DEFAULT_MODEL,
    variants: dict[str, Path] | None = None,
    pairs: Path = DEFAULT_PAIRS,
) -> dict:
    import torch

    from docembed.evaluation import load_evaluation_model
    from docembed.models.registry import load_model
    from docembed.training.nugget_recipe import HELD_OUT_QUERIES, write_training_pairs

    limit = None if full else QUICK_QUERIES
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"no trained NUGGET model at {model_dir}: train one first (see README)")
    if not pairs.exists():
        write_training_pairs(pairs)
    shipped = load_model(str(model_dir))
    shipped.config.max_length = MAX_LENGTH
    results: dict = {
        "model": str(model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir),
        "config": {k: v for k, v in shipped.config.to_dict().items() if not k.endswith("_config")},
        "pi_setup": {"queries": limit or "all", "max_length": MAX_LENGTH, "candidates": 20},
        "pi_dev": {},
        "held_out_pi_train": {"queries": f"the last {HELD_OUT_QUERIES} of paraphrase_identification/train"},
        "threads": torch.get_num_threads(),
    }
    summary_path = model_dir / "train_summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        keys = ("steps", "seconds", "tokens_per_s", "tokens", "device")
        results["training"] = {k: summary.get(k) for k in keys if k in summary}
    dev, held = results["pi_dev"], results["held_out_pi_train"]

    for spec in ("tfidf", "sbert", "sbert-tokens"):
        _pi(load_evaluation_model(spec) if spec == "tfidf" else sbert(spec), spec, dev, "dev", limit)
    _write(out_dir, results)
    # The NUGGET rows. Rules and warm starts read the frozen encoder without feedback (the same states).
    rules = {
        "idf selector": warm_start("idf", shipped, pairs, selector="idf", freeze="encoder", feedback=False),
        "chunk selector": warm_start(
            "chunk", None, pairs, selector="chunk", freeze="encoder", feedback=False
        ),
    }
    nuggets = {"nugget (shipped)": shipped}
    for label, directory in (variants or {}).items():
        nuggets[label] = load_model(str(directory))
        nuggets[label].config.max_length = MAX_LENGTH
    own = {k: shipped.config.to_dict()[k] for k in ("freeze", "feedback", "idf_prior")}
    nuggets["warm start of the shipped config (untrained)"] = warm_start("warm", shipped, pairs, **own)
    shared = shared_states(rules["idf selector"], _split_texts("dev"))
    # real encode() of the shipped model at r = 0.1: the reference the shared-state path must reproduce
    shipped.set_ratio(0.1)
    real = _pi(shipped, "nugget (shipped) r=0.1, encode()", {}, "dev", limit)
    for label, model in {**nuggets, **rules}.items():
        for ratio in RATIOS:
            model.set_ratio(ratio)
            if shares_states(model):
                _pi_states(model, shared, f"{label} r={ratio}", dev, "dev", limit)
            else:
                _pi(model, f"{label} r={ratio}", dev, "dev", limit)
        _write(out_dir, results)
    pair_with_rule(dev, "dev")
    results["state_sharing_check"] = {
        "encode_mrr": real["mrr"],
        "table_mrr": dev["nugget (shipped) r=0.1"]["mrr"],
    }
    del shared

    held_shared = shared_states(rules["idf selector"], _split_texts("train"))
    for label, model in (("tfidf", load_evaluation_model("tfidf")), ("sbert-tokens", sbert("sbert-tokens"))):
        _pi(model, label, held, "train", None)
    for label, model in (("idf selector", rules["idf selector"]), ("nugget (shipped)", shipped)):
        model.set_ratio(0.1)
        if shares_states(model):
            _pi_states(model, held_shared, f"{label} r=0.1", held, "train", None)
        else:
            _pi(model, f"{label} r=0.1", held, "train", None)
    pair_with_rule(held, "train")
    _write(out_dir, results)

    results["token_statistics"] = token_statistics(shipped, limit)
    results["encode_time"] = encode_time(shipped, 256 if full else 64)
    results["reconstruction_bleu"] = (
        "not rerun: the shipped model is trained with the sim objective (no decoder)"
    )
    _write(out_dir, results)
    (out_dir / "nugget.md").write_text(markdown(results), encoding="utf-8")
    return results


def token_statistics(model, limit: int | None) -> dict:
    """What the model picks at r = 0.1 on PI dev (the paper's Figure 5), and how rare it is: the mean IDF
    (the model's table, else one fitted on these documents) of the nuggets against that of all tokens. The
    nuggets are those of the harness's encode() at r = 0.1 (an embedding-cache hit)."""
    from docembed.evaluation import cached_encode
    from docembed.models.nugget import idf_table
    from docembed.models.nugget_statistics import nugget_token_statistics

    model.set_ratio(0.1)
    texts = _evaluator("dev", limit).evaluated_texts()
    vectors = cached_encode(model, texts, 32)
    ids = model.tokenize(texts)
    items = [
        (None, vectors.positions[vectors.offsets[i] : vectors.offsets[i + 1]], ids[i])
        for i in range(len(ids))
    ]
    stats = nugget_token_statistics(items, model.tokenizer)
    table = model.model.idf if hasattr(model.model, "idf") else idf_table(ids, model.tokenizer.vocab_size)
    picked = [float(table[row[p]]) for (_, positions, row) in items for p in positions.tolist()]
    every = [float(table[t]) for row in ids for t in row]
    return {
        "ratio": 0.1,
        "documents": stats["documents"],
        "tokens": stats["tokens"],
        "nuggets": stats["nuggets"],
        "mean_idf_of_nuggets": round(sum(picked) / len(picked), 3),
        "mean_idf_of_tokens": round(sum(every) / len(every), 3),
        "top_chosen": [_rounded(row) for row in stats["rows"][:15]],
        "most_frequent": [_rounded(row) for row in stats["frequent"][:10]],
    }


def encode_time(model, documents: int) -> dict:
    """NUGGET's encode() against tokenising + the backbone encoder's own forward pass, same batching."""
    import torch

    from docembed import datasets

    model.set_ratio(0.1)
    texts = [t for t in datasets.iter_texts("paraphrase_identification/dev/docs") if t.strip()][:documents]
    tokens = sum(len(i) for i in model.tokenize(texts))
    encoder_only = model.model.backbone.encoder

    def plain() -> None:
        with torch.no_grad():
            for _, input_ids, attention in model.padded_batches(model.tokenize(texts), 32):
                encoder_only(input_ids=input_ids, attention_mask=attention)

    timings = {}
    for label, run in (("plain_encoder_forward", plain), ("nugget_encode", lambda: model.encode(texts))):
        run()  # warm-up
        best = min(_timed(run) for _ in range(3))
        timings[label] = {"seconds": round(best, 3), "tokens_per_s": round(tokens / best, 1)}
    ratio = timings["nugget_encode"]["seconds"] / timings["plain_encoder_forward"]["seconds"]
    return {"documents": len(texts), "tokens": tokens, **timings, "nugget_time_over_plain": round(ratio, 3)}


def markdown(results: dict) -> str:
    dev = results["pi_dev"]
    lines = [
        f"PI dev MRR x100 ({results['pi_setup']['queries']} queries, 20 shuffled candidates, pessimistic "
        f"ties), every transformer model reading {MAX_LENGTH} tokens; vectors per document in brackets.",
        "",
        "| model | r=0.05 | r=0.1 | r=0.25 |",
        "|---|---|---|---|",
    ]
    labels = [k.rsplit(" r=", 1)[0] for k in dev if " r=" in k]
    for label in dict.fromkeys(labels):
        cells = []
        for ratio in RATIOS:
            row = dev.get(f"{label} r={ratio}")
            cells.append(f"{row['mrr']:.2f} ({row['vectors_per_doc']:.1f})" if row else "")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    for spec in ("sbert-tokens", "sbert", "tfidf"):
        row = dev[spec]
        vectors = f" ({row['vectors_per_doc']:.1f})" if "vectors_per_doc" in row else ""
        lines.append(f"| {spec} (all r) | | {row['mrr']:.2f}{vectors} | |")
    paired = [label for label in dict.fromkeys(labels) if "vs_idf_rule" in dev.get(f"{label} r=0.1", {})]
    if paired:
        lines += ["", "Minus the IDF rule at the same r, on the same queries (± paired standard error):", ""]
        lines += ["| model | r=0.05 | r=0.1 | r=0.25 |", "|---|---|---|---|"]
        for label in paired:
            cells = [_versus(dev.get(f"{label} r={ratio}", {})) for ratio in RATIOS]
            lines.append(f"| {label} | {' | '.join(cells)} |")
    held = results["held_out_pi_train"]
    lines += [
        "",
        f"Held-out PI train ({held['queries']}): "
        + ", ".join(
            f"{k} {v['mrr']:.2f}" + (f" ({_versus(v)} vs the rule)" if "vs_idf_rule" in v else "")
            for k, v in held.items()
            if isinstance(v, dict)
        ),
    ]
    timing = results.get("encode_time")
    if timing:
        lines.append(f"Encode time NUGGET / plain encoder forward: {timing['nugget_time_over_plain']:.2f}x")
    return "\n".join(lines) + "\n"


def _versus(row: dict) -> str:
    versus = row.get("vs_idf_rule")
    return f"{versus['diff']:+.2f} ± {versus['se']:.2f}" if versus else ""


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
    parser.add_argument("--variant", action="append", default=[], help="LABEL=DIR: another trained model.")
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument("--quick", action="store_true", help="256 dev queries instead of all 1,024.")
    parser.add_argument("--make-pairs", type=Path, help="Only write the training pairs to this file.")
    parser.add_argument("--pi-only", action="store_true", help="--make-pairs: PI train pairs only (no STS).")
    parser.add_argument(
        "--halves",
        type=int,
        default=0,
        help="--make-pairs: also the halves of this many long IMDB / 20NG *train* documents (half each), "
        "none of them in the halves-val task.",
    )
    args = parser.parse_args()
    if args.make_pairs:
        from docembed.training.nugget_recipe import write_training_pairs

        halves = long_training_documents(args.halves) if args.halves else []
        counts = write_training_pairs(args.make_pairs, sts=not args.pi_only, halves_of=halves)
        print(f"pairs {counts} -> {args.make_pairs}", file=sys.stderr)
    else:
        variants = dict(v.split("=", 1) for v in args.variant)
        variants = {k: Path(v) for k, v in variants.items()}
        print(json.dumps(main(args.out, not args.quick, args.model, variants, args.pairs), indent=2))
