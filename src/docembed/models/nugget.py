"""NUGGET (Qin & Van Durme, "NUGGET: Neural Agglomerative Embeddings of Text", ICML 2023).

An encoder that keeps only k = ceil(r * n) of its n token states, the "nuggets" (n counts every non-padding
token, special tokens included; k >= 1):

1. The embeddings and bottom `scorer_layer` (l) layers run frozen. A feed-forward scorer reads layer l and
   gives one score per token, s = FFN(X^(l)) (+ `idf_prior` * IDF(token) when set).
2. The top k tokens by s are the nuggets, kept in text order.
3. Feedback: a "nugget" / "non-nugget" type embedding is added to X^(l) before the upper layers.
4. Z = W_V X_top (last layer, W_V starts as the identity) is the multi-vector embedding, scored with
   mean-MaxSim; positions are the selected token indices.
5. Top-k has no gradient: the scorer learns only through the residual, s added to the logits wherever
   something attends over the nuggets (`residual_term`): the decoder's cross-attention in every layer and
   head (losses/nugget_reconstruction.py), or the other document of a paraphrase pair
   (losses/nugget_similarity.py).

Selectors: "scorer" (learned), and the rules a learned selection has to beat (docs/nugget_baselines.md):
"chunk" (the last punctuation token of each of k equal chunks), "idf" (the k tokens of highest IDF),
"prune" (static pruning: every token but the `prune_frequent` most frequent vocabulary entries, Acquavia et
al. 2023; k varies per document) and "pool" (hierarchical token pooling, Clavie et al. 2024: Ward
clustering of the token vectors into k clusters, each nugget the mean of one). `max_nuggets` caps k for every
selector (ratio 1 with a cap of 32 keeps a fixed number per document, as ConstBERT does).
The IDF table is a buffer of the model (`idf`, one value per vocabulary entry), fitted on the training
text by `NuggetEncoder.fit_idf` and saved with the weights, so a document's nuggets never depend on the
rest of the corpus it is encoded with.

Backbones and warm start: models/nugget_backbones.py; decoding and BLEU: models/nugget_generation.py;
training: training/nugget_recipe.py; the measured models and their commands: bench/bench_nugget.py.
"""

from __future__ import annotations

import dataclasses
import math
import string
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from docembed.errors import DocembedError, UsageError
from docembed.models import inference_backends
from docembed.models.base import (
    LONG_MODES,
    Encoder,
    EncoderConfig,
    NotSupportedError,
    check_ratio,
    check_temperature,
    load_state_dict,
    read_config,
    save_state_dict,
)
from docembed.models.families import register
from docembed.models.nugget_backbones import BACKBONES, backbone_path, load_tokenizer
from docembed.runtime import report_batch, reporting_texts
from docembed.tensors import (
    GrowingRows,
    is_long,
    stream_batch,
    streamed_token_windows,
    token_windows,
    tokenized_blocks,
)
from docembed.types import MultiVectors

TOKENIZER_SUBDIR = "tokenizer"
RESIDUALS = ("raw", "straight-through", "none")
SELECTORS = ("scorer", "chunk", "idf", "prune", "pool")
FREEZES = ("bottom", "encoder", "encoder+value")
KINDS = ("bert", "bart")
AGGREGATES = ("none", "assign")
SELECTION_FIELDS = frozenset({"max_nuggets", "prune_frequent", "aggregate", "assign_weight"})
LONG_DOCUMENTS = LONG_MODES


@dataclass
class NuggetConfig(EncoderConfig):
    backbone: str = "minilm"  # "minilm" | a BERT/BART checkpoint path or hub id | "config" (from the dicts)
    kind: str = "bert"  # "bert" (BERT2BERT) | "bart" (BART / mBART)
    ratio: float = 0.1  # compression ratio r: k = ceil(r * n) nuggets for n non-padding tokens
    scorer_layer: int = 3  # l: the scorer reads layer l; embeddings and layers below l are frozen
    feedback: bool = True  # add nugget / non-nugget type embeddings to layer l's output
    residual: str = "raw"  # "raw" (paper) | "straight-through" | "none"
    selector: str = "scorer"  # "scorer" (learned) | "chunk" | "idf" | "prune" | "pool" (rules)
    max_length: int = 512  # tokens per document at encode time (training cuts shorter, see the recipe)
    normalize: bool = True  # L2-normalise the nugget vectors encode() returns
    decoder_layers: int | None = None  # BERT2BERT: how many backbone layers the decoder copies (None = all)
    encoder_config: dict[str, Any] = field(default_factory=dict)  # HF config (BART: the whole model's)
    decoder_config: dict[str, Any] = field(default_factory=dict)  # HF config of the BERT decoder
    # "bottom" (embeddings + layers below l) | "encoder" (the whole encoder) | "encoder+value" (and W_V, kept
    # at the identity: nuggets are the encoder's own token vectors and only the selection learns)
    freeze: str = "bottom"
    idf_prior: float = 0.0  # scorer selector: add this times the token's IDF to its score
    max_nuggets: int | None = None  # at most this many nuggets per document (window), whatever r gives
    # "none": a nugget is its token's vector; "assign": every token joins its most similar nugget and the
    # nugget becomes (1 - w) * its own unit vector + w * the mean of its members' (w = assign_weight): the
    # selection seeds a clustering of all the tokens, and w = 1 is that clustering's means
    aggregate: str = "none"
    assign_weight: float = 1.0
    prune_frequent: int = 1000  # selector "prune": the vocabulary entries of lowest IDF dropped
    # A document longer than max_length: "truncate" reads its first max_length tokens; "windows" reads all
    # of it in consecutive windows of max_length, each keeping ceil(r * n_w) of its n_w tokens, so a
    # document keeps about r of all its tokens (sum of the windows' ceil: ceil(r * n) plus at most one per
    # window beyond the first). The default since 2026-11-25, the zoo model's included: better on PI dev
    # (MRR 98.27 vs 97.98) and on every long validation task (bench/results/CHANGELOG.md).
    long_documents: str = "windows"
    # How a document is scored (issue 45): False, mean-MaxSim over all its nuggets; True, by passages, the
    # nuggets grouped by the window that read them, each window scored by mean-MaxSim and the windows pooled
    # as sbert-windows pools its windows (passage_temperature: 0 the best window, larger towards their mean)
    passage_windows: bool = False
    passage_temperature: float = 0.0

    # scoring settings: a --resume may change them
    INFERENCE_SETTINGS: ClassVar[tuple[str, ...]] = ("passage_windows", "passage_temperature")

    def __post_init__(self):
        if not 0 < self.ratio <= 1:
            raise UsageError(f"NUGGET ratio must be in (0, 1], got {self.ratio}")
        for name, value, allowed in (
            ("residual", self.residual, RESIDUALS),
            ("selector", self.selector, SELECTORS),
            ("freeze", self.freeze, FREEZES),
            ("kind", self.kind, KINDS),
            ("long_documents", self.long_documents, LONG_DOCUMENTS),
            ("aggregate", self.aggregate, AGGREGATES),
        ):
            if value not in allowed:
                raise UsageError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.scorer_layer < 0:
            raise UsageError("scorer_layer must be >= 0")
        if self.max_nuggets is not None and self.max_nuggets < 1:
            raise UsageError(f"max_nuggets must be >= 1, got {self.max_nuggets}")
        if not 0 <= self.assign_weight <= 1:
            raise UsageError(f"assign_weight must be in [0, 1], got {self.assign_weight}")
        if self.prune_frequent < 0:
            raise UsageError(f"prune_frequent must be >= 0, got {self.prune_frequent}")
        if self.selector == "pool" and self.feedback:
            raise UsageError("selector 'pool' makes its own vectors: it needs a model without feedback")
        check_temperature(self.passage_temperature)

    @property
    def uses_idf(self) -> bool:
        return self.selector in ("idf", "prune") or self.idf_prior != 0


