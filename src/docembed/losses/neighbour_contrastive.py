"""QuickThoughts' objective (Logeswaran & Lee, ICLR 2018): pick a sentence's neighbours out of the batch.

The batch is a run of consecutive sentences. For sentence i, the scores f(s_i) . g(s_j) over every other
sentence j of the batch go through a softmax; the target distribution is uniform over the sentences within
`context_size` positions of i (i-c .. i+c, i itself excluded), and the loss is the cross-entropy, averaged
over the batch. The sentence itself is excluded from the candidates by masking its score to -inf (the
reference code, lajanugen/S2V, sets that logit to 0 instead, which leaves it a candidate with a fixed score).

`groups` (optional, one id per row, e.g. the document) keeps neighbours inside a group: a sentence of
another document next to i in the batch is still a candidate but not a target. Rows without any target
(a one-sentence document) are left out of the mean.
"""

from __future__ import annotations

import torch
from torch import nn


def neighbour_targets(
    n: int, context_size: int, groups: torch.Tensor | None = None, device=None
) -> torch.Tensor:
    """(n, n) 0/1 matrix: 1 where 0 < |i - j| <= context_size (and groups[i] == groups[j] if given)."""
    positions = torch.arange(n, device=device)
    distance = (positions[:, None] - positions[None, :]).abs()
    targets = (distance > 0) & (distance <= context_size)
    if groups is not None:
        targets &= groups[:, None] == groups[None, :]
    return targets.float()


class NeighbourContrastiveLoss(nn.Module):
    """forward(f_vectors (n, d), g_vectors (n, d), groups=None) -> {"loss", "neighbour_acc"}.

    neighbour_acc: the fraction of sentences (with at least one neighbour) whose highest-scoring candidate
    is one of their neighbours."""

    def __init__(self, context_size: int = 1):
        super().__init__()
        if context_size < 1:
            raise ValueError("context_size must be >= 1")
        self.context_size = context_size

    def forward(
        self, f_vectors: torch.Tensor, g_vectors: torch.Tensor, groups: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        n = f_vectors.shape[0]
        scores = f_vectors @ g_vectors.T
        diagonal = torch.eye(n, dtype=torch.bool, device=scores.device)
        scores = scores.masked_fill(diagonal, float("-inf"))
        targets = neighbour_targets(n, self.context_size, groups, device=scores.device)
        counts = targets.sum(dim=1)
        has_target = counts > 0
        if not bool(has_target.any()):
            zero = scores.new_zeros(()) + 0.0 * (f_vectors.sum() + g_vectors.sum())
            return {"loss": zero, "neighbour_acc": scores.new_zeros(())}
        log_probs = torch.log_softmax(scores, dim=1)
        # -inf * 0 on the diagonal would be nan: zero the log-probabilities where the target is 0.
        picked = torch.where(targets > 0, log_probs, torch.zeros_like(log_probs))
        per_row = -(picked.sum(dim=1) / counts.clamp(min=1))
        loss = per_row[has_target].mean()
        with torch.no_grad():
            best = scores.argmax(dim=1)
            hit = targets.gather(1, best[:, None]).squeeze(1) > 0
            accuracy = hit[has_target].float().mean()
        return {"loss": loss, "neighbour_acc": accuracy}
