"""Ranking and correlation metrics, on plain numpy arrays (no model in sight, so they are easy to test)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pessimistic_rank(scores: np.ndarray, gold: int) -> int:
    """1-based rank of candidate `gold` when every tie goes against it: 1 + the number of other candidates
    scoring at least as high. A constant scorer therefore ranks the gold last, whatever the list order."""
    scores = np.asarray(scores, dtype=np.float64)
    others = np.delete(scores, gold)
    return 1 + int(np.sum(others >= scores[gold]))


def reciprocal_ranks(score_lists: Sequence[np.ndarray], golds: Sequence[int]) -> np.ndarray:
    return np.array([1.0 / pessimistic_rank(s, g) for s, g in zip(score_lists, golds, strict=True)])


def mean_reciprocal_rank(score_lists: Sequence[np.ndarray], golds: Sequence[int]) -> float:
    """MRR with pessimistic ties, in [0, 1]."""
    return float(reciprocal_ranks(score_lists, golds).mean()) if len(golds) else 0.0


def average_precision_at_k(relevant: np.ndarray, k: int, num_relevant: int | None = None) -> float:
    """AP@k of one ranked list: `relevant[i]` says whether the i-th ranked item is relevant. The sum of
    precision@i over relevant positions i <= k is divided by min(num_relevant, k) (num_relevant defaults to
    the relevant items in the list), so a perfect top-k scores 1 even when more than k items are relevant."""
    relevant = np.asarray(relevant, dtype=bool)
    total = int(relevant.sum()) if num_relevant is None else int(num_relevant)
    if total == 0:
        return 0.0
    top = relevant[:k]
    hits = np.cumsum(top)
    precision_at_hits = hits[top] / (np.flatnonzero(top) + 1)
    return float(precision_at_hits.sum() / min(total, k))


def precision_at_k(relevant: np.ndarray, k: int) -> float:
    """Relevant items among the first k, divided by k."""
    return float(np.asarray(relevant[:k], dtype=bool).sum() / k)


def spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Spearman rank correlation (scipy; average ranks for ties), in [-1, 1]."""
    from scipy.stats import spearmanr

    if len(predicted) < 2 or np.ptp(predicted) == 0 or np.ptp(gold) == 0:
        return 0.0  # undefined for a constant side: count it as no correlation
    value = spearmanr(predicted, gold).statistic
    return 0.0 if np.isnan(value) else float(value)


def accuracy(predicted: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(np.asarray(predicted) == np.asarray(gold))) if len(gold) else 0.0
