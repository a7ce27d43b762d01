"""The types every layer shares: dense and multi-vector embeddings, normalisation, a hash of texts.
Everything else in docembed depends downward on this module; it depends on nothing of docembed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class MultiVectors:
    """Variable-length sets of vectors, stored flat: document i owns rows offsets[i]:offsets[i+1] of
    `vectors`; `positions` (optional) holds the token index each vector came from."""

    vectors: np.ndarray
    offsets: np.ndarray
    positions: np.ndarray | None = None

    def __post_init__(self):
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        if self.offsets[0] != 0 or self.offsets[-1] != len(self.vectors) or np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must start at 0, be non-decreasing and end at len(vectors)")
        if self.positions is not None and len(self.positions) != len(self.vectors):
            raise ValueError("positions must have one entry per vector")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.vectors[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def to_list(self) -> list[np.ndarray]:
        """One `(k_i, dim)` array per document (views into `vectors`, no copy)."""
        return list(self)

    def mean(self) -> np.ndarray:
        """One vector per document: the mean of its vectors (zeros for a document with none)."""
        counts = self.counts
        sums = np.zeros((len(self), self.dim), dtype=np.float64)
        np.add.at(sums, np.repeat(np.arange(len(self)), counts), self.vectors)
        return (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_list(cls, items: Sequence[np.ndarray], positions: Sequence[np.ndarray] | None = None):
        dim = items[0].shape[1] if items else 0
        vectors = np.concatenate(items).astype(np.float32, copy=False) if items else np.zeros((0, dim))
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in items])])
        pos = np.concatenate(positions).astype(np.int64) if positions is not None and items else None
        return cls(vectors, offsets, pos)

    @classmethod
    def concat(cls, parts: Sequence[MultiVectors]) -> MultiVectors:
        vectors = np.concatenate([p.vectors for p in parts])
        sizes = np.concatenate([p.counts for p in parts])
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        has_pos = all(p.positions is not None for p in parts)
        positions = np.concatenate([p.positions for p in parts]) if has_pos else None
        return cls(vectors, offsets, positions)

    def select(self, indices: Sequence[int]) -> MultiVectors:
        return MultiVectors.from_list(
            [self[i] for i in indices],
            None
            if self.positions is None
            else [self.positions[self.offsets[i] : self.offsets[i + 1]] for i in indices],
        )


Vectors = np.ndarray | MultiVectors


def concat_vectors(parts: Sequence[Vectors]) -> Vectors:
    if parts and isinstance(parts[0], MultiVectors):
        return MultiVectors.concat(parts)
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


@dataclass
class EmbeddingSet:
    """Embeddings with their document ids and metadata: what `encode` writes and `load_embeddings` reads."""

    data: Vectors
    ids: list[str]
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if len(self.ids) != len(self.data):
            raise ValueError(f"{len(self.ids)} ids for {len(self.data)} embeddings")

    @property
    def is_multi(self) -> bool:
        return isinstance(self.data, MultiVectors)

    @property
    def dim(self) -> int:
        return self.data.dim if self.is_multi else int(self.data.shape[1])

    def __len__(self) -> int:
        return len(self.ids)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, eps)


def normalize_vectors(data: Vectors) -> Vectors:
    if isinstance(data, MultiVectors):
        return MultiVectors(l2_normalize(data.vectors), data.offsets, data.positions)
    return l2_normalize(data)


def texts_hash(texts: Sequence[str]) -> str:
    """A stable hash of an ordered list of texts (length-prefixed, so boundaries count)."""
    digest = hashlib.sha256()
    for text in texts:
        blob = text.encode("utf-8")
        digest.update(len(blob).to_bytes(8, "little"))
        digest.update(blob)
    return digest.hexdigest()[:16]
