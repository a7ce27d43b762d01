"""The statistics every task, bench and report shares, in one place: seeded sampling, the standard error,
the paired difference of two models on the same items, and what counts as a long document."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# A document is long when all-MiniLM-L6-v2's WordPiece tokenizer gives it more than this many tokens
# (special tokens included): twice what the sbert models read, so truncation visibly costs.
LONG_DOCUMENT_TOKENS = 512


def sample_indices(
    n: int, limit: int | None, rng: np.random.Generator, labels: Sequence | None = None
) -> np.ndarray:
    """Indices of a seeded subset of size `limit` out of `n` (stratified by `labels` when given), in data
    order; every index when `limit` is None or at least `n`."""
    if limit is None or limit >= n:
        return np.arange(n)
    if labels is None or limit < len(set(labels)):
        return np.sort(rng.choice(n, size=limit, replace=False))
    from sklearn.model_selection import train_test_split

    seed = int(rng.integers(2**31 - 1))
    chosen, _ = train_test_split(
        np.arange(n), train_size=limit, stratify=np.asarray(labels), random_state=seed
    )
    return np.sort(chosen)


def standard_error(values) -> float:
    """Standard error of the mean (sample standard deviation / sqrt(n)); NaN for fewer than two values."""
    values = np.asarray(values, dtype=np.float64)
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def paired_difference(mine, reference, scale: float = 100.0) -> dict:
    """`mine` minus `reference`, per-item scores of the same items (in the same order), times `scale`: the
    mean difference, the standard error of the paired difference, the item count and how many items
    changed. "Above" means by more than `se`."""
    mine, reference = np.asarray(mine, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if mine.shape != reference.shape:
        raise ValueError(f"paired values differ in shape: {mine.shape} vs {reference.shape}")
    diff = scale * (mine - reference)
    return {
        "diff": round(float(diff.mean()), 2),
        "se": round(standard_error(diff), 2),
        "n": int(len(diff)),
        "changed": int((diff != 0).sum()),
    }


def minilm_lengths(texts: Sequence[str]) -> np.ndarray:
    """WordPiece token counts with all-MiniLM-L6-v2's tokenizer (special tokens included), no truncation."""
    from transformers import AutoTokenizer

    from docembed.models.offline import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    tokenizer.model_max_length = 10**9  # counting, not encoding: no "longer than the maximum" warning
    texts = list(texts)
    lengths = []
    for start in range(0, len(texts), 512):
        encoded = tokenizer(texts[start : start + 512], add_special_tokens=True, truncation=False)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
    return np.asarray(lengths, dtype=np.int64)
