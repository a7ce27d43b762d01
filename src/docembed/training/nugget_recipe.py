"""Training NUGGET (models/nugget.py) through the shared loop.

Objectives:
- `ae` (autoencoding): the target is the document itself; the encoder sees it with random token deletion
  (each non-special token dropped with probability `noise`), so the nuggets must carry the content.
- `mt`: JSON Lines pairs of a source and a target text (field names configurable), e.g. translations or,
  as bench/bench_nugget.py builds them, paraphrase pairs.

Both sides are cut to `max_length` tokens (128 by default, as in the paper's setup). Batches are shuffled
with seed + epoch, so every rank sees the same global sequence (the loop's DDP contract); token deletion
draws from a generator seeded by (seed, epoch, batch index), so a resumed run deletes the same tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from docembed.errors import DocembedError, UsageError
from docembed.models.nugget import NuggetEncoder
from docembed.training.loop import Recipe

OBJECTIVES = ("ae", "mt")


@dataclass
class Example:
    source: list[int]  # encoder input ids (special tokens included)
    target: list[int]  # decoder target ids (special tokens included)


def tokenize_examples(
    encoder: NuggetEncoder, sources: list[str], targets: list[str] | None, max_length: int
) -> list[Example]:
    source_ids = encoder.tokenize(sources, max_length)
    target_ids = source_ids if targets is None else encoder.tokenize(targets, max_length)
    return [Example(s, t) for s, t in zip(source_ids, target_ids, strict=True) if len(s) > 2 and len(t) > 2]


def delete_tokens(ids: list[int], rate: float, generator: random.Random) -> list[int]:
    """Drop each inner token with probability `rate`; the first and last (special) tokens stay, and at
    least one inner token survives."""
    if rate <= 0 or len(ids) <= 3:
        return ids
    inner = [t for t in ids[1:-1] if generator.random() >= rate]
    if not inner:
        inner = [ids[1 + generator.randrange(len(ids) - 2)]]
    return [ids[0], *inner, ids[-1]]


class NuggetRecipe(Recipe):
    unit = "tokens"  # encoder input tokens

    def __init__(
        self,
        encoder: NuggetEncoder,
        examples: list[Example],
        objective: str = "ae",
        noise: float = 0.1,
        batch_size: int = 16,
        seed: int = 0,
    ):
        super().__init__()
        if objective not in OBJECTIVES:
            raise UsageError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        if not examples:
            raise DocembedError("no training examples (every document was empty?)")
        self.encoder = encoder
        self.module = encoder.model
        self.examples = examples
        self.objective = objective
        self.noise = noise if objective == "ae" else 0.0
        self.batch_size = batch_size
        self.seed = seed

    def num_batches(self, epoch: int) -> int:
        return -(-len(self.examples) // self.batch_size)

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        for number, start in enumerate(range(0, len(order), self.batch_size)):
            noise = random.Random(f"{self.seed}:{epoch}:{number}")
            chunk = [self.examples[i] for i in order[start : start + self.batch_size]]
            yield self.collate(chunk, noise)

    def collate(self, chunk: list[Example], generator: random.Random) -> dict[str, torch.Tensor]:
        backbone = self.module.backbone
        sources = [delete_tokens(e.source, self.noise, generator) for e in chunk]
        targets = [e.target[1:] if backbone.labels_drop_first else e.target for e in chunk]
        decoder_inputs = [[backbone.start_id, *t[:-1]] for t in targets]
        input_ids, attention = _pad(sources, backbone.pad_id)
        decoder_input_ids, _ = _pad(decoder_inputs, backbone.pad_id)
        labels, _ = _pad(targets, -100)
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "decoder_input_ids": decoder_input_ids,
            "labels": labels,
        }

    def batch_units(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    def save(self, directory: Path) -> None:
        self.encoder.save(directory)


def _pad(rows: list[list[int]], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask
