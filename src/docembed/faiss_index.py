"""faiss indexes over embeddings, saved as a directory (index.faiss, ids.txt, meta.json).

Dense embeddings: inner product over L2-normalised vectors (cosine). Kinds: `flat` (exact),
`hnsw` (graph, approximate), `ivf` (inverted lists; nlist = ~sqrt(n), trained on the data).
Multi-vector embeddings (NUGGET nuggets, token vectors): every vector is indexed and remembers its
document; a query's vectors each fetch their nearest vectors, the documents they belong to become
candidates, and candidates are rescored exactly with mean-MaxSim (the vectors are kept in vectors.npy).
On a machine with faiss-gpu and `--device cuda`, search runs on the GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.io.outputs import atomic_path
from docembed.scoring import maxsim_one_to_many
from docembed.types import EmbeddingSet, MultiVectors, Vectors, l2_normalize

KINDS = ("flat", "hnsw", "ivf")


def _faiss():
    import faiss

    return faiss


def _build_faiss(vectors: np.ndarray, kind: str):
    faiss = _faiss()
    dim = vectors.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
    elif kind == "ivf":
        nlist = max(1, int(math.sqrt(len(vectors))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = max(1, nlist // 8)
    else:
        raise UsageError(f"unknown index type {kind!r}; choose one of {', '.join(KINDS)}")
    index.add(vectors)
    return index


class VectorIndex:
    def __init__(self, index, ids: list[str], metadata: dict, multi: MultiVectors | None = None):
        self.index, self.ids, self.metadata, self.multi = index, ids, metadata, multi
        self._doc_of_vector = None
        if multi is not None:
            self._doc_of_vector = np.repeat(np.arange(len(multi)), multi.counts)

    @classmethod
    def build(cls, embeddings: EmbeddingSet, kind: str = "flat") -> VectorIndex:
        if len(embeddings) == 0:
            raise DocembedError("cannot build an index over zero embeddings")
        metadata = dict(embeddings.metadata, index_kind=kind, count=len(embeddings))
        if embeddings.is_multi:
            multi = embeddings.data
            multi = MultiVectors(
                l2_normalize(multi.vectors).astype(np.float32), multi.offsets, multi.positions
            )
            return cls(_build_faiss(multi.vectors, kind), list(embeddings.ids), metadata, multi)
        vectors = l2_normalize(np.asarray(embeddings.data, dtype=np.float32))
        return cls(_build_faiss(vectors, kind), list(embeddings.ids), metadata)

    def to_gpu(self) -> VectorIndex:
        faiss = _faiss()
        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            self.index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, self.index)
        return self

    def search(self, queries: Vectors, k: int = 10) -> list[list[tuple[str, float]]]:
        """Top-k (id, score) per query, best first."""
        k = min(k, len(self.ids))
        if self.multi is None:
            if isinstance(queries, MultiVectors):
                raise UsageError("this index holds dense embeddings; encode queries with a dense model")
            scores, rows = self.index.search(l2_normalize(np.asarray(queries, dtype=np.float32)), k)
            return [
                [(self.ids[r], float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
                for row_ids, row_scores in zip(rows, scores, strict=True)
            ]
        if not isinstance(queries, MultiVectors):
            raise UsageError("this index holds multi-vector embeddings; encode queries with the same model")
        results = []
        per_vector = min(max(4 * k, 64), len(self.multi.vectors))
        for i in range(len(queries)):
            query = l2_normalize(queries[i].astype(np.float32))
            if len(query) == 0:
                results.append([])
                continue
            _, hits = self.index.search(query, per_vector)
            candidates = np.unique(self._doc_of_vector[hits[hits >= 0]])
            scores = maxsim_one_to_many(query, self.multi.select(candidates))
            order = np.argsort(-scores, kind="stable")[:k]
            results.append([(self.ids[candidates[j]], float(scores[j])) for j in order])
        return results

    def save(self, directory: str | Path) -> None:
        faiss = _faiss()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        index = self.index
        if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(index).__name__:
            index = faiss.index_gpu_to_cpu(index)
        with atomic_path(directory / "index.faiss") as tmp:
            faiss.write_index(index, str(tmp))
        (directory / "ids.txt").write_text("".join(f"{i}\n" for i in self.ids), encoding="utf-8")
        if self.multi is not None:
            np.save(directory / "vectors.npy", self.multi.vectors)
            np.save(directory / "offsets.npy", self.multi.offsets)
        (directory / "meta.json").write_text(json.dumps(self.metadata, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> VectorIndex:
        faiss = _faiss()
        directory = Path(directory)
        if not (directory / "index.faiss").exists():
            raise DocembedError(f"{directory} is not a docembed index (no index.faiss)")
        index = faiss.read_index(str(directory / "index.faiss"))
        ids = (directory / "ids.txt").read_text(encoding="utf-8").splitlines()
        metadata = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        multi = None
        if (directory / "offsets.npy").exists():
            multi = MultiVectors(np.load(directory / "vectors.npy"), np.load(directory / "offsets.npy"))
        return cls(index, ids, metadata, multi)
