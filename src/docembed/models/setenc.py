"""Set encoder: an order-free document encoder over the bag of a document's word tokens.

- Tokens: `docembed.text.tokenize` (lower-cased words and numbers; punctuation-only tokens dropped).
- Word vectors by hashing: each token goes to `num_hashes` buckets of one table of `num_buckets` learned
  vectors, and its vector is the sum of its buckets' vectors. Two tokens share a vector only if all their
  hashes collide, so collisions are soft; any vocabulary works with bounded memory. The hash is a keyed
  BLAKE2b digest (stable across processes and machines, unlike Python's hash()).
- Encoder: attention pooling with a learned query per head over the token vectors, then a residual
  GELU MLP, then L2 normalisation. No positions anywhere, so the output does not depend on token order.
  `counts="set"` (the default) attends over the set of distinct tokens; `counts="bag"` attends over the
  multiset: a token seen c times is attended once with log(c) added to its score, which is exactly softmax
  attention over the c copies. (On 20 Newsgroups the two scored alike in short pilots; set is the default.)
  A learned "null" slot (a key score and a value per head) is always present, so an empty document attends
  to it alone and still gets a well-defined vector.
  `attention="kernel"` replaces softmax's exp(s) by the positive feature map elu(s) + 1 (linear, "kernelized"
  attention): the weights grow linearly, not exponentially, with the score, so a document's vector averages
  over more of its words (in bag mode a token seen c times weighs c (elu(s) + 1), again exactly c copies).
- Training: `docembed train-setenc` (training/setenc_recipe.py), alignment + uniformity on two random
  halves of each document; no labels, no negatives.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from docembed.errors import CorruptModelError
from docembed.models.base import Encoder, EncoderConfig, load_state_dict, read_config, save_state_dict
from docembed.models.families import register
from docembed.runtime import report_batch


@dataclass
class SetEncoderConfig(EncoderConfig):
    num_buckets: int = 1 << 16
    num_hashes: int = 2
    word_dim: int = 64
    heads: int = 4
    dim: int = 256  # output dimension (heads * head dimension)
    hidden: int = 512  # width of the residual MLP after pooling
    counts: str = "set"  # set | bag
    max_tokens: int = 4096  # distinct tokens kept per document (the most frequent; order-free)
    hash_seed: int = 0
    lowercase: bool = True
    token_norm: bool = True  # layer-normalise each token vector (scale-free word vectors)
    # softmax | kernel (weights elu(score) + 1, normalised: flatter). train-setenc picks kernel; the
    # dataclass keeps softmax because configs saved before the option existed were softmax models.
    attention: str = "softmax"

    def __post_init__(self):
        if self.attention not in ("softmax", "kernel"):
            raise CorruptModelError(f"setenc attention must be 'softmax' or 'kernel', got {self.attention!r}")
        if self.counts not in ("bag", "set"):
            raise CorruptModelError(f"setenc counts must be 'bag' or 'set', got {self.counts!r}")
        narrow = [name for name in ("dim", "word_dim", "heads", "hidden") if getattr(self, name) < 1]
        if narrow:  # a zero-width layer trains and encodes nothing
            raise CorruptModelError(f"setenc {narrow[0]} must be at least 1, got {getattr(self, narrow[0])}")
        if self.dim % self.heads:
            raise CorruptModelError(f"setenc dim {self.dim} is not a multiple of heads {self.heads}")
        if self.num_hashes < 1 or self.num_hashes > 8 or self.num_buckets < 2:
            raise CorruptModelError("setenc needs 1..8 hashes and at least 2 buckets")


def word_tokens(text: str, lowercase: bool = True) -> list[str]:
    """The word tokens of `text`: docembed.text.tokenize without the punctuation-only tokens."""
    from docembed.text import tokenize

    return [t for t in tokenize(text, lowercase=lowercase) if any(ch.isalnum() for ch in t)]


class TokenHasher:
    """token -> `num_hashes` bucket ids from one keyed BLAKE2b digest (4 bytes per hash), cached."""

    def __init__(self, num_buckets: int, num_hashes: int, seed: int = 0):
        self.num_buckets = num_buckets
        self.num_hashes = num_hashes
        self.key = seed.to_bytes(8, "little", signed=False) + b"docembed-setenc"
        self._cache: dict[str, tuple[int, ...]] = {}

    def __call__(self, token: str) -> tuple[int, ...]:
        buckets = self._cache.get(token)
        if buckets is None:
            digest = hashlib.blake2b(
                token.encode("utf-8"), digest_size=4 * self.num_hashes, key=self.key
            ).digest()
            buckets = tuple(
                int.from_bytes(digest[4 * i : 4 * i + 4], "little") % self.num_buckets
                for i in range(self.num_hashes)
            )
            if len(self._cache) < 2_000_000:  # bounded memory on endless vocabularies
                self._cache[token] = buckets
        return buckets

    def many(self, tokens: Sequence[str]) -> np.ndarray:
        """(len(tokens), num_hashes) int64 bucket ids."""
        if not tokens:
            return np.zeros((0, self.num_hashes), dtype=np.int64)
        return np.asarray([self(t) for t in tokens], dtype=np.int64)


def pack(items: Sequence[tuple[np.ndarray, np.ndarray]], counts: str = "bag"):
    """Pad a batch of (buckets (U, k), token counts (U,)) into tensors: buckets (B, Umax, k) long,
    log_counts (B, Umax) float (zeros for counts="set"), mask (B, Umax) bool."""
    import torch

    width = max([len(b) for b, _ in items] + [1])
    k = items[0][0].shape[1] if items else 1
    buckets = np.zeros((len(items), width, k), dtype=np.int64)
    log_counts = np.zeros((len(items), width), dtype=np.float32)
    mask = np.zeros((len(items), width), dtype=bool)
    for row, (ids, cnt) in enumerate(items):
        buckets[row, : len(ids)] = ids
        if counts == "bag":
            log_counts[row, : len(ids)] = np.log(cnt)
        mask[row, : len(ids)] = True
    return {
        "buckets": torch.from_numpy(buckets),
        "log_counts": torch.from_numpy(log_counts),
        "mask": torch.from_numpy(mask),
    }


def pack_sorted(items: Sequence[tuple[np.ndarray, np.ndarray]], counts: str = "bag", chunk: int = 32):
    """Like `pack`, but as chunks of documents of similar size (far less padding): {"chunks": [packed, ...],
    "rows": (B,) long}, where the chunks hold the documents in the order `rows` lists. `embed_chunks` puts
    the outputs back in input order."""
    import torch

    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    chunks = [pack([items[i] for i in order[s : s + chunk]], counts) for s in range(0, len(order), chunk)]
    return {"chunks": chunks, "rows": torch.tensor(order, dtype=torch.long)}


def embed_chunks(network, packed: dict):
    """Run `network` on the chunks of `pack_sorted` and return the embeddings in input order. The word
    vectors of all chunks are looked up in one call, so the backward pass builds one gradient for the table,
    not one per chunk."""
    import torch

    chunks = packed["chunks"]
    flat = torch.cat([c["buckets"].reshape(-1, c["buckets"].shape[-1]) for c in chunks], dim=0)
    vectors = network.token_vectors(flat).split([c["mask"].numel() for c in chunks], dim=0)
    out = torch.cat(
        [
            network.pool(v.view(*c["mask"].shape, -1), c["log_counts"], c["mask"])
            for v, c in zip(vectors, chunks, strict=True)
        ],
        dim=0,
    )
    result = out.new_empty(out.shape)
    result[packed["rows"]] = out
    return result


def _build_network(config: SetEncoderConfig):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class SetEncoderNetwork(nn.Module):
        """Hashed word vectors -> multi-head attention pooling (learned queries, null slot) -> residual MLP
        -> unit vector.

        Computed in the cheap but equal order: a head's score for token x is q_h . (K_h x + b_h), and its
        output sum_i a_i (V_h x_i + c_h) = V_h (sum_i a_i x_i) + c_h since the weights sum to one, so the
        token vectors are pooled in word space first and projected once per document, not once per token."""

        def __init__(self, c: SetEncoderConfig):
            super().__init__()
            self.heads, self.head_dim, self.word_dim = c.heads, c.dim // c.heads, c.word_dim
            self.kernel = c.attention == "kernel"
            self.embedding = nn.Embedding(c.num_buckets, c.word_dim)
            nn.init.normal_(self.embedding.weight, std=1.0 / math.sqrt(c.num_hashes))
            self.token_norm = nn.LayerNorm(c.word_dim) if c.token_norm else nn.Identity()
            self.keys = nn.Linear(c.word_dim, c.dim)
            self.values = nn.Linear(c.word_dim, c.dim)
            self.query = nn.Parameter(torch.randn(c.heads, self.head_dim) / math.sqrt(self.head_dim))
            self.null_score = nn.Parameter(torch.zeros(c.heads))
            self.null_value = nn.Parameter(torch.zeros(c.heads, self.head_dim))
            self.mlp_norm = nn.LayerNorm(c.dim)
            self.mlp = nn.Sequential(nn.Linear(c.dim, c.hidden), nn.GELU(), nn.Linear(c.hidden, c.dim))

        def forward(self, buckets, log_counts, mask):
            return self.pool(self.token_vectors(buckets), log_counts, mask)

        def token_vectors(self, buckets):
            """(..., k) bucket ids -> (..., word_dim): the sum of a token's k bucket vectors, layer-normed."""
            return self.token_norm(self.embedding(buckets).sum(dim=-2))

        def pool(self, tokens, log_counts, mask):
            """(B, U, word_dim) token vectors -> (B, dim) unit vectors."""
            b = mask.shape[0]
            h, hd, w = self.heads, self.head_dim, self.word_dim
            # q_h . (K_h x + b_h) for every head at once: fold the query into the key projection.
            key_weight = self.keys.weight.view(h, hd, w)
            folded = torch.einsum("hd,hdw->hw", self.query, key_weight) / math.sqrt(hd)
            offset = (self.query * self.keys.bias.view(h, hd)).sum(-1) / math.sqrt(hd)
            scores = tokens @ folded.T + offset + log_counts.unsqueeze(-1)  # (B, U, H)
            scores = torch.cat([self.null_score.expand(b, 1, h), scores], dim=1)
            slots = torch.cat([mask.new_ones(b, 1), mask], dim=1).unsqueeze(-1)  # the null slot is always on
            if self.kernel:
                # Linear ("kernelized") attention: positive features elu(s) + 1 instead of exp(s). A token
                # seen c times weighs c * phi(s) (log c was added to s only for softmax's sake).
                counts = torch.cat([log_counts.new_zeros(b, 1), log_counts], dim=1).exp().unsqueeze(-1)
                phi = (F.elu(scores - counts.log()) + 1) * counts * slots
                weights = phi / phi.sum(dim=1, keepdim=True)
            else:
                weights = torch.softmax(scores.masked_fill(~slots, float("-inf")), dim=1)
            # weights: (B, 1 + U, H); the null slot keeps them finite for an empty document
            null_weight, token_weights = weights[:, 0], weights[:, 1:]
            pooled_words = torch.einsum("buh,buw->bhw", token_weights, tokens)  # (B, H, word_dim)
            value_weight = self.values.weight.view(h, hd, w)
            token_part = torch.einsum("bhw,hdw->bhd", pooled_words, value_weight)
            token_part = token_part + (1 - null_weight).unsqueeze(-1) * self.values.bias.view(h, hd)
            pooled = (token_part + null_weight.unsqueeze(-1) * self.null_value).reshape(b, -1)
            out = pooled + self.mlp(self.mlp_norm(pooled))
            return F.normalize(out, dim=-1)

    return SetEncoderNetwork(config)


