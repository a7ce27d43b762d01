"""NUGGET's decoder objective: token cross-entropy of a decoder that reads only the nuggets.

`ae`: the target is the document itself (its encoder input noised by token deletion); `mt`: the other side
of a pair (a translation, a paraphrase). The decoder cross-attends to the nuggets with their scores added
to every cross-attention logit (the residual, `NuggetModel.cross_mask`): the scorer's only gradient."""

from __future__ import annotations

import torch
from torch import nn


class NuggetReconstructionLoss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        model = self.model
        out = model(batch["input_ids"], batch["attention_mask"])
        decoder_input, labels = batch["decoder_input_ids"], batch["labels"]
        logits, _ = model.backbone.decode(
            decoder_input, out.nuggets, model.cross_mask(out, decoder_input.shape[1])
        )
        loss = nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )
        return {"loss": loss, "nuggets_per_doc": out.slots.sum(1).float().mean().detach()}
