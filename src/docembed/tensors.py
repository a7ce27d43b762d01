"""Tensor helpers shared by the neural families."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id sequences (lists or int arrays) -> (ids, mask), both (n, longest) int64 tensors, right-padded
    with `pad_id`; mask is 1 on real tokens. At least one column, so all-empty input still has a shape."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    width = max(1, int(lengths.max(initial=0)))
    mask = np.arange(width) < lengths[:, None]
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    if lengths.sum():
        # a boolean mask assigns in row-major order: the concatenated sequences land left-aligned in order
        ids[mask] = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences if len(s)])
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def token_windows(ids: Sequence[int], width: int, overlap: int = 0) -> list[tuple[int, Sequence[int]]]:
    """(start, ids[start:start + width]) windows that cover all of `ids`, each sharing `overlap` tokens with
    the one before; one (empty) window for no ids, so every text gets a vector."""
    if width < 1 or not 0 <= overlap < width:
        raise ValueError(f"windows need width >= 1 and 0 <= overlap < width, got {width}, {overlap}")
    step = width - overlap
    starts = range(0, max(len(ids) - overlap, 1), step)
    return [(start, ids[start : start + width]) for start in starts]


class PackedSequences:
    """Many token-id sequences in two arrays, `tokens` (all of them, end to end) and `offsets` (n + 1): a
    corpus costs 4 bytes a token, where a list of Python int lists costs about 36."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        self.tokens, self.offsets = tokens, offsets

    @classmethod
    def from_chunks(cls, chunks: Iterable[Sequence[Sequence[int]]], dtype=np.int32) -> PackedSequences:
        """From an iterable of chunks (lists of sequences), so the sequences never all exist as lists."""
        parts, lengths = [], []
        for chunk in chunks:
            lengths.extend(len(s) for s in chunk)
            parts.extend(np.asarray(s, dtype=dtype) for s in chunk)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        return cls(tokens, offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]
