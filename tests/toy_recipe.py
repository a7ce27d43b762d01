"""A tiny deterministic recipe for exercising the shared training loop (also run under torchrun)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

from docembed.training.loop import Recipe, TrainConfig, train


class LinearRegression(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        mse = ((self.linear(x).squeeze(-1) - y) ** 2).mean()
        return {"loss": mse, "mse": mse}


class ToyRecipe(Recipe):
    unit = "rows"

    def __init__(self, n_batches: int = 12):
        self.module = LinearRegression()
        self.n_batches = n_batches

    def batches(self, epoch):
        g = torch.Generator().manual_seed(100 + epoch)
        for _ in range(self.n_batches):
            x = torch.randn(8, 4, generator=g)
            yield x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def save(self, directory: Path) -> None:
        weights = {k: v.tolist() for k, v in self.module.state_dict().items()}
        (directory / "weights.json").write_text(json.dumps(weights))


if __name__ == "__main__":
    out, epochs = sys.argv[1], int(sys.argv[2])
    train(ToyRecipe(), TrainConfig(output_dir=out, epochs=epochs, lr=0.05, log_every=2, resume=True))
