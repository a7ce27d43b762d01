"""Exporting a training run into the zoo and the regression check each shipped model states. Tooling for
scripts/zoo.py, scripts/make_zoo.py and tests; loading lives in docembed.models.zoo, which this module sits
above (it runs the evaluation harness)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from docembed.errors import DocembedError
from docembed.models.offline import BASES
from docembed.models.zoo import (
    CARD_NAME,
    CHECK_NAME,
    FP16_TOLERANCE,
    OVERLAY_NAME,
    ZOO_DIR,
    base_record,
    load,
    rebuild,
)

# --- export ---------------------------------------------------------------------------------------------


def overlay_state(family: str, config: dict[str, Any], files: Path, trained_state: dict) -> dict:
    """The tensors of `trained_state` that a rebuild from the base does not reproduce: those that differ
    from the rebuild, and those the rebuild draws at random (they differ between two seeds)."""
    import torch

    first = rebuild(family, config, files, seed=0).weights_module
    second = rebuild(family, config, files, seed=1).weights_module
    base_a, base_b = first.state_dict(), second.state_dict()
    missing = [k for k in base_a if k not in trained_state]
    unknown = [k for k in trained_state if k not in base_a]
    if unknown:
        raise DocembedError(f"the trained model has tensors its base rebuild lacks: {unknown[:5]}")
    kept, seen = {}, {}
    for key, tensor in trained_state.items():
        deterministic = torch.equal(base_a[key], base_b[key])
        if deterministic and torch.equal(tensor, base_a[key]):
            continue
        pointer = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and pointer in seen:  # a tied weight: loading one copy sets both
            continue
        seen[pointer] = key
        kept[key] = tensor.detach().cpu().contiguous()
    if missing:
        tied = {k for k in missing if not torch.equal(base_a[k], base_b[k])}
        if tied:
            raise DocembedError(f"the trained model lacks randomly initialised tensors: {sorted(tied)[:5]}")
    return kept


def _scores(encoder, texts: list[str]):
    """Pairwise similarity of `texts` under `encoder` (cosine, or mean-MaxSim for multi-vector models)."""
    import numpy as np

    from docembed.scoring import cosine_matrix, maxsim_one_to_many
    from docembed.types import MultiVectors

    vectors = encoder.encode(texts)
    if isinstance(vectors, MultiVectors):
        return np.stack([maxsim_one_to_many(vectors[i], vectors) for i in range(len(texts))])
    return cosine_matrix(vectors, vectors)


def export(
    run_dir: str | Path,
    name: str,
    card_source: str | Path | None = None,
    dtype: str = "auto",
    check_texts: list[str] | None = None,
    zoo_dir: str | Path | None = None,
    drop: list[str] | None = None,
) -> dict[str, Any]:
    """Write zoo/<name>/ from a trained model directory: the overlay, its config with the base's hash, the
    family's extra files and the card. Tensors whose names start with a `drop` prefix are not shipped (they
    stay as rebuilt: NUGGET's decoder, which encoding never runs). Returns a summary (tensors kept, bytes,
    the fp16 check)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from docembed.models.base import read_config
    from docembed.models.families import get_family
    from docembed.models.registry import load_model

    run_dir = Path(run_dir)
    payload = read_config(run_dir)
    family = payload["family"]
    base_name = get_family(family).offline_base(payload["config"])
    if base_name is None:
        raise DocembedError(f"this {family} model does not start from an offline base, so it cannot ship")
    base = BASES[base_name]
    trained = load_model(str(run_dir))
    kept = overlay_state(family, payload["config"], run_dir, trained.weights_module.state_dict())
    drop = list(drop or [])
    kept = {k: v for k, v in kept.items() if not k.startswith(tuple(drop))} if drop else kept

    target = Path(zoo_dir or ZOO_DIR) / name
    staging = target.with_name(f".{name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for filename in get_family(family).base_files:
        shutil.copy2(run_dir / filename, staging / filename)
    texts = check_texts or DEFAULT_CHECK_TEXTS
    reference = _scores(trained, texts)
    summary: dict[str, Any] = {"name": name, "family": family, "tensors": len(kept)}
    chosen = "float32"
    for candidate in (["float16"] if dtype == "auto" else []) + ["float32"]:
        if dtype not in ("auto", candidate):
            continue
        cast = {
            k: v.to(torch.float16) if v.is_floating_point() and candidate == "float16" else v
            for k, v in kept.items()
        }
        save_file(cast, str(staging / OVERLAY_NAME))
        record = {
            "base": base_record(base),
            "dtype": candidate,
            "seed": 0,
            "dropped": drop,
            "source_run": str(run_dir),
        }
        (staging / "config.json").write_text(json.dumps({**payload, "zoo": record}, indent=2) + "\n")
        difference = float(np.abs(_scores(load(staging, name=name), texts) - reference).max())
        summary[f"max_abs_score_diff_{candidate}"] = difference
        chosen = candidate
        if candidate == "float32" or difference <= FP16_TOLERANCE or dtype == candidate:
            break
    record["max_abs_score_diff"] = summary[f"max_abs_score_diff_{chosen}"]
    record["check_texts"] = len(texts)
    (staging / "config.json").write_text(json.dumps({**payload, "zoo": record}, indent=2) + "\n")
    if card_source and Path(card_source).exists():
        shutil.copy2(card_source, staging / CARD_NAME)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    summary.update(dtype=chosen, bytes=sum(f.stat().st_size for f in target.iterdir()), directory=str(target))
    return summary


# --- the regression check each card states -------------------------------------------------------------

# A fixed small sample per family (seed 1111), cheap enough for the default test run: STS-B pairs, a few
# hundred short sentences, which any broken tensor or wrong base moves by far more than the tolerance.
CHECKS = {
    "nugget": {"task": "stsb", "limit": 150, "metric": "spearman"},
    "student": {"task": "stsb", "limit": 40, "metric": "spearman"},  # pads every text to 256 tokens: slow
    "quickthoughts": {"task": "stsb", "limit": 300, "metric": "spearman"},
    "static": {"task": "stsb", "limit": 1000, "metric": "spearman"},
    "sbert": {"task": "stsb", "limit": 300, "metric": "spearman"},  # the retriever
}
CHECK_TOLERANCE = 0.5  # points (x100): covers BLAS and thread-count differences, not a broken export


def run_check(model, check: dict[str, Any]) -> float:
    """The check's metric for `model` (a loaded Encoder, a built-in name or a zoo directory), recomputed
    without the embedding cache."""
    from docembed.evaluation import EvalOptions, get_evaluator
    from docembed.models.registry import load_model

    options = EvalOptions(limit=check["limit"], seed=check.get("seed", 1111), fast=True, cache=False)
    encoder = load_model(str(model)) if isinstance(model, (str, Path)) else model
    result = get_evaluator(check["task"], options).run(encoder)
    return float(result.metrics[check["metric"]])


def write_check(directory: Path, family: str) -> dict[str, Any]:
    """Measure the family's check on the exported model and store it beside it (the card quotes it)."""
    check = {**CHECKS[family], "seed": 1111, "tolerance": CHECK_TOLERANCE}
    check["score"] = round(run_check(directory, check), 4)
    (directory / CHECK_NAME).write_text(json.dumps(check, indent=2) + "\n")
    return check


# Pairwise scores of these texts, before and after export, decide fp16 (and are stated on the card).
DEFAULT_CHECK_TEXTS = [
    "The film was a delight from start to finish, with a warm and funny script.",
    "A tedious, overlong movie; the actors looked as bored as I was.",
    "How do I catch an exception raised inside a thread in Python?",
    "The European Commission proposed new rules on data protection today.",
    "Stir the flour into the melted butter and cook for two minutes.",
    "The spacecraft entered orbit around Jupiter after a five-year journey.",
    "My graphics card driver crashes whenever I start the X server.",
    "Interest rates rose again, and the markets fell for the third day running.",
    "",
    "A short one.",
]
