"""A penalty that keeps fine-tuned weights near their warm start: weight * sum ||theta - theta_0||^2 over
the given parameters (L2-SP, Li et al. 2018), so a small data set cannot drift the pretrained encoder's
token geometry far."""

from __future__ import annotations

import torch
from torch import nn


class NuggetAnchorPenalty(nn.Module):
    def __init__(self, parameters: list[nn.Parameter], weight: float):
        super().__init__()
        self.weight = weight
        # Plain attributes, not buffers: the starting point is no part of the model or its checkpoints.
        self.anchored = list(parameters)
        self.initial = [p.detach().clone() for p in self.anchored]

    def forward(self) -> torch.Tensor:
        if not self.anchored:
            return torch.zeros(())
        total = torch.zeros((), device=self.anchored[0].device)
        for index, (p, p0) in enumerate(zip(self.anchored, self.initial, strict=True)):
            if p0.device != p.device:
                self.initial[index] = p0 = p0.to(p.device)
            total = total + (p.float() - p0.float()).pow(2).sum()
        return self.weight * total
