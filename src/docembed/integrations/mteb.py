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
from docembed.types import MultiVectors, l2_normalize

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta
except ImportError as error:  # pragma: no cover - the extra is installed in the test environment
    raise missing_extra("mteb", "mteb") from error

MULTI_VECTOR = ("mean", "maxsim")


class MtebEncoder(AbsEncoder):
    """A docembed model as an MTEB encoder. Queries and documents get the model's prompts (the same text
    when it has none). A multi-vector model is mean-pooled (multi_vector="mean", cosine) or kept as
    zero-padded vector sets scored with docembed's mean-MaxSim (multi_vector="maxsim")."""

    def __init__(self, model="sbert", device: str = "auto", batch_size: int = 32, multi_vector: str = "mean"):
        if multi_vector not in MULTI_VECTOR:
            raise ValueError(f"multi_vector must be one of {MULTI_VECTOR}, not {multi_vector!r}")
        self.model = as_model(model, device)
        self.batch_size = batch_size
        self.keep_vectors = self.model.is_multi_vector and multi_vector == "maxsim"
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
        return _padded(encode(texts, self.batch_size, normalize_embeddings=True))

    def similarity(self, embeddings1, embeddings2):
        left, right = np.asarray(embeddings1, dtype=np.float32), np.asarray(embeddings2, dtype=np.float32)
        if not self.keep_vectors:
            return l2_normalize(np.atleast_2d(left)) @ l2_normalize(np.atleast_2d(right)).T
        documents = _unpadded(right)
        return np.stack([maxsim_one_to_many(query, documents) for query in _unpadded(left)])

    def similarity_pairwise(self, embeddings1, embeddings2):
        left, right = np.asarray(embeddings1, dtype=np.float32), np.asarray(embeddings2, dtype=np.float32)
        if not self.keep_vectors:
            return np.sum(l2_normalize(np.atleast_2d(left)) * l2_normalize(np.atleast_2d(right)), axis=1)
        pairs = zip(_unpadded(left), _unpadded(right), strict=True)
        return np.array([maxsim_one_to_many(q, MultiVectors.from_list([d]))[0] for q, d in pairs])


def _padded(sets: MultiVectors) -> np.ndarray:
    """(n, longest, dim), zero rows after each set's own vectors (unit vectors are never zero)."""
    out = np.zeros((len(sets), max(sets.counts.max(initial=0), 1), sets.dim), dtype=np.float32)
    for row, vectors in enumerate(sets):
        out[row, : len(vectors)] = vectors
    return out


def _unpadded(padded: np.ndarray) -> MultiVectors:
    return MultiVectors.from_list([vectors[np.any(vectors != 0, axis=1)] for vectors in padded])
