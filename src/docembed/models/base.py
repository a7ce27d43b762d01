"""The one interface every model family implements, and the save/load format they share.

A saved model is a directory: `config.json` ({"family", "docembed_version", "config": {...}}), the weights in
`model.safetensors`, plus whatever tokenizer or vocabulary files the family needs - never a pickle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from docembed import __version__
from docembed.errors import CorruptModelError
from docembed.io.embeddings import MultiVectors, Vectors

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclasses.dataclass
class EncoderConfig:
    """Base of every family's config dataclass: JSON round trip and a stable hash."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise CorruptModelError(f"unknown {cls.__name__} fields: {', '.join(sorted(unknown))}")
        return cls(**values)

    def hash(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class Encoder(ABC):
    """texts -> embeddings. Dense families return an `(n, dim)` float32 array, multi-vector families a
    `MultiVectors`. Subclasses set `family`, `config_class`, and implement encode/save/load."""

    family: ClassVar[str] = ""
    config_class: ClassVar[type[EncoderConfig]] = EncoderConfig

    def __init__(self, config: EncoderConfig, name: str | None = None):
        self.config = config
        self.name = name or self.family
        # Where the model was loaded from, when it was: fitted state (weights, vocabulary) lives there,
        # so caches key on it as well as on the config.
        self.source: str | None = None

    # --- what a family provides ---------------------------------------------------------------------
    @abstractmethod
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        """Embed `texts`; one row (dense) or one set of vectors (multi-vector) per text, empty texts too."""

    @abstractmethod
    def save(self, directory: str | Path) -> None: ...

    @classmethod
    @abstractmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> Encoder: ...

    @property
    def multi_vector(self) -> bool:
        return False

    @property
    def requires_fit(self) -> bool:
        """True for families fitted on the task's own text (tfidf, bm25) until `fit(texts)` has run."""
        return False

    @property
    def normalized(self) -> bool:
        """Whether encode() returns unit-length vectors (cosine = dot product)."""
        return False

    @property
    def dim(self) -> int:
        return int(self.encode([""]).dim if self.multi_vector else self.encode([""]).shape[1])

    def to(self, device: str) -> Encoder:
        return self

    # --- shared behaviour ---------------------------------------------------------------------------
    def config_hash(self) -> str:
        return self.config.hash()

    def metadata(self) -> dict[str, Any]:
        meta = {
            "model": self.name,
            "family": self.family,
            "config_hash": self.config_hash(),
            "normalized": self.normalized,
            "docembed_version": __version__,
        }
        if self.source:
            meta["model_source"] = self.source
        return meta

    # --- the shared directory format ----------------------------------------------------------------
    def write_config(self, directory: str | Path, **extra: Any) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "family": self.family,
            "docembed_version": __version__,
            "config": self.config.to_dict(),
            **extra,
        }
        (directory / CONFIG_NAME).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        return directory


def read_config(directory: str | Path) -> dict[str, Any]:
    """The parsed config.json of a saved model, or a CorruptModelError that says what is wrong."""
    path = Path(directory) / CONFIG_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory} is not a docembed model: no {CONFIG_NAME}")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptModelError(f"{path} is corrupt: {error}") from None
    if not isinstance(payload, dict) or "family" not in payload:
        raise CorruptModelError(f"{path} has no 'family' entry")
    return payload


def save_state_dict(module, directory: str | Path) -> None:
    """Weights as safetensors. Tied parameters are saved once (safetensors refuses shared storage)."""
    from safetensors.torch import save_file

    state, seen = {}, set()
    for key, tensor in module.state_dict().items():
        pointer = (tensor.data_ptr(), tuple(tensor.shape)) if tensor.numel() else None
        if pointer is not None and pointer in seen:
            continue
        if pointer is not None:
            seen.add(pointer)
        state[key] = tensor.detach().contiguous().cpu()
    save_file(state, str(Path(directory) / WEIGHTS_NAME))


def load_state_dict(module, directory: str | Path, device: str = "cpu") -> None:
    """Load model.safetensors into `module`; a truncated file or a key mismatch is a CorruptModelError."""
    from safetensors.torch import load_file

    path = Path(directory) / WEIGHTS_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory}: {WEIGHTS_NAME} is missing")
    try:
        state = load_file(str(path), device=device)
    except Exception as error:  # safetensors raises its own error types for truncated headers/data
        raise CorruptModelError(f"{path} is corrupt or truncated: {error}") from None
    missing, unexpected = module.load_state_dict(state, strict=False)
    # Tied weights were saved once; anything else missing means the file does not match the config.
    tied = {k for k in missing if _is_tied(module, k, state)}
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise CorruptModelError(
            f"{path} does not match its config: missing {missing[:5]}, unexpected {list(unexpected)[:5]}"
        )


def _is_tied(module, key: str, state: dict) -> bool:
    params = dict(module.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    target = params[key]
    return any(p is target for name, p in params.items() if name in state)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, eps)


def normalize_vectors(data: Vectors) -> Vectors:
    if isinstance(data, MultiVectors):
        return MultiVectors(l2_normalize(data.vectors), data.offsets, data.positions)
    return l2_normalize(data)
