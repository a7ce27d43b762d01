"""Logistic-regression probes on frozen embeddings.

`senteval_cv_accuracy` follows SentEval's protocol: k-fold stratified cross-validation (shuffled, seed
1111); in each training fold the L2 strength C is chosen from 2^-2..2^3 by an inner stratified k-fold CV,
then a probe trained on the whole fold is scored on the held-out fold. `train_test_accuracy` is the
train/test variant used for IMDB and 20 Newsgroups (C chosen by 3-fold CV on the training split).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SENTEVAL_GRID = tuple(2.0**t for t in range(-2, 4))
DOCUMENT_GRID = tuple(4.0**t for t in range(-1, 4))  # 0.25 .. 16: sparse tf-idf wants weak regularisation


def _probe(c: float, seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=2000, random_state=seed)


def stratified_folds(labels: np.ndarray, k: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(labels)), labels))


def choose_c(features, labels: np.ndarray, grid: Sequence[float], k: int, seed: int) -> float:
    """The C of `grid` with the best mean accuracy over an inner stratified k-fold CV (first best wins)."""
    k = max(2, min(k, int(np.bincount(np.unique(labels, return_inverse=True)[1]).min())))
    folds = stratified_folds(labels, k, seed)
    best_c, best_score = grid[0], -1.0
    for c in grid:
        scores = [
            _probe(c, seed).fit(features[train], labels[train]).score(features[test], labels[test])
            for train, test in folds
        ]
        if np.mean(scores) > best_score:
            best_c, best_score = c, float(np.mean(scores))
    return best_c


def senteval_cv_accuracy(
    features,
    labels: Sequence,
    outer_folds: int = 10,
    inner_folds: int = 10,
    seed: int = 1111,
    grid: Sequence[float] = SENTEVAL_GRID,
) -> dict[str, float]:
    """Mean held-out accuracy (in [0, 1]) over the outer folds, with the C of `grid` chosen in each fold."""
    labels = np.asarray(labels)
    accuracies, chosen = [], []
    for train, test in stratified_folds(labels, outer_folds, seed):
        c = choose_c(features[train], labels[train], grid, inner_folds, seed)
        probe = _probe(c, seed).fit(features[train], labels[train])
        accuracies.append(probe.score(features[test], labels[test]))
        chosen.append(c)
    return {"accuracy": float(np.mean(accuracies)), "accuracy_std": float(np.std(accuracies)), "c": chosen}


def train_test_predictions(
    train_features,
    train_labels,
    test_features,
    seed: int = 1111,
    inner_folds: int = 3,
    grid: Sequence[float] = DOCUMENT_GRID,
):
    """Predictions of a probe trained on the training split (C of `grid` chosen by inner CV), and the C."""
    train_labels = np.asarray(train_labels)
    c = choose_c(train_features, train_labels, grid, inner_folds, seed)
    probe = _probe(c, seed).fit(train_features, train_labels)
    return probe.predict(test_features), c
