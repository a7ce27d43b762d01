"""Streaming a corpus through an Encoder into an EmbeddingSet (what `docembed encode` runs)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from docembed.errors import DocembedError
from docembed.io.embeddings import EmbeddingSet, MultiVectors, Vectors, concat_vectors
from docembed.io.readers import Document, batched
from docembed.models.base import Encoder
from docembed.runtime import debug, progress_bar, raise_if_interrupted


def encode_documents(
    model: Encoder,
    documents: Iterable[Document],
    batch_size: int = 32,
    chunk_size: int = 1024,
    total: int | None = None,
) -> EmbeddingSet:
    """Encode `documents` chunk by chunk: memory holds one chunk of text plus the output so far."""
    ids: list[str] = []
    parts = []
    started = time.perf_counter()
    with progress_bar(f"encode [{model.name}]", total=total) as bar:
        for chunk in batched(documents, chunk_size):
            raise_if_interrupted()
            parts.append(model.encode([doc.text for doc in chunk], batch_size=batch_size))
            ids.extend(doc.id for doc in chunk)
            bar.advance(len(chunk))
            debug(f"encoded chunk {len(parts)} ({len(ids)} documents so far)")
            bar.update(docs_per_s=len(ids) / max(time.perf_counter() - started, 1e-9))
    if not parts:
        raise DocembedError("no documents to encode: the input is empty")
    return EmbeddingSet(_assemble(parts), ids, model.metadata())


def _assemble(parts: list) -> Vectors:
    """Concatenate encoded chunks, freeing each once copied: peak memory is the output plus one chunk,
    not twice the output (as np.concatenate over a list that still holds every chunk would be)."""
    if isinstance(parts[0], MultiVectors):
        return concat_vectors(parts)
    out = np.empty((sum(len(p) for p in parts), parts[0].shape[1]), dtype=parts[0].dtype)
    row = 0
    parts.reverse()
    while parts:
        chunk = parts.pop()
        out[row : row + len(chunk)] = chunk
        row += len(chunk)
    return out
