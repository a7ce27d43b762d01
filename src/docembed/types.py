"""The types every layer shares: dense and multi-vector embeddings, normalisation, a hash of texts.
Everything else in docembed depends downward on this module; it depends on nothing of docembed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from docembed.tensors import mapped_file


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
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"text {i} of a set of {n}")
        i %= n  # -1 is the last text, as a list's
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
    def from_list(
        cls,
        items: Sequence[np.ndarray],
        positions: Sequence[np.ndarray] | None = None,
        consume: bool = False,
    ) -> MultiVectors:
        """One set per item (a `(k_i, dim)` array), its vectors copied once into a new float32 array.
        `consume`: `items` (a list) is handed over: emptied as it is copied, so an array nothing else holds
        is freed at once, and a lone float32 array that owns its memory is taken as it is, so that a set
        as large as one huge document's is never held twice."""
        if not items:
            return cls(np.zeros((0, 0)), np.zeros(1, dtype=np.int64), None)
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in items])])
        pos = np.concatenate(positions).astype(np.int64) if positions is not None else None
        return cls(stack_rows(items, np.float32, consume), offsets, pos)

    @classmethod
    def concat(cls, parts: Sequence[MultiVectors], consume: bool = False) -> MultiVectors:
        """The sets of `parts`, one after the other. `consume`: `parts` (a list) is handed over, as in
        `from_list`: a lone part is returned as it is, the others are freed as they are copied."""
        if consume and len(parts) == 1:
            return parts.pop()
        sizes = np.concatenate([p.counts for p in parts])
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        has_pos = all(p.positions is not None for p in parts)
        positions = np.concatenate([p.positions for p in parts]) if has_pos else None
        vectors = [p.vectors for p in parts]
        if consume:
            parts.clear()  # `vectors` holds the only references: each array goes once it is copied
        dtype = np.result_type(*{v.dtype for v in vectors})  # np.concatenate's, not capped at 64 arrays
        return cls(stack_rows(vectors, dtype, consume), offsets, positions)

    def select(self, indices: Sequence[int]) -> MultiVectors:
        return MultiVectors.from_list(
            [self[i] for i in indices],
            None
            if self.positions is None
            else [self.positions[self.offsets[i] : self.offsets[i + 1]] for i in indices],
        )


Vectors = np.ndarray | MultiVectors


def stack_rows(items: Sequence[np.ndarray], dtype, consume: bool = False) -> np.ndarray:
    """`items` (2-d arrays of one width) one under the other in a new array of `dtype`, each copied (and
    cast) once into place: np.concatenate(...).astype(...) would make two. `consume`: `items` (a list) is
    emptied as it is copied, so each array nothing else holds is freed at once (the peak is the output and
    one item, not twice the output), and a lone item of `dtype` that owns its memory is returned as it is."""
    if not items:
        raise ValueError("need at least one array to stack")
    width = items[0].shape[1]
    if any(item.ndim != 2 or item.shape[1] != width for item in items):
        raise ValueError(f"every array to stack must be 2-d of width {width}")
    lone = items[0]
    owned = lone.base is None or mapped_file(lone) is not None  # a spilled output's map is the output too
    if consume and len(items) == 1 and lone.dtype == dtype and owned and lone.flags.c_contiguous:
        return items.pop()
    out = np.empty((sum(len(item) for item in items), width), dtype=dtype)
    row = 0
    if consume:
        items.reverse()  # popped from the end, in order
    for index in range(len(items)):
        item = items.pop() if consume else items[index]
        out[row : row + len(item)] = item
        row += len(item)
    return out


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
