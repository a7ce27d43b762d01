"""Alignment and uniformity on the hypersphere (Wang & Isola, ICML 2020), as one training loss.

For a batch of positive pairs (x_i, y_i) of L2-normalised embeddings:

    align   = mean_i ||x_i - y_i||^2                                   (alpha = 2)
    uniform = log mean_{i<j} exp(-t ||u_i - u_j||^2)                   over the distinct pairs of ONE view,
              computed for the x view and the y view separately and averaged
    loss    = w_align * align + w_uniform * uniform

No labels and no explicit negatives: the uniformity term spreads the batch over the sphere, the alignment term
pulls the two views of each item together.

Range of the terms for unit vectors: 0 <= align <= 4. uniform <= 0, with 0 exactly when every point of a
view coincides (collapse). Its floor for a batch of n points: by Jensen, uniform >= -t * mean_{i<j}
||u_i - u_j||^2, and sum_{i<j} ||u_i - u_j||^2 = n^2 - ||sum_i u_i||^2 <= n^2, so
uniform >= -2t * n / (n - 1), reached only by a centred regular simplex (possible when n <= dim + 1). For
large batches the floor is about -2t (-6 at the default t = 3); values near 0 mean the embeddings collapsed.

Everything is computed in float32 even under autocast, since exp(-t d^2) and log-mean-exp lose too much in
half precision. Under DDP the uniformity is over the per-rank batch (the training loop gives each rank its own
batch); no all-gather.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def alignment(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean_i ||x_i - y_i||^2 (Wang & Isola's l_align with alpha = 2)."""
    return (x - y).pow(2).sum(dim=1).mean()


def uniformity(x: torch.Tensor, t: float = 3.0) -> torch.Tensor:
    """log mean_{i<j} exp(-t ||x_i - x_j||^2) over the distinct pairs of the rows of `x`; 0 with fewer
    than two rows (there is no pair to spread)."""
    n = x.shape[0]
    if n < 2:
        return x.sum() * 0.0
    # Squared distances from the Gram matrix (not torch.pdist): its gradient stays finite when two rows
    # coincide, which duplicate documents in a real corpus make happen.
    squared_norms = x.pow(2).sum(dim=1)
    gram = x @ x.T
    rows, cols = torch.triu_indices(n, n, offset=1, device=x.device)
    squared = (squared_norms[rows] + squared_norms[cols] - 2.0 * gram[rows, cols]).clamp_min(0.0)
    return torch.logsumexp(-t * squared, dim=0) - math.log(squared.numel())


class AlignUniformLoss(nn.Module):
    """w_align * align(x, y) + w_uniform * (uniform(x) + uniform(y)) / 2, in float32.

    forward returns a dict: {"loss", "align", "uniform"}, so the training loop logs both terms."""

    def __init__(self, t: float = 3.0, align_weight: float = 1.0, uniform_weight: float = 1.0):
        super().__init__()
        if t <= 0:
            raise ValueError("the uniformity temperature t must be positive")
        self.t = t
        self.align_weight = align_weight
        self.uniform_weight = uniform_weight

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        if x.shape != y.shape or x.dim() != 2:
            raise ValueError(
                f"expected two (n, dim) views of the same shape, got {tuple(x.shape)}, {tuple(y.shape)}"
            )
        with torch.autocast(device_type=x.device.type, enabled=False):
            x, y = x.float(), y.float()
            align = alignment(x, y)
            uniform = (uniformity(x, self.t) + uniformity(y, self.t)) / 2
            loss = self.align_weight * align + self.uniform_weight * uniform
        return {"loss": loss, "align": align.detach(), "uniform": uniform.detach()}
