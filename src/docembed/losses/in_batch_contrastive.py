"""In-batch contrastive loss (InfoNCE with in-batch negatives; sentence-transformers'
MultipleNegativesRankingLoss, here symmetric): each query must pick its own positive out of the batch.

For L2-normalised queries q_i and positives p_i (n pairs), the scores s_ij = scale * cos(q_i, p_j) go
through a softmax over j; the loss is the cross-entropy of the diagonal, averaged with the same taken over
i for each positive (positive -> query), since the student's two tasks (first half -> second half, passage
-> page) are asked in both directions. Every other pair's positive is a negative: no mining, no labels.

Computed in float32 even under autocast: a scale of 20 on bf16 cosines costs the ranking its ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class InBatchContrastiveLoss(nn.Module):
    """forward(queries (n, d), positives (n, d)) -> {"loss", "pair_acc"}.

    pair_acc: the fraction of queries whose highest-scoring positive is their own (chance: 1 / n)."""

    def __init__(self, scale: float = 20.0):
        super().__init__()
        if not scale > 0:
            raise ValueError("scale must be > 0")
        self.scale = scale

    def forward(self, queries: torch.Tensor, positives: torch.Tensor) -> dict[str, torch.Tensor]:
        if queries.shape != positives.shape:
            raise ValueError(f"queries {tuple(queries.shape)} and positives {tuple(positives.shape)} differ")
        q = F.normalize(queries.float(), dim=-1)
        p = F.normalize(positives.float(), dim=-1)
        scores = self.scale * q @ p.T
        gold = torch.arange(scores.shape[0], device=scores.device)
        loss = (F.cross_entropy(scores, gold) + F.cross_entropy(scores.T, gold)) / 2
        with torch.no_grad():
            accuracy = (scores.argmax(dim=1) == gold).float().mean()
        return {"loss": loss, "pair_acc": accuracy}
