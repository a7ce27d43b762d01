"""Tensor helpers shared by the neural families, and how a long text is cut: into windows of tokens
(`token_windows`), and into blocks read one at a time (`text_blocks`, `streamed_token_windows`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a tensor is made: text.py's word models read blocks without it
    import torch

# A text longer than STREAM_CHARS is read in blocks of about BLOCK_CHARS characters (tokenized, windowed and
# pooled block by block), so its cost in memory is a block's, not the text's: a 50 MB one-line document once
# took GBs in the tokenizer. Shorter texts go through in one call, as always.
STREAM_CHARS = 1_000_000
BLOCK_CHARS = 100_000
# A long text's windows go through the model at most this many tokens a batch (at least one window): the
# student's 2,048-token passes, 32 at a time, once held 1.8 GB of activations.
STREAM_BATCH_TOKENS = 8192
_BLANKS = (" ", "\n", "\t", "\r")


def is_long(text: str) -> bool:
    """Whether `text` is read in blocks (see STREAM_CHARS); read at call time, so tests can lower it."""
    return len(text) > STREAM_CHARS


def stream_batch(batch_size: int, width: int) -> int:
    """How many windows of `width` tokens a long text's batch holds: `batch_size`, or fewer to stay within
    STREAM_BATCH_TOKENS."""
    return max(1, min(batch_size, STREAM_BATCH_TOKENS // max(width, 1)))


def text_blocks(text: str, size: int | None = None, start: int = 0, stop: int | None = None) -> Iterator[str]:
    """`text[start:stop]` in consecutive pieces of at most `size` characters (BLOCK_CHARS), each cut just
    before a blank in its second half, so a blank starts the next piece: a tokenizer that splits at blanks
    (WordPiece, byte-level BPE, the word tokenizers of text.py) gives the same tokens piece by piece as for
    the whole. Only a run of size / 2 characters without a blank is cut where it is. One piece for ''."""
    size = size or BLOCK_CHARS
    stop = len(text) if stop is None else stop
    while True:
        end = start + size
        if end >= stop:
            yield text[start:stop]
            return
        cut = max(text.rfind(blank, start + size // 2, end) for blank in _BLANKS)
        end = cut if cut > start else end
        yield text[start:end]
        start = end


def tokenized_blocks(tokenize: Callable[[str], Sequence[int]], text: str) -> Iterator[Sequence[int]]:
    """`tokenize` (a text's token ids, no special tokens) applied to `text` block by block (text_blocks)."""
    for block in text_blocks(text):
        yield tokenize(block)


def streamed_token_windows(
    pieces: Iterable[Sequence[int]], width: int, overlap: int = 0
) -> Iterator[tuple[int, list[int]]]:
    """`token_windows` of the ids that `pieces` give end to end, yielded as the pieces arrive: the same
    windows in the same order, holding at most a window and a piece of ids."""
    if width < 1 or not 0 <= overlap < width:
        raise ValueError(f"windows need width >= 1 and 0 <= overlap < width, got {width}, {overlap}")
    step = width - overlap
    buffer: list[int] = []
    first = 0  # the text's token index of buffer[0]
    start = 0  # the next window's first token
    for piece in pieces:
        buffer.extend(piece)
        while start + width <= first + len(buffer):  # a full window: token_windows has it, whatever follows
            yield start, buffer[start - first : start - first + width]
            start += step
        if start > first:
            del buffer[: start - first]
            first = start
    total = first + len(buffer)
    while start < max(total - overlap, 1):  # the last, shorter windows (one empty window for no ids)
        yield start, buffer[start - first : start - first + width]
        start += step


def pad_sequences(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id sequences (lists or int arrays) -> (ids, mask), both (n, longest) int64 tensors, right-padded
    with `pad_id`; mask is 1 on real tokens. At least one column, so all-empty input still has a shape."""
    import torch

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


class GrowingRows:
    """Rows appended in batches into one array, for an output whose size is known only at the end (one huge
    document's vectors). A list of batches joined at the end holds the output twice; here the array grows in
    place (ndarray.resize: realloc, which moves a large block's pages without copying them), reserved from
    `expected` rows: pages never written are never resident, so a generous guess costs no memory.

    Past `spill_bytes` the rows go to an unnamed temporary file (in TMPDIR) instead, and the result is that
    file mapped read-only: its pages belong to the page cache, which the writers of an output release as
    they go (`release_pages`), so one document's vectors cost no more memory than a page's, however many."""

    GROWTH = 1.25  # resize zero-fills what it adds: a small step keeps that within a quarter of the output
    SPILL_BYTES = 64 << 20  # the most held in memory: small beside a page's peak (0.5 GB for nugget)

    def __init__(self, dim: int, dtype=np.float32, expected: int = 1024, spill_bytes: int | None = None):
        self._dtype = np.dtype(dtype)
        self._dim = dim
        self._spill_rows = max(
            (self.SPILL_BYTES if spill_bytes is None else spill_bytes) // self._row_bytes, 1
        )
        self._rows = np.empty((min(max(int(expected), 1), self._spill_rows), dim), dtype=dtype)
        self._count = 0
        self._file = None

    @property
    def _row_bytes(self) -> int:
        return self._dim * self._dtype.itemsize

    def extend(self, rows: np.ndarray) -> None:
        needed = self._count + len(rows)
        if self._file is None and needed > self._spill_rows:
            self._spill()
        if self._file is not None:
            self._file.write(np.ascontiguousarray(rows, dtype=self._dtype).data)
            self._count = needed
            return
        if needed > len(self._rows):
            grown = max(needed, int(len(self._rows) * self.GROWTH) + 1)
            self._rows.resize((grown, self._rows.shape[1]), refcheck=False)  # no view of it exists yet
        self._rows[self._count : needed] = rows
        self._count = needed

    def _spill(self) -> None:
        import tempfile

        # unnamed, so gone with the process; closed in result() (the map keeps its own handle)
        self._file = tempfile.TemporaryFile(prefix="docembed-rows-")  # noqa: SIM115
        self._file.write(self._rows[: self._count].data)
        self._rows = None

    def result(self) -> np.ndarray:
        """The rows appended, as one array (the reserve past them given back); the buffer is spent. Spilled
        rows come back as a read-only memory map of their file."""
        if self._file is not None:
            handle, self._file = self._file, None
            handle.flush()
            with handle:  # the map keeps its own handle on the file
                return np.memmap(handle, dtype=self._dtype, mode="r", shape=(self._count, self._dim))
        rows, self._rows = self._rows, None
        rows.resize((self._count, rows.shape[1]), refcheck=False)
        return rows


def mapped_file(array: np.ndarray):
    """The memory map `array` is a view of (a spilled `GrowingRows` result), or None."""
    import mmap

    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = getattr(base, "base", None)
    return None


def release_pages(array: np.ndarray) -> None:
    """Drop the pages of a memory-mapped `array` from this process (they stay in the page cache, read again
    on use): a writer going through a mapped output a block at a time calls this after each block, so the
    whole file is never resident at once. Nothing for an array in memory."""
    import mmap

    mapped = mapped_file(array)
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def write_rows(handle, array: np.ndarray, rows_at_once: int = 65536) -> None:
    """`array`'s bytes (C order) written to `handle` a block of rows at a time, a mapped array's pages
    released after each block: `array.tofile` would make all of a mapped output resident."""
    for start in range(0, len(array), rows_at_once):
        handle.write(np.ascontiguousarray(array[start : start + rows_at_once]).data)
        release_pages(array)
