"""Pre-trained word vectors for the word-level models (glove-avg, QuickThoughts): a word2vec/GloVe text file,
or the offline GloVe 6B 50d package."""

from __future__ import annotations

from collections.abc import Container, Sequence
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError

_OFFLINE_GLOVE: list[tuple[list[str], np.ndarray]] = []


def read_word_vectors(path: str | Path, keep: Container[str] | None = None) -> tuple[list[str], np.ndarray]:
    """Words and vectors of a GloVe (`word v1 ... vd`) or word2vec text file (a `count dim` header line is
    skipped; .gz is read as gzip). With `keep`, only the first row of each word in `keep` is kept, so a
    large file costs the memory of the words wanted only."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DocembedError(f"word vectors file not found: {path}")
    words, rows, seen = [], [], set()
    dim = None
    opener = __import__("gzip").open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line_number, line in enumerate(handle, 1):
            parts = line.rstrip().split(" ")
            if line_number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue
            if len(parts) < 2:
                continue
            if dim is None:
                dim = len(parts) - 1
            elif len(parts) - 1 != dim:
                raise DocembedError(f"{path}:{line_number}: expected {dim} numbers")
            word = parts[0]
            if keep is not None and (word not in keep or word in seen):
                continue
            try:
                rows.append(np.asarray(parts[1:], dtype=np.float32))
            except ValueError:
                raise DocembedError(f"{path}:{line_number}: not a word-vector line") from None
            words.append(word)
            seen.add(word)
    if dim is None:
        raise DocembedError(f"{path} holds no word vectors")
    matrix = np.stack(rows) if rows else np.zeros((0, dim), dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(matrix).all(axis=1))
    if len(bad):  # "nan" and "inf" parse as numbers: every text with the word would encode NaN
        raise DocembedError(f"{path}: the vector of {words[bad[0]]!r} is not finite (NaN or infinite)")
    return words, matrix


def offline_glove() -> tuple[list[str], np.ndarray]:
    """Words and vectors of the offline GloVe 6B 50d package (read once per process)."""
    if not _OFFLINE_GLOVE:
        from docembed.models.offline import glove_files

        vectors_path, words_path = glove_files()
        vectors = np.load(vectors_path).astype(np.float32, copy=False)
        _OFFLINE_GLOVE.append((_glove_words(words_path), vectors))
    return _OFFLINE_GLOVE[0]


def _glove_words(parquet_path: Path) -> list[str]:
    """The package's 400,000 words. Reading the parquet file costs about 1 s (pyarrow and pandas imports),
    more than the rest of a glove-avg command's start-up, so the list is kept once as JSON beside the other
    unpacked offline files, keyed by the parquet file's size and mtime."""
    import json

    from docembed.io.outputs import atomic_path
    from docembed.runtime import models_home

    stat = parquet_path.stat()
    cached = models_home() / "offline" / f"glove-6b-words-{stat.st_size}-{stat.st_mtime_ns}.json"
    try:
        return json.loads(cached.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    import pyarrow.parquet as pq

    words = [str(w) for w in pq.read_table(parquet_path, columns=["index"]).column("index").to_pylist()]
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cached) as tmp:
            tmp.write_text(json.dumps(words), encoding="utf-8")
    except OSError:  # a read-only home: read the parquet file each time
        pass
    return words


def base_word_vectors(vectors: str | None) -> tuple[list[str], np.ndarray]:
    """Words and vectors of a word2vec/GloVe text file (`vectors`), or the offline GloVe 6B 50d if None."""
    return offline_glove() if vectors is None else read_word_vectors(vectors)


def vocabulary_rows(words: Sequence[str], vectors: np.ndarray, vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `vectors` for the tokens of `vocabulary` (a text.Vocabulary): (matrix, found mask); the first
    row of a word wins, and rows of words not among `words` are zeros (the caller initialises them)."""
    matrix = np.zeros((len(vocabulary), vectors.shape[1]), dtype=np.float32)
    found = np.zeros(len(vocabulary), dtype=bool)
    for row, word in enumerate(words):
        index = vocabulary.index.get(word)
        if index is not None and not found[index]:
            matrix[index] = vectors[row]
            found[index] = True
    return matrix, found


def initial_embeddings(vocabulary, dim: int | None, vectors: str | None, seed: int = 0):
    """Word-embedding matrix for `vocabulary`: rows from a word2vec/GloVe text file (`vectors`), or from
    the offline GloVe 6B 50d package when `vectors` is None; words without a vector (UNK included) get
    random rows with GloVe's scale, PAD gets zeros. Returns (matrix, fraction of words found)."""
    words, table = read_word_vectors(vectors, keep=vocabulary) if vectors else offline_glove()
    matrix, found = vocabulary_rows(words, table, vocabulary)
    if dim is not None and matrix.shape[1] != dim:
        raise DocembedError(f"the word vectors have {matrix.shape[1]} dimensions, not {dim}")
    scale = float(matrix[found].std()) if found.any() else 0.1
    rng = np.random.default_rng(seed)
    missing = ~found
    matrix[missing] = rng.normal(0.0, scale, size=(int(missing.sum()), matrix.shape[1])).astype(np.float32)
    matrix[vocabulary.pad_id] = 0.0
    coverage = float(found[2:].mean()) if len(found) > 2 else 0.0
    return matrix, coverage
