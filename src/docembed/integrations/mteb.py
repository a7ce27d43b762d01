"""docembed in MTEB (`pip install 'docembed[mteb]'`): an encoder MTEB's own `mteb.evaluate` runs.

import mteb
from docembed.integrations.mteb import MtebEncoder
results = mteb.evaluate(MtebEncoder("sbert"), mteb.get_tasks(["STSBenchmark"]))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from docembed.integrations import as_model, missing_extra
from docembed.scoring import maxsim_one_to_many
from docembed.types import MultiVectors, l2_normalize, normalize_vectors

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta
except ImportError as error:  # pragma: no cover - the extra is installed in the test environment
    raise missing_extra("mteb", "mteb") from error

MULTI_VECTOR = ("mean", "maxsim")
# Tasks that score queries against a corpus through `similarity` alone: for these a multi-vector model's
# encode gives its vector sets, zero-padded. Every other task (STS, pair classification, clustering,
# classification, ...) also uses the embeddings themselves as rows (paired cosine, features): it gets
# one pooled vector per text, and `similarity` / `similarity_pairwise` find each row's vector set again.
SEARCH_TASKS = frozenset(
    {
        "Retrieval",
        "Reranking",
        "InstructionRetrieval",
        "InstructionReranking",
        "Any2AnyRetrieval",
        "Any2AnyMultilingualRetrieval",
        "Any2AnyReranking",
    }
)


class MtebEncoder(AbsEncoder):
    """A docembed model as an MTEB encoder. Queries and documents get the model's prompts (the same text
    when it has none). A multi-vector model is mean-pooled (multi_vector="mean", cosine) or kept as
    zero-padded vector sets scored with docembed's mean-MaxSim (multi_vector="maxsim"). With "maxsim", a
    task outside retrieval (STS compares pairs by cosine, distances and the model's `similarity_pairwise`)
    gets the mean-pooled vectors, and the model's own scores are the mean-MaxSim of each row's vector set,
    kept beside them for the task in progress."""

    def __init__(self, model="sbert", device: str = "auto", batch_size: int = 32, multi_vector: str = "mean"):
        if multi_vector not in MULTI_VECTOR:
            raise ValueError(f"multi_vector must be one of {MULTI_VECTOR}, not {multi_vector!r}")
        self.model = as_model(model, device)
        self.batch_size = batch_size
        self.keep_vectors = self.model.is_multi_vector and multi_vector == "maxsim"
        # pooled row (its bytes) -> the vector set it stands for, for the task in progress only
        self._sets: dict[bytes, np.ndarray] = {}
        self._sets_for: tuple | None = None
        from docembed.version import __version__

        self.mteb_model_meta = ModelMeta.create_empty(
            {
                "name": f"docembed/{self.model.name}",
                "revision": __version__,
                "embed_dim": self.model.dim,
                "max_tokens": self.model.max_tokens,
                "framework": [],
                "open_weights": True,
            }
        )

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs: Any):
        texts = [text for batch in inputs for text in batch["text"]]
        query = getattr(prompt_type, "value", prompt_type) == "query"
        encode = self.model.encode_query if query else self.model.encode_document
        if not self.keep_vectors:
            return encode(texts, self.batch_size, normalize_embeddings=True, pooling="mean")
        task_type = getattr(task_metadata, "type", None)
        if task_metadata is None or task_type in SEARCH_TASKS:
            return _padded(encode(texts, self.batch_size, normalize_embeddings=True))
        sets = encode(texts, self.batch_size)
        return self._pooled_keeping_sets(sets, (getattr(task_metadata, "name", None), hf_split, hf_subset))

    def _pooled_keeping_sets(self, sets: MultiVectors, task: tuple) -> np.ndarray:
        """The pooled unit vector of each set (as multi_vector="mean" gives it), each remembered with its
        unit-length vector set; the sets of an earlier task are dropped."""
        if task != self._sets_for:
            self._sets, self._sets_for = {}, task
        pooled = l2_normalize(sets.mean())
        for row, vectors in zip(pooled, normalize_vectors(sets), strict=True):
            self._sets[_key(row)] = vectors
        return pooled

    def _sets_of(self, rows: np.ndarray) -> MultiVectors:
        """The vector sets behind rows: zero-padded sets (3-D), or pooled rows that encode remembered."""
        if rows.ndim == 3:
            return _unpadded(rows)
        rows = np.atleast_2d(rows)
        try:
            return MultiVectors.from_list([self._sets[_key(row)] for row in rows], None)
        except KeyError:
            raise ValueError(
                "multi_vector='maxsim' scores the rows its own encode returned for the task in progress; "
                "these are other vectors"
            ) from None

    def similarity(self, embeddings1, embeddings2):
        left, right = np.asarray(embeddings1, dtype=np.float32), np.asarray(embeddings2, dtype=np.float32)
        if not self.keep_vectors:
            return l2_normalize(np.atleast_2d(left)) @ l2_normalize(np.atleast_2d(right)).T
        documents = self._sets_of(right)
        return np.stack([maxsim_one_to_many(query, documents) for query in self._sets_of(left)])

    def similarity_pairwise(self, embeddings1, embeddings2):
        """Each pair's score: cosine, or with multi_vector="maxsim" the mean-MaxSim of the first's vectors
        against the second's (what an STS task asks of the model)."""
        left, right = np.asarray(embeddings1, dtype=np.float32), np.asarray(embeddings2, dtype=np.float32)
        if not self.keep_vectors:
            return np.sum(l2_normalize(np.atleast_2d(left)) * l2_normalize(np.atleast_2d(right)), axis=1)
        pairs = zip(self._sets_of(left), self._sets_of(right), strict=True)
        return np.array(
            [maxsim_one_to_many(q, MultiVectors.from_list([d]))[0] for q, d in pairs], dtype=np.float32
        )


def _padded(sets: MultiVectors) -> np.ndarray:
    """(n, longest, dim), zero rows after each set's own vectors (unit vectors are never zero)."""
    out = np.zeros((len(sets), max(sets.counts.max(initial=0), 1), sets.dim), dtype=np.float32)
    for row, vectors in enumerate(sets):
        out[row, : len(vectors)] = vectors
    return out


def _key(row: np.ndarray) -> bytes:
    return np.ascontiguousarray(row, dtype=np.float32).tobytes()


def _unpadded(padded: np.ndarray) -> MultiVectors:
    return MultiVectors.from_list([vectors[np.any(vectors != 0, axis=1)] for vectors in padded])
