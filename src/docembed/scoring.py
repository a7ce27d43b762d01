"""Similarity scores, batched: cosine for dense embeddings, mean-MaxSim for multi-vector ones, and faiss
indexes for search.

mean-MaxSim (NUGGET eq. 10; ColBERT's MaxSim averaged instead of summed): for query vectors q_1..q_m and
document vectors d_1..d_k, score = (1/m) * sum_i max_j cos(q_i, d_j). It is asymmetric; `similarity`
reports it with the first text as the query.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from docembed.io.embeddings import MultiVectors, Vectors
from docembed.models.base import l2_normalize


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cos(a_i, b_i) for each row i."""
    return np.einsum("ij,ij->i", l2_normalize(a), l2_normalize(b))


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return l2_normalize(a) @ l2_normalize(b).T


def maxsim_one_to_many(query: np.ndarray, docs: MultiVectors) -> np.ndarray:
    """mean-MaxSim of one query (m, d) against every document of `docs`, in one matrix product.
    A document with no vectors scores -1 (the lowest cosine), an empty query 0."""
    if len(query) == 0 or len(docs) == 0:
        return np.zeros(len(docs), dtype=np.float32)
    sims = l2_normalize(query) @ l2_normalize(docs.vectors).T  # (m, total)
    counts = docs.counts
    starts = np.minimum(docs.offsets[:-1], max(sims.shape[1] - 1, 0))
    if sims.shape[1] == 0:
        return np.full(len(docs), -1.0, dtype=np.float32)
    best = np.maximum.reduceat(sims, starts, axis=1)  # (m, n): max over each document's vectors
    scores = best.mean(axis=0)
    scores[counts == 0] = -1.0
    return scores.astype(np.float32)


def maxsim_pairs(queries: MultiVectors, docs: MultiVectors, batch_size: int = 256) -> np.ndarray:
    """mean-MaxSim of queries[i] against docs[i] for every i, with padded batched matrix products."""
    import torch

    if len(queries) != len(docs):
        raise ValueError("maxsim_pairs needs as many queries as documents")
    q_norm = torch.from_numpy(l2_normalize(queries.vectors).astype(np.float32))
    d_norm = torch.from_numpy(l2_normalize(docs.vectors).astype(np.float32))
    scores = np.empty(len(queries), dtype=np.float32)
    for start in range(0, len(queries), batch_size):
        idx = range(start, min(start + batch_size, len(queries)))
        q_pad, q_mask = _pad(q_norm, queries.offsets, idx)
        d_pad, d_mask = _pad(d_norm, docs.offsets, idx)
        sims = torch.bmm(q_pad, d_pad.transpose(1, 2))  # (b, mq, md)
        sims = sims.masked_fill(~d_mask[:, None, :], -2.0)  # below any cosine: padding never wins
        best = sims.max(dim=2).values.clamp_min(-1.0)  # (b, mq); empty docs give -1
        q_counts = q_mask.sum(dim=1)
        total = (best * q_mask).sum(dim=1)
        scores[start : start + len(idx)] = torch.where(
            q_counts > 0, total / q_counts.clamp_min(1), torch.zeros_like(total)
        ).numpy()
    return scores


def _pad(flat, offsets: np.ndarray, indices: Sequence[int]):
    import torch

    counts = [int(offsets[i + 1] - offsets[i]) for i in indices]
    width = max(max(counts), 1)
    padded = flat.new_zeros((len(counts), width, flat.shape[1]))
    mask = torch.zeros((len(counts), width), dtype=torch.bool)
    for row, (i, count) in enumerate(zip(indices, counts, strict=True)):
        padded[row, :count] = flat[offsets[i] : offsets[i] + count]
        mask[row, :count] = True
    return padded, mask


def score_pairs(left: Vectors, right: Vectors) -> np.ndarray:
    """Similarity of left[i] and right[i]: cosine (dense) or mean-MaxSim with left as query (multi)."""
    if isinstance(left, MultiVectors) != isinstance(right, MultiVectors):
        raise ValueError("cannot compare dense with multi-vector embeddings")
    if isinstance(left, MultiVectors):
        return maxsim_pairs(left, right)
    return cosine_pairs(left, right).astype(np.float32)


def score_one_to_many(query: Vectors, candidates: Vectors) -> np.ndarray:
    """Scores of one query (a 1-row array or a 1-document MultiVectors) against all candidates."""
    if isinstance(query, MultiVectors):
        return maxsim_one_to_many(query[0], candidates)
    return (cosine_matrix(np.asarray(query).reshape(1, -1), candidates)[0]).astype(np.float32)


def rank(scores: np.ndarray) -> np.ndarray:
    """Indices best first; ties keep input order (stable)."""
    return np.argsort(-scores, kind="stable")
