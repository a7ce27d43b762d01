"""In-batch contrastive loss (InfoNCE with in-batch negatives; sentence-transformers'
MultipleNegativesRankingLoss, here symmetric): each query must pick its own positive out of the batch.

For L2-normalised queries q_i and positives p_i (n pairs), the scores s_ij = scale * cos(q_i, p_j) go
through a softmax over j; the loss is the cross-entropy of the diagonal, averaged with the same taken over
i for each positive (positive -> query), since the student's two tasks (first half -> second half, passage
-> page) are asked in both directions. Every other pair's positive is a negative. Mined hard negatives
(`negatives`) join the candidates of the query -> positive direction only, as in sentence-transformers'
(anchor, positive, negative) triplets: every query scores every negative of the batch.

Computed in float32 even under autocast: a scale of 20 on bf16 cosines costs the ranking its ties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class InBatchContrastiveLoss(nn.Module):
    """forward(queries (n, d), positives (n, d), negatives (m, d) or None) -> {"loss", "pair_acc"}.

    pair_acc: the fraction of queries whose highest-scoring candidate is their own positive (chance:
    1 / (n + m))."""

    def __init__(self, scale: float = 20.0):
        super().__init__()
        if not scale > 0:
            raise ValueError("scale must be > 0")
        self.scale = scale

    def forward(
        self, queries: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if queries.shape != positives.shape:
            raise ValueError(f"queries {tuple(queries.shape)} and positives {tuple(positives.shape)} differ")
        if negatives is not None and negatives.shape[1:] != queries.shape[1:]:
            raise ValueError(f"negatives {tuple(negatives.shape)} do not fit queries {tuple(queries.shape)}")
        q = F.normalize(queries.float(), dim=-1)
        p = F.normalize(positives.float(), dim=-1)
        scores = self.scale * q @ p.T
        gold = torch.arange(scores.shape[0], device=scores.device)
        backward = F.cross_entropy(scores.T, gold)  # positive -> query: the in-batch queries only
        if negatives is not None:
            scores = torch.cat([scores, self.scale * q @ F.normalize(negatives.float(), dim=-1).T], dim=1)
        loss = (F.cross_entropy(scores, gold) + backward) / 2
        with torch.no_grad():
            accuracy = (scores.argmax(dim=1) == gold).float().mean()
        return {"loss": loss, "pair_acc": accuracy}
