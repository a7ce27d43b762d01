"""Training recipe of the set encoder: alignment + uniformity on two random halves of each document.

Views: a document's tokens (the multiset, order irrelevant) are shuffled and split at len // 2 into a left
and a right half, a fresh shuffle every epoch (seeded by seed + epoch). The halves are disjoint and their
union is the document (as multisets). Documents longer than `max_train_tokens` tokens are first cut to a
random `max_train_tokens` of them (the head of the same shuffle), which bounds the cost of a step; the
halves are then still disjoint random subsets. Documents with fewer than two tokens have no two non-empty
halves and are skipped in training (they are still embedded at encode time).

Loss: `losses.align_uniform.AlignUniformLoss` on the two views' embeddings; the forward dict carries
`align` and `uniform` so the loop logs them. Under DDP each rank gets its own batch from the loop, so
the uniformity is computed over the per-rank batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.losses.align_uniform import AlignUniformLoss
from docembed.models.setenc import SetEncoder, SetEncoderConfig, embed_chunks, pack_sorted, word_tokens
from docembed.runtime import log
from docembed.training.loop import Recipe


def split_views(tokens: np.ndarray, rng: np.random.Generator, max_tokens: int | None = None):
    """Shuffle `tokens` (any 1-D array) and split at len // 2: (left, right), disjoint, union = tokens
    (or a random `max_tokens` of them when there are more)."""
    shuffled = tokens[rng.permutation(len(tokens))]
    if max_tokens is not None and len(shuffled) > max_tokens:
        shuffled = shuffled[:max_tokens]
    half = len(shuffled) // 2
    return shuffled[:half], shuffled[half:]


class SetEncoderObjective(nn.Module):
    """forward(batch) -> {"loss", "align", "uniform"} for a batch {"left": packed, "right": packed} of
    `pack_sorted` views (chunks of similar-size documents: the same embeddings as one padded batch, with far
    less padding)."""

    def __init__(self, network: nn.Module, loss: AlignUniformLoss):
        super().__init__()
        self.network = network
        self.loss = loss

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        left = embed_chunks(self.network, batch["left"])
        right = embed_chunks(self.network, batch["right"])
        return self.loss(left, right)


class SetEncoderRecipe(Recipe):
    unit = "docs"

    def __init__(
        self,
        texts: Iterable[str],
        config: SetEncoderConfig,
        batch_size: int = 256,
        t: float = 3.0,
        align_weight: float = 1.0,
        uniform_weight: float = 1.0,
        max_train_tokens: int | None = 1024,
        seed: int = 0,
    ):
        super().__init__()
        if batch_size < 2:
            raise ValueError("uniformity needs at least two documents per batch")
        torch.manual_seed(seed)  # the initialisation depends on the seed alone, however the recipe is built
        self.encoder = SetEncoder(config)
        self.config = config
        self.batch_size = batch_size
        self.max_train_tokens = max_train_tokens
        self.seed = seed
        self.loss_settings = {"t": t, "align_weight": align_weight, "uniform_weight": uniform_weight}
        self.docs, self.token_buckets, self.skipped = self._prepare(texts)
        if len(self.docs) < 2:
            raise ValueError("need at least two documents with two or more tokens to train")
        self.module = SetEncoderObjective(self.encoder.network, AlignUniformLoss(**self.loss_settings))

    def _prepare(self, texts: Iterable[str]) -> tuple[list[np.ndarray], np.ndarray, int]:
        """Each document as an int32 array of token ids into a corpus vocabulary, and that vocabulary's
        bucket ids (V, k), so views are cheap to build every epoch."""
        index: dict[str, int] = {}
        docs, skipped = [], 0
        for text in texts:
            tokens = word_tokens(text, self.config.lowercase)
            if len(tokens) < 2:
                skipped += 1
                continue
            docs.append(np.fromiter((index.setdefault(t, len(index)) for t in tokens), np.int32, len(tokens)))
        token_buckets = self.encoder.hasher.many(list(index))
        log(
            f"setenc: {len(docs)} training documents, {len(index)} distinct tokens,"
            f" {skipped} skipped (< 2 tokens)"
        )
        return docs, token_buckets, skipped

    def _bag(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distinct, counts = np.unique(ids, return_counts=True)
        if len(distinct) > self.config.max_tokens:  # same rule as encode: the most frequent tokens
            keep = np.argsort(-counts, kind="stable")[: self.config.max_tokens]
            distinct, counts = distinct[keep], counts[keep]
        return self.token_buckets[distinct], counts.astype(np.float32)

    def num_batches(self, epoch: int) -> int:
        full, rest = divmod(len(self.docs), self.batch_size)
        return full + (1 if rest >= 2 else 0)

    def batches(self, epoch: int) -> Iterator[dict]:
        rng = np.random.default_rng(self.seed + epoch)
        order = rng.permutation(len(self.docs))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            if len(rows) < 2:  # a lone leftover document has no pair for the uniformity term
                continue
            lefts, rights = [], []
            for row in rows:
                left, right = split_views(self.docs[row], rng, self.max_train_tokens)
                lefts.append(self._bag(left))
                rights.append(self._bag(right))
            yield {
                "left": pack_sorted(lefts, self.config.counts),
                "right": pack_sorted(rights, self.config.counts),
            }

    def batch_units(self, batch: dict) -> int:
        return int(batch["left"]["rows"].shape[0])

    def save(self, directory: Path) -> None:
        self.encoder.network.eval()
        self.encoder.save(directory)
        settings = {
            **self.loss_settings,
            "batch_size": self.batch_size,
            "max_train_tokens": self.max_train_tokens,
            "seed": self.seed,
            "documents": len(self.docs),
            "skipped_short_documents": self.skipped,
        }
        (Path(directory) / "setenc_training.json").write_text(json.dumps(settings, indent=2) + "\n")