# --- selection: pure tensor functions ------------------------------------------------------------------


def nugget_counts(attention_mask: torch.Tensor, ratio: float, cap: int | None = None) -> torch.Tensor:
    """k = ceil(r * n) per row (n = non-padding tokens), at least 1 and at most n (and `cap`). The small
    epsilon keeps float error (0.1 * 30 = 3.0000000000000004) from adding a nugget."""
    n = attention_mask.sum(dim=1).to(torch.float64)
    k = torch.ceil(n * ratio - 1e-9).to(torch.long)
    k = torch.minimum(k.clamp_min(1), n.to(torch.long).clamp_min(1))
    return k if cap is None else k.clamp_max(cap)


def select_top_k(
    scores: torch.Tensor, attention_mask: torch.Tensor, ratio: float, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (b, K) of the top-k tokens per row by score, in text order, and the mask (b, K) of the
    slots that hold a nugget (rows with fewer than K nuggets are padded with index 0, masked). `counts`
    gives k per row instead of ceil(r * n)."""
    valid = attention_mask.bool()
    k = nugget_counts(attention_mask, ratio) if counts is None else counts
    width = int(k.max())
    masked = scores.detach().float().masked_fill(~valid, float("-inf"))
    top = masked.topk(width, dim=1).indices
    slots = torch.arange(width, device=scores.device)[None, :] < k[:, None]
    return _text_order(top, slots, scores.shape[1])


def _text_order(indices: torch.Tensor, slots: torch.Tensor, length: int):
    # Unused slots get keys past the end so that sorting puts the real nuggets first, in text order.
    keys = torch.where(slots, indices, length + torch.arange(indices.shape[1], device=indices.device))
    ordered = keys.sort(dim=1).values
    slots = torch.arange(indices.shape[1], device=indices.device)[None, :] < slots.sum(1, keepdim=True)
    return torch.where(slots, ordered, torch.zeros_like(ordered)), slots


def select_chunks(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    ratio: float,
    punctuation: torch.Tensor,
    cap: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule-based ablation: cut each row's n tokens into k = ceil(r * n) equal chunks and take the last
    punctuation token of each chunk (the chunk's last token when it has none)."""
    k = nugget_counts(attention_mask, ratio, cap)
    n = attention_mask.sum(dim=1)
    width = int(k.max())
    indices = torch.zeros((len(k), width), dtype=torch.long, device=input_ids.device)
    is_punct = punctuation[input_ids]
    for row in range(len(k)):
        count, length = int(k[row]), int(n[row])
        for chunk in range(count):
            start, stop = chunk * length // count, (chunk + 1) * length // count
            stop = max(stop, start + 1)
            hits = torch.nonzero(is_punct[row, start:stop]).flatten()
            indices[row, chunk] = start + (int(hits[-1]) if len(hits) else stop - start - 1)
    slots = torch.arange(width, device=input_ids.device)[None, :] < k[:, None]
    return indices, slots


def select_idf(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    ratio: float,
    idf: torch.Tensor,
    cap: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule-based selector: the k = ceil(r * n) tokens of highest IDF, in text order. Ties go to the
    earlier token (a tiny position term), so the choice is deterministic."""
    counts = nugget_counts(attention_mask, ratio, cap)
    return select_top_k(_idf_scores(input_ids, idf), attention_mask, ratio, counts)


def _idf_scores(input_ids: torch.Tensor, idf: torch.Tensor) -> torch.Tensor:
    n = input_ids.shape[1]
    tie_break = torch.arange(n, 0, -1, device=input_ids.device, dtype=torch.float32) * 1e-6 / n
    return idf[input_ids].float() + tie_break


def select_unfrequent(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    idf: torch.Tensor,
    frequent: int,
    cap: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Static pruning (Acquavia et al., DocEng 2023): every token except those among the `frequent`
    vocabulary entries of lowest IDF (stop words, punctuation, [CLS]/[SEP]), in text order; at least the
    token of highest IDF, at most `cap`. The same entries go in every document, so k varies with the text."""
    dropped = torch.zeros(len(idf), dtype=torch.bool, device=idf.device)
    dropped[idf.argsort(stable=True)[:frequent]] = True
    kept = attention_mask.bool() & ~dropped[input_ids]
    counts = kept.sum(dim=1).clamp_min(1)
    if cap is not None:
        counts = counts.clamp_max(cap)
    scores = _idf_scores(input_ids, idf)
    # a row with nothing left keeps its token of highest IDF: its scores stay unmasked
    scores = torch.where(kept.any(dim=1, keepdim=True), scores.masked_fill(~kept, float("-inf")), scores)
    return select_top_k(scores, attention_mask, 1.0, counts)


def assign_to_nuggets(
    states: torch.Tensor,
    attention_mask: torch.Tensor,
    nuggets: torch.Tensor,
    slots: torch.Tensor,
    weight: float = 1.0,
) -> torch.Tensor:
    """Each token joins the nugget its unit vector is most similar to (cosine); each nugget becomes
    (1 - weight) * its own unit vector + weight * the mean of its members' unit vectors, itself included
    (b, K, d). Padding tokens and empty slots join nothing."""
    unit = torch.nn.functional.normalize(states.float(), dim=-1)
    seeds = torch.nn.functional.normalize(nuggets.float(), dim=-1)
    similarity = (unit @ seeds.transpose(1, 2)).masked_fill(~slots[:, None, :], float("-inf"))
    owner = torch.nn.functional.one_hot(similarity.argmax(dim=-1), seeds.shape[1]).float()
    owner = owner * attention_mask[:, :, None].float()
    sums = owner.transpose(1, 2) @ unit  # (b, K, d)
    counts = owner.sum(dim=1).clamp_min(1.0)[:, :, None]
    return ((1 - weight) * seeds + weight * sums / counts).to(nuggets.dtype)


def pool_hierarchical(
    states: torch.Tensor, attention_mask: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hierarchical token pooling (Clavie, Chaffin and Adams 2024, as PyLate does it): each row's unit
    token vectors clustered by Ward linkage into k = counts[row] clusters, each nugget the mean of one
    cluster; its position is the cluster's first token, nuggets in text order. SciPy's linkage does the
    clustering (O(n^2) per window). Returns (nuggets (b, K, d), positions (b, K), slots (b, K))."""
    from scipy.cluster.hierarchy import fcluster, linkage

    unit = torch.nn.functional.normalize(states.float(), dim=-1)
    lengths = attention_mask.sum(dim=1).tolist()
    width = int(counts.max())
    nuggets = torch.zeros((len(states), width, states.shape[-1]), dtype=states.dtype, device=states.device)
    positions = torch.zeros((len(states), width), dtype=torch.long, device=states.device)
    slots = torch.zeros((len(states), width), dtype=torch.bool, device=states.device)
    for row, (n, k) in enumerate(zip(lengths, counts.tolist(), strict=True)):
        vectors = unit[row, :n]
        if k >= n:
            labels = np.arange(n)
        else:
            tree = linkage(vectors.cpu().double().numpy(), method="ward")
            labels = fcluster(tree, t=k, criterion="maxclust") - 1
        # clusters renumbered by their first token, so the nuggets come in text order
        _, first, labels = np.unique(labels, return_index=True, return_inverse=True)
        order = np.argsort(first)
        slot_of = np.empty_like(order)
        slot_of[order] = np.arange(len(order))
        members = torch.as_tensor(slot_of[labels], device=states.device)
        m = len(order)
        sums = torch.zeros((m, vectors.shape[1]), device=states.device).index_add_(0, members, vectors)
        nuggets[row, :m] = (sums / torch.bincount(members, minlength=m)[:, None]).to(states.dtype)
        positions[row, :m] = torch.as_tensor(first[order], device=states.device)
        slots[row, :m] = True
    return nuggets, positions, slots


def idf_table(token_ids: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """Smoothed IDF per vocabulary entry, ln((1 + N) / (1 + df)) + 1, over N documents of token ids
    (unseen tokens get the highest value, tokens in every document 1)."""
    df = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in token_ids:
        df[torch.tensor(sorted(set(ids)), dtype=torch.long)] += 1
    return (torch.log((1 + len(token_ids)) / (1 + df)) + 1).float()


def residual_term(scores: torch.Tensor, residual: str) -> torch.Tensor:
    """What is added to an attention logit over a nugget: its score (the paper), a straight-through
    zero with the score's gradient, or nothing (an ablation: the scorer then cannot learn)."""
    if residual == "raw":
        return scores
    if residual == "straight-through":
        return scores - scores.detach()
    return torch.zeros_like(scores)


def cross_attention_bias(
    nugget_scores: torch.Tensor, slots: torch.Tensor, residual: str, dtype: torch.dtype, queries: int
) -> torch.Tensor:
    """The additive cross-attention mask (b, 1, q, K): the residual term on nugget slots, the dtype's most
    negative finite value on padded slots (torch.where, so nothing overflows to -inf or NaN). Passed as a
    4-D float mask, which transformers' eager and sdpa attention both add to the logits as is."""
    floor = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=nugget_scores.device)
    bias = torch.where(slots, residual_term(nugget_scores, residual).to(dtype), floor)
    return bias[:, None, None, :].expand(-1, 1, queries, -1)


def _punctuation_table(tokenizer, vocab_size: int) -> torch.Tensor:
    table = torch.zeros(vocab_size, dtype=torch.bool)
    marks = set(string.punctuation) | set("“”‘’–—…«»")
    for token, index in tokenizer.get_vocab().items():
        core = token.removeprefix("##").lstrip("Ġ▁")
        if core and index < vocab_size and all(c in marks for c in core):
            table[index] = True
    return table


# --- the model ------------------------------------------------------------------------------------------


@dataclass
class NuggetOutput:
    nuggets: torch.Tensor  # (b, K, d): Z = W_V X_top, text order
    indices: torch.Tensor  # (b, K): token index of each nugget
    slots: torch.Tensor  # (b, K) bool: which slots hold a nugget
    scores: torch.Tensor  # (b, K): selection score of each nugget (0 for the rule-based selectors)
    all_scores: torch.Tensor | None  # (b, n): every token's score


class NuggetModel(nn.Module):
    """Encoder with NUGGET selection (+ the backbone's decoder). `forward(input_ids, attention_mask)` returns
    the nuggets; the training objectives are in losses/nugget_*.py."""

    def __init__(self, config: NuggetConfig, backbone: nn.Module, punctuation: torch.Tensor):
        super().__init__()
        self.config = config
        self.backbone = backbone
        d = backbone.hidden_size
        if config.scorer_layer > len(backbone.layers):
            raise UsageError(f"scorer_layer {config.scorer_layer} > {len(backbone.layers)} encoder layers")
        self.scorer = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        if config.idf_prior:
            # The learned score is a correction to the IDF rule: it starts at zero, so the untrained model
            # selects exactly what selector "idf" selects, and training moves away from it only where the
            # residual's gradient says so.
            nn.init.zeros_(self.scorer[-1].weight)
            nn.init.zeros_(self.scorer[-1].bias)
        self.type_embeddings = nn.Embedding(2, d)  # 0 = non-nugget, 1 = nugget
        nn.init.normal_(self.type_embeddings.weight, std=0.02)
        self.value = nn.Linear(d, d, bias=False)  # W_V, identity at start: Z begins as the encoder's states
        with torch.no_grad():
            self.value.weight.copy_(torch.eye(d))
        self.register_buffer("punctuation", punctuation, persistent=False)
        if config.uses_idf:  # only then: models saved without an IDF table keep loading
            self.register_buffer("idf", torch.zeros(len(punctuation)))
        self.ratio = config.ratio
        self.freeze()

    # Frozen modules also stay in eval mode (no dropout noise).
    def frozen_modules(self) -> list[nn.Module]:
        if self.config.freeze == "encoder+value":
            return [self.backbone.encoder_stack, self.value]
        if self.config.freeze == "encoder":
            return [self.backbone.encoder_stack]
        return [self.backbone.embeddings, *self.backbone.layers[: self.config.scorer_layer]]

    def freeze(self) -> None:
        for module in self.frozen_modules():
            for p in module.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self

    @property
    def cacheable(self) -> bool:
        """Whether the token states are independent of every trainable weight and of the selection (whole
        encoder frozen, no feedback), so training may compute them once per document."""
        return self.config.freeze in ("encoder", "encoder+value") and not self.config.feedback

    def bottom_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Layer l's states (frozen below: no graph) and the encoder's padding mask."""
        backbone = self.backbone
        with torch.no_grad():
            hidden = backbone.embed(input_ids)
            mask = backbone.encoder_mask(hidden, attention_mask)
            for layer in backbone.layers[: self.config.scorer_layer]:
                hidden = backbone.run_layer(layer, hidden, mask)
        return hidden, mask

    def upper_states(self, hidden: torch.Tensor, mask) -> torch.Tensor:
        backbone = self.backbone
        for layer in backbone.layers[self.config.scorer_layer :]:
            hidden = backbone.run_layer(layer, hidden, mask)
        return backbone.finish(hidden)

    def select(self, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """(indices, slots, scores of the chosen, every token's score or None) from layer l's states."""
        selector, cap = self.config.selector, self.config.max_nuggets
        if selector == "scorer":
            all_scores = self.scorer(hidden).squeeze(-1)
            if self.config.idf_prior:
                all_scores = all_scores + self.config.idf_prior * self.idf[input_ids].to(all_scores.dtype)
            counts = nugget_counts(attention_mask, self.ratio, cap)
            indices, slots = select_top_k(all_scores, attention_mask, self.ratio, counts)
            return indices, slots, all_scores.gather(1, indices), all_scores
        if selector in ("idf", "prune"):
            if not bool(getattr(self, "idf", torch.zeros(1)).any()):
                raise DocembedError(
                    f"selector {selector!r} needs an IDF table: fit one with NuggetEncoder.fit_idf"
                )
            if selector == "idf":
                indices, slots = select_idf(input_ids, attention_mask, self.ratio, self.idf, cap)
            else:
                frequent = self.config.prune_frequent
                indices, slots = select_unfrequent(input_ids, attention_mask, self.idf, frequent, cap)
        else:
            indices, slots = select_chunks(input_ids, attention_mask, self.ratio, self.punctuation, cap)
        return indices, slots, torch.zeros(indices.shape, dtype=hidden.dtype, device=hidden.device), None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> NuggetOutput:
        hidden, mask = self.bottom_states(input_ids, attention_mask)
        if self.config.selector == "pool":
            return self.pooled(self.upper_states(hidden, mask), attention_mask)
        indices, slots, scores, all_scores = self.select(hidden, input_ids, attention_mask)
        if self.config.feedback:
            types = torch.zeros_like(input_ids)
            # amax: padded slots point at index 0 with value 0 and must not undo a real nugget there.
            types.scatter_reduce_(1, indices, slots.long(), reduce="amax")
            hidden = hidden + self.type_embeddings(types).to(hidden.dtype)
        if self.cacheable:
            with torch.no_grad():
                top = self.upper_states(hidden, mask)
        else:
            top = self.upper_states(hidden, mask)
        return self.gather(top, indices, slots, scores, all_scores, attention_mask)

    def gather(self, top, indices, slots, scores, all_scores, attention_mask) -> NuggetOutput:
        chosen = top.gather(1, indices[:, :, None].expand(-1, -1, top.shape[-1]))
        if self.config.aggregate == "assign":
            chosen = assign_to_nuggets(top, attention_mask, chosen, slots, self.config.assign_weight)
        return NuggetOutput(
            self.value(chosen.to(self.value.weight.dtype)), indices, slots, scores, all_scores
        )

    def pooled(self, top: torch.Tensor, attention_mask: torch.Tensor) -> NuggetOutput:
        """Selector "pool": the nuggets are means of clusters of the last layer's token vectors."""
        counts = nugget_counts(attention_mask, self.ratio, self.config.max_nuggets)
        means, positions, slots = pool_hierarchical(top, attention_mask, counts)
        scores = torch.zeros(positions.shape, dtype=top.dtype, device=top.device)
        return NuggetOutput(self.value(means.to(self.value.weight.dtype)), positions, slots, scores, None)

    def from_states(self, bottom, top, input_ids, attention_mask) -> NuggetOutput:
        """The nuggets from token states computed once (layer l's and the last layer's; `cacheable` only)."""
        if self.config.selector == "pool":
            return self.pooled(top, attention_mask)
        indices, slots, scores, all_scores = self.select(bottom, input_ids, attention_mask)
        return self.gather(top, indices, slots, scores, all_scores, attention_mask)

    encode_batch = forward  # the name the rest of the code base reads

    @contextmanager
    def selecting_at(self, ratio: float | None):
        """Select k = ceil(ratio * n) nuggets inside the block (None: the model's own r), then go back."""
        own = self.ratio
        self.ratio = own if ratio is None else ratio
        try:
            yield
        finally:
            self.ratio = own

    def residual(self, scores: torch.Tensor) -> torch.Tensor:
        return residual_term(scores, self.config.residual)

    def cross_mask(self, out: NuggetOutput, queries: int) -> torch.Tensor:
        return cross_attention_bias(
            out.scores, out.slots, self.config.residual, _compute_dtype(out.nuggets), queries
        )

    @torch.no_grad()
    def generate(
        self, input_ids, attention_mask, beams: int = 5, max_new_tokens: int = 128
    ) -> list[list[int]]:
        """Beam search from the nuggets alone (no length penalty); token ids without start/end tokens."""
        from docembed.models.nugget_generation import beam_search

        return beam_search(self, self(input_ids, attention_mask), beams, max_new_tokens)


def _compute_dtype(reference: torch.Tensor) -> torch.dtype:
    # Under autocast the attention runs in the autocast dtype; the mask must match it (sdpa requires so).
    device = reference.device.type
    if device in ("cuda", "cpu") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return reference.dtype


def build_model(config: NuggetConfig, tokenizer) -> NuggetModel:
    """The NuggetModel of `config`: rebuilt from its HF config dicts when it has them (saved models, tests),
    else warm-started from `config.backbone` (which then fills the dicts)."""
    cls = BACKBONES[config.kind]
    if config.encoder_config:
        backbone = cls.from_configs(config.encoder_config, config.decoder_config, tokenizer)
    else:
        try:
            backbone = cls.from_pretrained(backbone_path(config.backbone), config.decoder_layers, tokenizer)
        except OSError as error:
            raise DocembedError(f"cannot load NUGGET backbone {config.backbone!r}: {error}") from None
        config.encoder_config, config.decoder_config = backbone.configs()
    return NuggetModel(config, backbone, _punctuation_table(tokenizer, backbone.vocab_size))


def _unit_rows_in_place(vectors: np.ndarray, rows_at_once: int = 65536) -> None:
    """Each row of `vectors` divided by its length, a block of rows at a time: np.linalg.norm squares its
    whole input first, a copy the size of the output (1.6 GB for one 50 MB document's nuggets). Each row's
    length is summed alike in any block, so the vectors are those of one call."""
    for start in range(0, len(vectors), rows_at_once):
        block = vectors[start : start + rows_at_once]
        np.divide(block, np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12), out=block)


# --- the docembed Encoder -------------------------------------------------------------------------------


@register
class NuggetEncoder(inference_backends.InferenceChoice, Encoder):
    family = "nugget"
    config_class = NuggetConfig
    # "passages": when scored by windows (passage_windows), a document's windows are its passages
    capabilities = frozenset({"ratio", "long", "backends", "selection", "passages"})

    def __init__(self, config: NuggetConfig, name: str | None = None, tokenizer=None, model=None):
        super().__init__(config, name)
        self.tokenizer = (
            tokenizer if tokenizer is not None else load_tokenizer(backbone_path(config.backbone))
        )
        self.model = model if model is not None else build_model(config, self.tokenizer)
        self.model.eval()
        self.device = "cpu"
        self._states_runner = None  # built on first use (exported once, then read from the cache)
        self._shared_states: dict | None = None  # sharing_states

    # --- built from MiniLM (the zoo and train-nugget start here) -------------------------------------
    @classmethod
    def offline_base(cls, config: dict[str, Any]) -> str | None:
        return "minilm" if config.get("backbone", "minilm") == "minilm" else None

    @classmethod
    def from_base(cls, config, files: Path | None = None, seed: int = 0) -> NuggetEncoder:
        values = config.to_dict() if isinstance(config, NuggetConfig) else dict(config)
        # A trained model's config carries the architecture it saved; the base supplies it afresh.
        values.update(encoder_config={}, decoder_config={})
        torch.manual_seed(seed)
        return cls(NuggetConfig.from_dict(values))

    @property
    def weights_module(self) -> torch.nn.Module:
        return self.model

    # --- encoder interface --------------------------------------------------------------------------
    @property
    def multi_vector(self) -> bool:
        return True

    @property
    def normalized(self) -> bool:
        return self.config.normalize

    @property
    def dim(self) -> int:
        return self.model.backbone.hidden_size

    @property
    def max_tokens(self) -> int | None:
        if self.config.long_documents == "windows":
            return None
        return min(self.config.max_length, self.model.backbone.max_positions)

    def to(self, device: str) -> NuggetEncoder:
        self.model.to(device)
        self.device = device
        self._states_runner = None
        return self

    def set_ratio(self, ratio: float) -> None:
        """Change r at encode time (`docembed encode --ratio`)."""
        check_ratio(ratio)
        self.config.ratio = ratio
        self.model.ratio = ratio

    def set_selection(self, selector: str | None = None, **changes: Any) -> None:
        """Change how nuggets are chosen at encode time (`docembed encode --selector/--max-vectors`): the
        learned scorer or one of the rules it is measured against (`selector`; None keeps the model's),
        and any of the config's selection fields given: `max_nuggets` (a cap per window, None for none),
        `prune_frequent`, `aggregate`, `assign_weight`."""
        unknown = set(changes) - SELECTION_FIELDS
        if unknown:
            raise UsageError(f"not a selection setting: {', '.join(sorted(unknown))}")
        if selector is not None:
            changes["selector"] = selector
        config = dataclasses.replace(self.config, **changes)
        if config.selector in ("idf", "prune") and not hasattr(self.model, "idf"):
            raise UsageError(f"selector {config.selector!r} needs an IDF table, which this model has not")
        self.config = self.model.config = config

    def fit_idf(self, texts: Sequence[str]) -> None:
        """Fit the IDF table (selector "idf", `idf_prior`) on `texts`, cut as encode() cuts them."""
        if not self.config.uses_idf:
            raise UsageError("fit_idf needs selector 'idf' or an idf_prior")
        table = idf_table(self.tokenize(texts), len(self.model.idf))
        self.model.idf.copy_(table.to(self.model.idf.device))
        self.fitted_on = f"idf:{len(texts)}:{float(table.sum()):.6f}"  # part of the embedding cache key

    def tokenize(self, texts: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        limit = min(max_length or self.config.max_length, self.model.backbone.max_positions)
        return self.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]

    def _batches(self, ids: list[list[int]], batch_size: int):
        # Sorted by length so that a batch carries little padding; callers restore the input order.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        pad = self.model.backbone.pad_id
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
                attention[row, : len(ids[i])] = 1
            yield chunk, input_ids.to(self.device), attention.to(self.device)

    @torch.no_grad()
    def nuggets(
        self, texts: Sequence[str], batch_size: int = 32, token_ids: bool = True, unit_rows: bool = False
    ) -> list[tuple[np.ndarray, np.ndarray, list[int] | None]]:
        """Per text: (nugget vectors (k, d), token positions (k,), the text's token ids). Without
        `token_ids` (what encode needs), a long text read in windows is streamed and its ids are None.
        `unit_rows`: each vector divided by its length as it is made (a streamed text's vectors may be a
        read-only map of a spill file by the end: tensors.GrowingRows)."""
        if self.config.long_documents == "windows":
            return self._windowed_nuggets(texts, batch_size, token_ids, unit_rows)
        ids = self.tokenize(texts)
        results: list[Any] = [None] * len(ids)
        done = 0
        for chunk, input_ids, attention in self._batches(ids, batch_size):
            out = self._encode_batch(input_ids, attention)
            vectors = out.nuggets.float().cpu().numpy()
            for row, i in enumerate(chunk):
                k = int(out.slots[row].sum())
                results[i] = (vectors[row, :k], out.indices[row, :k].cpu().numpy(), ids[i])
            done += len(chunk)
            report_batch(done, len(ids))
        if unit_rows:
            for vectors, _, _ in results:
                _unit_rows_in_place(vectors)
        return results

    def set_inference(self, backend: str | None = None, precision: str | None = None) -> NuggetEncoder:
        """Run the encoder's pass on OpenVINO / ONNX Runtime or in int8 (models/nugget_inference.py);
        selection, W_V and MaxSim are unchanged."""
        from docembed.models.nugget_inference import check_exportable

        backend, precision = backend or self.inference[0], precision or self.inference[1]
        if inference_backends.resolve_backend(backend, precision, self.device) != "torch":
            check_exportable(self.model)
        self.inference, self._states_runner = (backend, precision), None
        return self

    def _encode_batch(self, input_ids: torch.Tensor, attention: torch.Tensor):
        if self._shared_states is not None:
            bottom, top = self._looked_up_states(input_ids, attention)
        elif self.backend == "torch":
            return self.model.encode_batch(input_ids, attention)
        else:
            bottom, top = self._token_states(input_ids, attention)
        return self.model.from_states(bottom, top, input_ids, attention)

    def _token_states(self, input_ids: torch.Tensor, attention: torch.Tensor):
        """(layer l's states, the last layer's states) of a batch, from the engine that runs the encoder."""
        if self.backend == "torch":
            bottom, mask = self.model.bottom_states(input_ids, attention)
            return bottom, self.model.upper_states(bottom, mask)
        if self._states_runner is None:
            from docembed.models.nugget_inference import StatesRunner, calibration_batches

            self._states_runner = StatesRunner(
                self.model, calibration_batches(self), self.backend, self.inference[1]
            )
        return self._states_runner.states(input_ids, attention)

    def _looked_up_states(self, input_ids: torch.Tensor, attention: torch.Tensor):
        shared, lengths = self._shared_states, attention.sum(dim=1).tolist()
        keys = [tuple(input_ids[row, :n].tolist()) for row, n in enumerate(lengths)]
        missing = [row for row, key in enumerate(keys) if key not in shared]
        if missing:
            bottom, top = self._token_states(input_ids[missing], attention[missing])
            for i, row in enumerate(missing):
                n = lengths[row]
                shared[keys[row]] = (bottom[i, :n].float().clone(), top[i, :n].float().clone())
        bottom = torch.zeros((len(keys), input_ids.shape[1], self.dim), device=input_ids.device)
        top = torch.zeros_like(bottom)
        for row, key in enumerate(keys):
            n = lengths[row]
            bottom[row, :n], top[row, :n] = shared[key]
        return bottom, top

    def set_long_documents(self, mode: str) -> None:
        if mode not in LONG_DOCUMENTS:
            raise UsageError(f"--long must be one of {', '.join(LONG_DOCUMENTS)}, got {mode!r}")
        self.config.long_documents = mode

    def set_passage_temperature(self, temperature: float) -> None:
        """Score documents by passages (`passage_windows`): their nuggets grouped by window, the windows
        pooled at `temperature` (0: the best window)."""
        check_temperature(temperature)
        self.config.passage_windows = True
        self.config.passage_temperature = float(temperature)

    def set_long_queries(self, long_queries: str) -> None:
        raise NotSupportedError(
            f"model {self.name!r} scores a query by all its nuggets: --long-queries applies to passage "
            "vectors (sbert-windows, the student's --long late-chunks)"
        )

    def supports(self, capability: str) -> bool:
        """Its windows are passages (`rerank --passages` names the best) only when it is scored by them."""
        if capability == "passages":
            return self.config.passage_windows
        return super().supports(capability)

    def passage_token_ranges(self, length: int) -> list[tuple[int, int]]:
        """The [start, end) token ranges of its windows (`_windowed_nuggets`): the passages a document is
        scored by when `passage_windows` is on, whose spans `passage_spans` gives."""
        ranges = [
            (start, start + len(window))
            for start, window in token_windows(range(length), self.passage_group_tokens)
        ]
        return ranges if self.config.long_documents == "windows" else ranges[:1]  # truncate: one window

    @property
    def passage_temperature(self) -> float:
        return self.config.passage_temperature if self.config.passage_windows else 0.0

    @property
    def passage_group_tokens(self) -> int:
        """The text tokens of one window (its length less the tokenizer's wrapping) when documents are
        scored by windows, else 0: how docembed.scoring.window_groups finds each nugget's window."""
        if not self.config.passage_windows:
            return 0
        width = min(self.config.max_length, self.model.backbone.max_positions)
        return width - len(self.tokenizer("")["input_ids"])

    def _windowed_nuggets(
        self, texts: Sequence[str], batch_size: int, token_ids: bool = True, unit_rows: bool = False
    ) -> list[tuple]:
        """`nuggets` over the whole of each text: consecutive windows of max_length tokens, each selecting
        its own ceil(r * n_w) nuggets, positions counted in the whole text's token ids."""
        long = [] if token_ids else [i for i, text in enumerate(texts) if is_long(text)]
        if long:  # the usual texts together as always; each long one streamed, a batch of windows at a time
            short = [i for i in range(len(texts)) if i not in set(long)]
            with reporting_texts(0, len(short), len(texts)):
                found = (
                    self._windowed_nuggets([texts[i] for i in short], batch_size, unit_rows=unit_rows)
                    if short
                    else []
                )
            items: list = [None] * len(texts)
            for k, i in enumerate(short):
                items[i] = found[k]
            for k, i in enumerate(long):
                with reporting_texts(len(short) + k, 1, len(texts)):
                    items[i] = self._streamed_nuggets(texts[i], batch_size, unit_rows)
            return items
        width = min(self.config.max_length, self.model.backbone.max_positions)
        tokens = self.tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)[
            "input_ids"
        ]
        # the tokenizer's own wrapping of a text ([CLS] ... [SEP] for BERT, <s> ... </s> for BART)
        empty = self.tokenizer("")["input_ids"]
        before, after = empty[:1], empty[1:]
        windows, owners, starts = [], [], []
        for index, text_tokens in enumerate(tokens):
            for start, window in token_windows(text_tokens, width - len(empty)):
                windows.append([*before, *window, *after])
                owners.append(index)
                starts.append(start)
        found: list[Any] = [None] * len(windows)
        done = 0
        for chunk, input_ids, attention in self._batches(windows, batch_size):
            out = self._encode_batch(input_ids, attention)
            vectors = out.nuggets.float().cpu().numpy()
            for row, w in enumerate(chunk):
                k = int(out.slots[row].sum())
                found[w] = (vectors[row, :k], out.indices[row, :k].cpu().numpy() + starts[w])
            done += len(chunk)
            report_batch(done, len(windows))
        per_text: list[list] = [[] for _ in tokens]
        for w, owner in enumerate(owners):
            per_text[owner].append(found[w])
        results = [
            (
                np.concatenate([v for v, _ in parts]),
                np.concatenate([p for _, p in parts]),
                [*before, *text_tokens, *after],
            )
            for parts, text_tokens in zip(per_text, tokens, strict=True)
        ]
        if unit_rows:
            for vectors, _, _ in results:
                _unit_rows_in_place(vectors)
        return results

    def _streamed_nuggets(self, text: str, batch_size: int, unit_rows: bool = False) -> tuple:
        """`_windowed_nuggets` of one long text, its ids tokenized block by block and its windows encoded
        `batch_size` at a time: memory holds a block, a batch and the nuggets up to GrowingRows' spill size
        (past it, they go to a temporary file, mapped at the end)."""
        width = min(self.config.max_length, self.model.backbone.max_positions)
        empty = self.tokenizer("")["input_ids"]
        before, after = empty[:1], empty[1:]

        def ids(block: str) -> list[int]:
            encoded = self.tokenizer(block, add_special_tokens=False, truncation=False, verbose=False)
            return encoded["input_ids"]

        # the nuggets go into one growing array as each batch comes: joined at the end, the batches and the
        # output would both be held (the output of a 50 MB text is 1.6 GB); a word-piece token is ~4
        # characters, so len(text) // 3 tokens over-reserves typical text (pages never written cost nothing)
        vectors = GrowingRows(self.dim, np.float32, expected=math.ceil(self.model.ratio * len(text) / 3))
        positions: list[np.ndarray] = []

        def run(windows: list[list[int]], starts: list[int]) -> None:
            found: list = [None] * len(windows)
            for chunk, input_ids, attention in self._batches(windows, batch_size):
                out = self._encode_batch(input_ids, attention)
                nuggets = out.nuggets.float().cpu().numpy()
                for row, w in enumerate(chunk):
                    k = int(out.slots[row].sum())
                    found[w] = (nuggets[row, :k], out.indices[row, :k].cpu().numpy() + starts[w])
            # in window order (a batch may take them in another)
            for window_vectors, window_positions in found:
                if unit_rows:
                    _unit_rows_in_place(window_vectors)
                vectors.extend(window_vectors)
                positions.append(window_positions)

        batch_size = stream_batch(batch_size, width)
        windows, starts = [], []
        for start, window in streamed_token_windows(tokenized_blocks(ids, text), width - len(empty)):
            windows.append([*before, *window, *after])
            starts.append(start)
            if len(windows) == batch_size:
                run(windows, starts)
                windows, starts = [], []
        if windows:
            run(windows, starts)
        return vectors.result(), np.concatenate(positions), None

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> MultiVectors:
        texts = list(texts)
        if not texts:
            return MultiVectors(np.zeros((0, self.dim), dtype=np.float32), np.zeros(1, dtype=np.int64))
        # normalized in place as made: a long text's nuggets are the output's size, not copied once more
        items = self.nuggets(texts, batch_size, token_ids=False, unit_rows=self.normalized)
        vectors = [v for v, _, _ in items]
        positions = [p for _, p, _ in items]
        del items  # `vectors` alone holds the nuggets now, so from_list can free each once it is copied
        return MultiVectors.from_list(vectors, positions, consume=True)

    # --- token states computed once (benches: many selectors over one frozen encoder) ----------------
    def padded_batches(self, ids: list[list[int]], batch_size: int):
        """(positions in `ids`, input ids, attention mask) batches of similar lengths, as encode() runs."""
        return self._batches(ids, batch_size)

    @contextmanager
    def sharing_states(self, states: dict[tuple[int, ...], tuple]):
        """Inside the block, encode() takes each window's token states (token ids -> (layer l's states, the
        last layer's)) from `states`, computing and adding those it lacks. Models whose token states
        depend on no trained weight (`model.cacheable`) over the same frozen backbone can share one dict:
        each then runs only its selection and W_V, whatever its selector, r or long-document mode."""
        if not self.model.cacheable:
            raise UsageError("sharing token states needs a frozen encoder without feedback (model.cacheable)")
        self._shared_states = states
        try:
            yield
        finally:
            self._shared_states = None

    def token_states(self, texts: Sequence[str], batch_size: int = 32) -> dict[tuple[int, ...], tuple]:
        """The token states of every window `encode(texts)` reads (see `sharing_states`)."""
        states: dict[tuple[int, ...], tuple] = {}
        with self.sharing_states(states):
            self.encode(texts, batch_size)
        return states

    def encode_from_states(self, texts: Sequence[str], states: dict, batch_size: int = 64) -> MultiVectors:
        """encode(texts) from `token_states` of them (computed by this model or one sharing its frozen
        backbone)."""
        with self.sharing_states(states):
            return self.encode(texts, batch_size)

    @torch.no_grad()
    def reconstruct_ids(
        self, texts: Sequence[str], beams: int = 5, batch_size: int = 8, max_length: int | None = None
    ) -> tuple[list[list[int]], list[list[int]]]:
        """(input token ids, ids decoded from the nuggets alone by beam search) per text."""
        ids = self.tokenize(texts, max_length)
        outputs: list[list[int]] = [[] for _ in ids]
        for chunk, input_ids, attention in self._batches(ids, batch_size):
            generated = self.model.generate(
                input_ids, attention, beams, max_new_tokens=input_ids.shape[1] + 8
            )
            for row, i in enumerate(chunk):
                outputs[i] = generated[row]
        return ids, outputs

    def reconstruct(
        self, texts: Sequence[str], beams: int = 5, batch_size: int = 8, max_length: int | None = None
    ) -> list[str]:
        """Decode each text back from its nuggets alone (beam search): the reconstruction probe."""
        _, outputs = self.reconstruct_ids(texts, beams, batch_size, max_length)
        return [self.tokenizer.decode(o, skip_special_tokens=True) for o in outputs]

    # --- files --------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.write_config(directory)
        save_state_dict(self.model, directory)
        self.tokenizer.save_pretrained(str(directory / TOKENIZER_SUBDIR))

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> NuggetEncoder:
        payload = read_config(directory)
        config = NuggetConfig.from_dict(payload["config"])
        if not config.encoder_config:
            raise DocembedError(f"{directory}: config.json has no encoder_config")
        tokenizer = load_tokenizer(Path(directory) / TOKENIZER_SUBDIR)
        model = build_model(config, tokenizer)
        load_state_dict(model, directory, device="cpu")
        return cls(config, tokenizer=tokenizer, model=model).to(device)


def expected_nuggets(n: int, ratio: float) -> int:
    """k for a document of n tokens (what `nugget_counts` computes), for reports and tests."""
    return max(1, min(n, math.ceil(round(n * ratio, 9))))