@register
class SetEncoder(Encoder):
    family = "setenc"
    config_class = SetEncoderConfig

    def __init__(self, config: SetEncoderConfig, name: str | None = None, device: str = "cpu"):
        super().__init__(config, name)
        self.hasher = TokenHasher(config.num_buckets, config.num_hashes, config.hash_seed)
        self.network = _build_network(config).to(device)
        self.network.eval()
        self.device = device

    @property
    def normalized(self) -> bool:
        return True

    @property
    def dim(self) -> int:
        return self.config.dim

    def to(self, device: str) -> SetEncoder:
        self.network.to(device)
        self.device = device
        return self

    # --- documents -> model inputs ------------------------------------------------------------------
    def bag(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(buckets (U, k), counts (U,)) of the distinct tokens of `text`. Over `max_tokens` distinct tokens,
        the most frequent are kept, ties broken by the token's hash - never by position, so the input stays
        order-free."""
        counted = Counter(word_tokens(text, self.config.lowercase))
        tokens = list(counted)
        if len(tokens) > self.config.max_tokens:
            tokens.sort(key=lambda t: (-counted[t], self.hasher(t), t))
            tokens = tokens[: self.config.max_tokens]
        return self.hasher.many(tokens), np.asarray([counted[t] for t in tokens], dtype=np.float32)

    def embed_bags(self, bags: Sequence[tuple[np.ndarray, np.ndarray]], batch_size: int = 32) -> np.ndarray:
        """Embed prepared bags, batched by size so padding stays small; rows come back in input order."""
        import torch

        out = np.zeros((len(bags), self.config.dim), dtype=np.float32)
        order = sorted(range(len(bags)), key=lambda i: len(bags[i][0]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                batch = pack([bags[i] for i in rows], self.config.counts)
                batch = {k: v.to(self.device) for k, v in batch.items()}
                out[rows] = self.network(**batch).float().cpu().numpy()
                report_batch(start + len(rows), len(order))
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self.embed_bags([self.bag(text) for text in texts], batch_size=batch_size)

    # --- files --------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.write_config(directory)
        save_state_dict(self.network, directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> SetEncoder:
        payload = read_config(directory)
        model = cls(SetEncoderConfig.from_dict(payload["config"]), device=device)
        load_state_dict(model.network, directory, device=device)
        model.network.eval()
        return model
