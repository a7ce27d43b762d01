"""NUGGET's similarity objective: a soft mean-MaxSim between the two documents of a paraphrase pair, with
in-batch negatives (InfoNCE).

Each nugget q of the query document attends over the other document's nuggets z_k with logits
q.z_k / t_att + s_k, where s_k is z_k's selection score passed through the residual exactly as in the
decoder's cross-attention (`NuggetModel.residual`); its soft max is sum_k a_k (q.z_k). The document score
is the mean over the query's nuggets (mean-MaxSim as t_att -> 0, what encode() is scored with), and the
loss is cross-entropy over the batch's documents (and the batch's hard negatives, when given) at
temperature t, in both directions. The top-k selection has
no gradient, so the residual is the scorer's only gradient; W_V (and whatever the recipe leaves
trainable) learns through the similarities. `model` is a NuggetModel (duck-typed: losses sit below
models). Computed in float32 (the softmaxes), per rank under DDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class NuggetSimilarityLoss(nn.Module):
    def __init__(self, model: nn.Module, attention_temperature: float = 0.05, temperature: float = 0.05):
        super().__init__()
        self.model = model
        self.attention_temperature = attention_temperature
        self.temperature = temperature

    def nuggets(self, batch: dict[str, torch.Tensor], side: str) -> Any:
        ids, mask = batch[f"{side}input_ids"], batch[f"{side}attention_mask"]
        if f"{side}bottom" in batch:  # token states computed once (whole encoder frozen, no feedback)
            return self.model.from_states(batch[f"{side}bottom"], batch[f"{side}top"], ids, mask)
        return self.model(ids, mask)

    def soft_maxsim(self, queries: Any, docs: Any) -> torch.Tensor:
        """(queries, docs) matrix of soft mean-MaxSim scores."""
        q = nn.functional.normalize(queries.nuggets.float(), dim=-1)
        d = nn.functional.normalize(docs.nuggets.float(), dim=-1)
        sims = torch.einsum("ikx,jlx->ijkl", q, d)  # (Bq, Bd, Kq, Kd)
        bias = self.model.residual(docs.scores.float())[None, :, None, :]
        logits = (sims / self.attention_temperature + bias).masked_fill(
            ~docs.slots[None, :, None, :], torch.finfo(torch.float32).min
        )
        soft = (logits.softmax(dim=-1) * sims).sum(dim=-1)  # (Bq, Bd, Kq)
        weights = queries.slots[:, None, :].float()
        return (soft * weights).sum(dim=-1) / weights.sum(dim=-1).clamp_min(1)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        a, b = self.nuggets(batch, ""), self.nuggets(batch, "other_")
        target = torch.arange(a.nuggets.shape[0], device=a.nuggets.device)
        a_to_b, b_to_a = self.soft_maxsim(a, b), self.soft_maxsim(b, a)
        if "negative_input_ids" in batch:  # hard negatives: extra columns for both directions
            negatives = self.nuggets(batch, "negative_")
            a_to_b = torch.cat([a_to_b, self.soft_maxsim(a, negatives)], dim=1)
            b_to_a = torch.cat([b_to_a, self.soft_maxsim(b, negatives)], dim=1)
        loss = (
            nn.functional.cross_entropy(a_to_b / self.temperature, target)
            + nn.functional.cross_entropy(b_to_a / self.temperature, target)
        ) / 2
        accuracy = (a_to_b.argmax(dim=1) == target).float().mean().detach()
        return {
            "loss": loss,
            "in_batch_top1": accuracy,
            "nuggets_per_doc": a.slots.sum(1).float().mean().detach(),
        }
