"""Query-by-document retrieval, labels as relevance: shared by the 20 Newsgroups and long-document tasks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from docembed.evaluation import metrics
from docembed.evaluation.statistics import standard_error
from docembed.types import MultiVectors

K_MAP, K_PRECISION, K_NEIGHBOURS = 100, 10, 10


def scorer_rows(task, model, queries: list[str], candidates: list[str]) -> list[np.ndarray]:
    """A scorer's rows (bm25, a fusion: its score_matrix; a fusion's model part is embedded through the
    task's cache), one per query over all candidates."""
    return list(model.score_matrix(queries, candidates, embed=task.embed))


def similarity_rows(task, model, texts: list[str]) -> Iterable[np.ndarray]:
    """Rows of the document-document similarity matrix (one at a time for multi-vector models)."""
    from docembed.scoring import cosine_matrix, maxsim_one_to_many, passage_scoring

    if getattr(model, "scorer_only", False):
        return scorer_rows(task, model, texts, texts)
    if model.supports("sparse"):
        vectors = model.encode_sparse(texts)
        return np.asarray((vectors @ vectors.T).todense(), dtype=np.float32)
    vectors = task.embed(model, texts)
    if isinstance(vectors, MultiVectors):
        scoring = passage_scoring(model)
        return (maxsim_one_to_many(vectors[i], vectors, *scoring) for i in range(len(vectors)))
    return cosine_matrix(vectors, vectors)


def label_retrieval(
    rows: Iterable[np.ndarray], labels: np.ndarray, rng: np.random.Generator
) -> dict[str, Any]:
    """Each document queries all the others (relevant = same label): MAP@100, P@10 and leave-one-out kNN
    accuracy (k=10 majority vote, ties to the better-ranked label), x100. Ties in similarity are broken by
    a seeded random order, never by data order."""
    labels = np.asarray(labels)
    tie_order = rng.permutation(len(labels))
    aps, precisions, knn_hits = [], [], []
    for i, sims in enumerate(rows):
        sims = np.asarray(sims, dtype=np.float64).copy()
        sims[i] = -np.inf  # a document does not retrieve itself
        order = tie_order[np.argsort(-sims[tie_order], kind="stable")]
        order = order[order != i]
        relevant = labels[order] == labels[i]
        aps.append(metrics.average_precision_at_k(relevant, K_MAP, int(relevant.sum())))
        precisions.append(metrics.precision_at_k(relevant, K_PRECISION))
        knn_hits.append(knn_vote(labels[order[:K_NEIGHBOURS]]) == labels[i])
    aps_array = np.asarray(aps)
    return {
        "map@100": 100.0 * float(aps_array.mean()),
        "map@100_se": 100.0 * standard_error(aps_array),
        "p@10": 100.0 * float(np.mean(precisions)),
        "knn_accuracy": 100.0 * float(np.mean(knn_hits)),
        "per_item": [round(float(a), 6) for a in aps],
    }


def knn_vote(neighbour_labels: np.ndarray):
    """Most frequent label; among equally frequent ones, the one whose first neighbour ranks highest."""
    values, first, counts = np.unique(neighbour_labels, return_index=True, return_counts=True)
    best = np.flatnonzero(counts == counts.max())
    return values[best[np.argmin(first[best])]]
