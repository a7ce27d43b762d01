"""Depth losses: how close the student's document vector is to the SBERT teacher's.

Per input i (student vector s_i, teacher vector t_i), one of
- "cosine": 1 - cos(s_i, t_i)                                     (in [0, 2])
- "mse":    mean over dimensions of (s_i - t_i)^2
- "margin": mean over in-batch negatives j != i of max(0, m - cos(s_i, t_i) + cos(s_i, t_j)).
  The thesis' max-margin loss, -cos(s, t+) + cos(s, t-), has no lower bound and keeps pushing once the
  positive already wins; the hinge at 0 stops at margin m. A batch of one has no negatives: loss 0.

Each input's loss is multiplied by its weight lambda(x_i) (0 for documents the teacher could not read whole)
and the products are averaged over the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("cosine", "mse", "margin")


class DepthLoss(nn.Module):
    def __init__(self, kind: str = "cosine", margin: float = 0.2):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"depth loss must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.margin = margin

    def per_input(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if self.kind == "cosine":
            return 1.0 - F.cosine_similarity(student, teacher, dim=-1)
        if self.kind == "mse":
            return ((student - teacher) ** 2).mean(-1)
        batch = len(student)
        if batch < 2:
            return student.sum(-1) * 0.0
        sims = F.normalize(student, dim=-1) @ F.normalize(teacher, dim=-1).T  # (B, B): s_i . t_j
        positive = sims.diagonal().unsqueeze(1)
        hinge = (self.margin - positive + sims).clamp(min=0.0)
        off_diagonal = ~torch.eye(batch, dtype=torch.bool, device=sims.device)
        return (hinge * off_diagonal).sum(1) / (batch - 1)

    def forward(self, student: torch.Tensor, teacher: torch.Tensor, weight: torch.Tensor | None = None):
        with torch.autocast(student.device.type, enabled=False):
            losses = self.per_input(student.float(), teacher.float())
            if weight is not None:
                losses = losses * weight.to(losses.dtype)
            return losses.mean()
