"""NUGGET (Qin & Van Durme, "NUGGET: Neural Agglomerative Embeddings of Text", ICML 2023).

A transformer encoder-decoder whose encoder keeps only k = ceil(r * n) of its n token states, the "nuggets":

1. The encoder runs its embeddings and bottom `scorer_layer` (l) layers, which stay frozen (the paper found
   that necessary for stable training). A feed-forward scorer reads the layer-l states X^(l) and gives one
   score per token, s = FFN(X^(l)).
2. The top k tokens by s are the nuggets. Here n counts every non-padding token, the special tokens
   ([CLS]/[SEP] or <s>/</s>) included, and k = ceil(r * n) is at least 1, so k grows with the document.
3. Nugget feedback: a "nugget" or "non-nugget" type embedding is added to X^(l) before the upper layers,
   so the upper layers know what was selected.
4. The nuggets' last-layer states times a trainable W_V (initialised to the identity) are the latent
   Z (k x d), in text order. `encode` returns them as a multi-vector embedding (positions = the selected
   token indices of the backbone's tokenisation), scored with mean-MaxSim.
5. Residual connection: the decoder cross-attends only to Z, and the scores s of the selected tokens are
   added to the cross-attention logits in every decoder layer and head. Top-k is not differentiable, so
   this is the scorer's only gradient. It is passed as an additive float cross-attention mask of shape
   (b, 1, q, k) (transformers returns a 4-D mask as is, and both its eager and sdpa attention add it to
   the logits), with torch.finfo(dtype).min - never -inf arithmetic - on padded nugget slots, so fp16 and
   bf16 stay finite. `residual="straight-through"` adds s - stopgrad(s) instead (gradient without
   changing the logits), `residual="none"` adds nothing (an ablation: the scorer then cannot learn).

Backbones. The same code serves:
- `backbone="minilm"` (default, offline): a BERT2BERT warm start from the offline all-MiniLM-L6-v2 BERT
  checkpoint: a BertModel encoder and a BertLMHeadModel decoder initialised from the same weights, with
  new cross-attention (and a new MLM transform; the output layer is tied to the decoder's embeddings).
- a BART-family checkpoint through transformers (`backbone="facebook/bart-base"`, or mBART-50
  `facebook/mbart-large-50` as in the paper), for users with network access (`kind="bart"`).
- a model built from `encoder_config` / `decoder_config` (HF config dicts; random weights): how saved
  models are rebuilt before their weights are loaded, and what the tests use.

Ablations (config): `selector="chunk"` (rule-based: the last punctuation token of each of k equal chunks,
no scorer), `feedback=False`, another `scorer_layer`.

Training: `docembed train-nugget` (training/nugget_recipe.py). The offline model measured in
bench/bench_nugget.py was trained on paraphrase pairs of the PI train split (task source -> gold
candidate and the reverse, 2,042 pairs, 261k source tokens) for 3 epochs (768 steps, 34 minutes on one
CPU thread):

    python bench/bench_nugget.py --make-pairs runs/pi_train_pairs.jsonl
    OMP_NUM_THREADS=1 docembed --seed 0 train-nugget runs/pi_train_pairs.jsonl -o runs/nugget-pi-mt \
        --objective mt --ratio 0.1 --max-length 128 --decoder-layers 3 --batch-size 8 --lr 5e-5 \
        --warmup-steps 30 --epochs 3 --log-every 5 --save-every 100
    python bench/bench_nugget.py --out bench/results/nugget --model runs/nugget-pi-mt --full --max-length 128
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from docembed.errors import DocembedError, UsageError
from docembed.io.embeddings import MultiVectors
from docembed.models.base import Encoder, EncoderConfig, load_state_dict, read_config, save_state_dict
from docembed.models.registry import register

TOKENIZER_SUBDIR = "tokenizer"
RESIDUALS = ("raw", "straight-through", "none")
SELECTORS = ("scorer", "chunk")
KINDS = ("bert", "bart")


@dataclass
class NuggetConfig(EncoderConfig):
    backbone: str = "minilm"  # "minilm" | a BERT/BART checkpoint path or hub id | "config" (from the dicts)
    kind: str = "bert"  # "bert" (BERT2BERT) | "bart" (BART / mBART)
    ratio: float = 0.1  # compression ratio r: k = ceil(r * n) nuggets for n non-padding tokens
    scorer_layer: int = 3  # l: the scorer reads layer l; embeddings and layers below l are frozen
    feedback: bool = True  # add nugget / non-nugget type embeddings to layer l's output
    residual: str = "raw"  # "raw" (paper) | "straight-through" | "none"
    selector: str = "scorer"  # "scorer" (learned) | "chunk" (rule-based ablation)
    max_length: int = 512  # tokens per document at encode time (training cuts shorter, see the recipe)
    normalize: bool = True  # L2-normalise the nugget vectors encode() returns
    decoder_layers: int | None = None  # BERT2BERT: how many backbone layers the decoder copies (None = all)
    encoder_config: dict[str, Any] = field(default_factory=dict)  # HF config (BART: the whole model's)
    decoder_config: dict[str, Any] = field(default_factory=dict)  # HF config of the BERT decoder

    def __post_init__(self):
        if not 0 < self.ratio <= 1:
            raise UsageError(f"NUGGET ratio must be in (0, 1], got {self.ratio}")
        if self.residual not in RESIDUALS:
            raise UsageError(f"residual must be one of {', '.join(RESIDUALS)}, got {self.residual!r}")
        if self.selector not in SELECTORS:
            raise UsageError(f"selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        if self.kind not in KINDS:
            raise UsageError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.scorer_layer < 0:
            raise UsageError("scorer_layer must be >= 0")


# --- selection: pure tensor functions ------------------------------------------------------------------


def nugget_counts(attention_mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """k = ceil(r * n) per row (n = non-padding tokens), at least 1 and at most n. The small epsilon keeps
    float error (0.1 * 30 = 3.0000000000000004) from adding a nugget."""
    n = attention_mask.sum(dim=1).to(torch.float64)
    k = torch.ceil(n * ratio - 1e-9).to(torch.long)
    return torch.minimum(k.clamp_min(1), n.to(torch.long).clamp_min(1))


def select_top_k(
    scores: torch.Tensor, attention_mask: torch.Tensor, ratio: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (b, K) of the top-k tokens per row by score, in text order, and the mask (b, K) of the
    slots that hold a nugget (rows with fewer than K nuggets are padded with index 0, masked)."""
    valid = attention_mask.bool()
    k = nugget_counts(attention_mask, ratio)
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
    input_ids: torch.Tensor, attention_mask: torch.Tensor, ratio: float, punctuation: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule-based ablation: cut each row's n tokens into k = ceil(r * n) equal chunks and take the last
    punctuation token of each chunk (the chunk's last token when it has none)."""
    k = nugget_counts(attention_mask, ratio)
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


def cross_attention_bias(
    nugget_scores: torch.Tensor, slots: torch.Tensor, residual: str, dtype: torch.dtype, queries: int
) -> torch.Tensor:
    """The additive cross-attention mask (b, 1, q, K): the residual term on nugget slots, the dtype's most
    negative finite value on padded slots (torch.where, so nothing overflows to -inf or NaN)."""
    if residual == "raw":
        term = nugget_scores
    elif residual == "straight-through":
        term = nugget_scores - nugget_scores.detach()
    else:
        term = torch.zeros_like(nugget_scores)
    floor = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=nugget_scores.device)
    bias = torch.where(slots, term.to(dtype), floor)
    return bias[:, None, None, :].expand(-1, 1, queries, -1)


def _punctuation_table(tokenizer, vocab_size: int) -> torch.Tensor:
    table = torch.zeros(vocab_size, dtype=torch.bool)
    marks = set(string.punctuation) | set("“”‘’–—…«»")
    for token, index in tokenizer.get_vocab().items():
        core = token.removeprefix("##").lstrip("Ġ▁")
        if core and index < vocab_size and all(c in marks for c in core):
            table[index] = True
    return table


# --- backbones ------------------------------------------------------------------------------------------


def _hf_config(values: dict[str, Any]):
    from transformers import CONFIG_MAPPING

    values = {k: v for k, v in values.items() if k not in ("transformers_version",)}
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


def _padding_mask(hf_config, hidden: torch.Tensor, attention_mask: torch.Tensor):
    """The encoder self-attention padding mask in the form the configured attention implementation wants
    (bool for sdpa, additive float for eager), built by transformers itself."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=hf_config, inputs_embeds=hidden, attention_mask=attention_mask)


class BertBackbone(nn.Module):
    """BERT2BERT: a BertModel encoder and a BertLMHeadModel decoder with cross-attention."""

    labels_drop_first = True  # targets are [CLS] x [SEP]; [CLS] is the decoder's start token

    def __init__(self, encoder, decoder, tokenizer):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.start_id = tokenizer.cls_token_id
        self.end_id = tokenizer.sep_token_id
        self.pad_id = tokenizer.pad_token_id

    @classmethod
    def from_configs(cls, encoder_config: dict, decoder_config: dict, tokenizer) -> BertBackbone:
        from transformers import BertLMHeadModel, BertModel

        return cls(
            BertModel(_hf_config(encoder_config), add_pooling_layer=False),
            BertLMHeadModel(_hf_config(decoder_config)),
            tokenizer,
        )

    @classmethod
    def from_pretrained(cls, path: str, decoder_layers: int | None, tokenizer) -> BertBackbone:
        from transformers import BertLMHeadModel, BertModel

        encoder = BertModel.from_pretrained(path, add_pooling_layer=False)
        extra = {"num_hidden_layers": decoder_layers} if decoder_layers else {}
        decoder = BertLMHeadModel.from_pretrained(path, is_decoder=True, add_cross_attention=True, **extra)
        return cls(encoder, decoder, tokenizer)

    def configs(self) -> tuple[dict, dict]:
        return self.encoder.config.to_dict(), self.decoder.config.to_dict()

    @property
    def hidden_size(self) -> int:
        return self.encoder.config.hidden_size

    @property
    def max_positions(self) -> int:
        return self.encoder.config.max_position_embeddings

    @property
    def embeddings(self) -> nn.Module:
        return self.encoder.embeddings

    @property
    def layers(self) -> nn.ModuleList:
        return self.encoder.encoder.layer

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder.embeddings(input_ids=input_ids)

    def encoder_mask(self, hidden: torch.Tensor, attention_mask: torch.Tensor):
        return _padding_mask(self.encoder.config, hidden, attention_mask)

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = layer(hidden, mask)
        return out[0] if isinstance(out, tuple) else out

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def decode(self, input_ids, nuggets, cross_mask, past=None, use_cache=False):
        out = self.decoder(
            input_ids=input_ids,
            encoder_hidden_states=nuggets,
            encoder_attention_mask=cross_mask,
            past_key_values=past,
            use_cache=use_cache,
        )
        return out.logits, out.past_key_values


class BartBackbone(nn.Module):
    """BART / mBART through transformers' *ForConditionalGeneration model."""

    labels_drop_first = False  # targets are <s> x </s>; the decoder starts from decoder_start_token_id

    def __init__(self, model, tokenizer):
        super().__init__()
        self.model = model
        config = model.config
        self.start_id = config.decoder_start_token_id
        self.end_id = config.eos_token_id
        self.pad_id = config.pad_token_id

    @classmethod
    def from_configs(cls, encoder_config: dict, decoder_config: dict, tokenizer) -> BartBackbone:
        from transformers import AutoModelForSeq2SeqLM

        return cls(AutoModelForSeq2SeqLM.from_config(_hf_config(encoder_config)), tokenizer)

    @classmethod
    def from_pretrained(cls, path: str, decoder_layers: int | None, tokenizer) -> BartBackbone:
        from transformers import AutoModelForSeq2SeqLM

        return cls(AutoModelForSeq2SeqLM.from_pretrained(path), tokenizer)

    def configs(self) -> tuple[dict, dict]:
        return self.model.config.to_dict(), {}

    @property
    def _encoder(self):
        return self.model.get_encoder()

    @property
    def hidden_size(self) -> int:
        return self.model.config.d_model

    @property
    def max_positions(self) -> int:
        return self.model.config.max_position_embeddings

    @property
    def embeddings(self) -> nn.Module:
        encoder = self._encoder
        return nn.ModuleList([encoder.embed_tokens, encoder.embed_positions, encoder.layernorm_embedding])

    @property
    def layers(self) -> nn.ModuleList:
        return self._encoder.layers

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        encoder = self._encoder
        tokens = encoder.embed_tokens(input_ids)
        positions = encoder.embed_positions(tokens[:, :, -1]).to(tokens.device)  # shape-only argument
        hidden = encoder.layernorm_embedding(tokens + positions)
        return nn.functional.dropout(hidden, p=encoder.dropout, training=encoder.training)

    def encoder_mask(self, hidden: torch.Tensor, attention_mask: torch.Tensor):
        return _padding_mask(self.model.config, hidden, attention_mask)

    def run_layer(self, layer: nn.Module, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = layer(hidden, mask)
        return out[0] if isinstance(out, tuple) else out

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = getattr(self._encoder, "layer_norm", None)  # mBART is pre-LN: a final norm
        return norm(hidden) if norm is not None else hidden

    def decode(self, input_ids, nuggets, cross_mask, past=None, use_cache=False):
        decoder = self.model.get_decoder()
        out = decoder(
            input_ids=input_ids,
            encoder_hidden_states=nuggets,
            encoder_attention_mask=cross_mask,
            past_key_values=past,
            use_cache=use_cache,
        )
        logits = self.model.lm_head(out.last_hidden_state)
        bias = getattr(self.model, "final_logits_bias", None)
        return (logits + bias.to(logits.dtype) if bias is not None else logits), out.past_key_values


BACKBONES = {"bert": BertBackbone, "bart": BartBackbone}


# --- the model ------------------------------------------------------------------------------------------


@dataclass
class NuggetOutput:
    nuggets: torch.Tensor  # (b, K, d): Z = W_V X_top, text order
    indices: torch.Tensor  # (b, K): token index of each nugget
    slots: torch.Tensor  # (b, K) bool: which slots hold a nugget
    scores: torch.Tensor  # (b, K): scorer output of each nugget (0 for the chunk selector)
    all_scores: torch.Tensor | None  # (b, n): every token's score


class NuggetModel(nn.Module):
    """Encoder-decoder with NUGGET selection. `forward(batch)` returns the training loss terms."""

    def __init__(self, config: NuggetConfig, backbone: nn.Module, punctuation: torch.Tensor):
        super().__init__()
        self.config = config
        self.backbone = backbone
        d = backbone.hidden_size
        if config.scorer_layer > len(backbone.layers):
            raise UsageError(f"scorer_layer {config.scorer_layer} > {len(backbone.layers)} encoder layers")
        self.scorer = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.type_embeddings = nn.Embedding(2, d)  # 0 = non-nugget, 1 = nugget
        nn.init.normal_(self.type_embeddings.weight, std=0.02)
        self.value = nn.Linear(d, d, bias=False)  # W_V, identity at start: Z begins as the encoder's states
        with torch.no_grad():
            self.value.weight.copy_(torch.eye(d))
        self.register_buffer("punctuation", punctuation, persistent=False)
        self.ratio = config.ratio
        self.freeze_bottom()

    # The embeddings and bottom l layers are frozen (and kept in eval mode: no dropout noise either).
    def frozen_modules(self) -> list[nn.Module]:
        return [self.backbone.embeddings, *self.backbone.layers[: self.config.scorer_layer]]

    def freeze_bottom(self) -> None:
        for module in self.frozen_modules():
            for p in module.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self

    def encode_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> NuggetOutput:
        backbone, top = self.backbone, self.config.scorer_layer
        with torch.no_grad():  # frozen bottom: no graph needed
            hidden = backbone.embed(input_ids)
            mask = backbone.encoder_mask(hidden, attention_mask)
            for layer in backbone.layers[:top]:
                hidden = backbone.run_layer(layer, hidden, mask)
        if self.config.selector == "scorer":
            all_scores = self.scorer(hidden).squeeze(-1)
            indices, slots = select_top_k(all_scores, attention_mask, self.ratio)
            scores = all_scores.gather(1, indices)
        else:
            all_scores = None
            indices, slots = select_chunks(input_ids, attention_mask, self.ratio, self.punctuation)
            scores = torch.zeros(indices.shape, dtype=hidden.dtype, device=hidden.device)
        if self.config.feedback:
            types = torch.zeros_like(input_ids)
            # amax: padded slots point at index 0 with value 0 and must not undo a real nugget there.
            types.scatter_reduce_(1, indices, slots.long(), reduce="amax")
            hidden = hidden + self.type_embeddings(types).to(hidden.dtype)
        for layer in backbone.layers[top:]:
            hidden = backbone.run_layer(layer, hidden, mask)
        hidden = backbone.finish(hidden)
        chosen = hidden.gather(1, indices[:, :, None].expand(-1, -1, hidden.shape[-1]))
        return NuggetOutput(self.value(chosen), indices, slots, scores, all_scores)

    def cross_mask(self, out: NuggetOutput, queries: int) -> torch.Tensor:
        return cross_attention_bias(
            out.scores, out.slots, self.config.residual, _compute_dtype(out.nuggets), queries
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.encode_batch(batch["input_ids"], batch["attention_mask"])
        decoder_input, labels = batch["decoder_input_ids"], batch["labels"]
        logits, _ = self.backbone.decode(
            decoder_input, out.nuggets, self.cross_mask(out, decoder_input.shape[1])
        )
        loss = nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )
        return {"loss": loss, "nuggets_per_doc": out.slots.sum(1).float().mean().detach()}

    @torch.no_grad()
    def generate(
        self, input_ids, attention_mask, beams: int = 5, max_new_tokens: int = 128
    ) -> list[list[int]]:
        """Beam search from the nuggets alone (no length penalty); token ids without start/end tokens."""
        out = self.encode_batch(input_ids, attention_mask)
        return beam_search(self, out, beams, max_new_tokens)


def _compute_dtype(reference: torch.Tensor) -> torch.dtype:
    # Under autocast the attention runs in the autocast dtype; the mask must match it (sdpa requires so).
    device = reference.device.type
    if device in ("cuda", "cpu") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return reference.dtype


def beam_search(model: NuggetModel, out: NuggetOutput, beams: int, max_new_tokens: int) -> list[list[int]]:
    backbone = model.backbone
    b = out.nuggets.shape[0]
    nuggets = out.nuggets.repeat_interleave(beams, dim=0)
    expanded = NuggetOutput(
        nuggets,
        out.indices,
        out.slots.repeat_interleave(beams, 0),
        out.scores.repeat_interleave(beams, 0),
        None,
    )
    cross = model.cross_mask(expanded, 1)
    device = nuggets.device
    sequences = torch.full((b * beams, 1), backbone.start_id, dtype=torch.long, device=device)
    scores = torch.full((b, beams), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    past = None
    for _ in range(max_new_tokens):
        logits, past = backbone.decode(sequences[:, -1:], nuggets, cross, past, use_cache=True)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)
        vocab = logp.shape[-1]
        total = (scores[:, :, None] + logp.view(b, beams, vocab)).view(b, -1)
        top_scores, top_ids = total.topk(2 * beams, dim=1)
        next_rows, next_tokens, next_scores = [], [], []
        for row in range(b):
            picked = 0
            for score, flat in zip(top_scores[row].tolist(), top_ids[row].tolist(), strict=True):
                beam, token = divmod(flat, vocab)
                source = row * beams + beam
                if token == backbone.end_id:
                    if not done[row] and score > float("-inf"):
                        finished[row].append((score, sequences[source, 1:].tolist()))
                    continue
                if picked < beams:
                    next_rows.append(source)
                    next_tokens.append(token)
                    next_scores.append(score)
                    picked += 1
            if len(finished[row]) >= beams:
                done[row] = True
        if all(done):
            break
        beam_index = torch.tensor(next_rows, device=device)
        past.reorder_cache(beam_index)
        sequences = torch.cat(
            [sequences[beam_index], torch.tensor(next_tokens, device=device)[:, None]], dim=1
        )
        scores = torch.tensor(next_scores, device=device).view(b, beams)
    results = []
    for row in range(b):
        if finished[row]:
            results.append(max(finished[row], key=lambda item: item[0])[1])
        else:
            best = int(scores[row].argmax())
            results.append(sequences[row * beams + best, 1:].tolist())
    return results


def build_model(config: NuggetConfig, tokenizer) -> NuggetModel:
    """The NuggetModel of `config`: rebuilt from its HF config dicts when it has them (saved models, tests),
    else warm-started from `config.backbone` (which then fills the dicts)."""
    cls = BACKBONES[config.kind]
    if config.encoder_config:
        backbone = cls.from_configs(config.encoder_config, config.decoder_config, tokenizer)
    else:
        try:
            backbone = cls.from_pretrained(_backbone_path(config), config.decoder_layers, tokenizer)
        except OSError as error:
            raise DocembedError(f"cannot load NUGGET backbone {config.backbone!r}: {error}") from None
        config.encoder_config, config.decoder_config = backbone.configs()
    vocab = backbone.decoder.config.vocab_size if config.kind == "bert" else backbone.model.config.vocab_size
    return NuggetModel(config, backbone, _punctuation_table(tokenizer, vocab))


def _backbone_path(config: NuggetConfig) -> str:
    if config.backbone == "minilm":
        from docembed.models.offline import minilm_path

        return str(minilm_path())
    return config.backbone


def load_tokenizer(source: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise DocembedError(f"cannot load a tokenizer from {source}: {error}") from None


# --- the docembed Encoder -------------------------------------------------------------------------------


@register
class NuggetEncoder(Encoder):
    family = "nugget"
    config_class = NuggetConfig

    def __init__(self, config: NuggetConfig, name: str | None = None, tokenizer=None, model=None):
        super().__init__(config, name)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(_backbone_path(config))
        self.model = model if model is not None else build_model(config, self.tokenizer)
        self.model.eval()
        self.device = "cpu"

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

    def to(self, device: str) -> NuggetEncoder:
        self.model.to(device)
        self.device = device
        return self

    def set_ratio(self, ratio: float) -> None:
        """Change r at encode time (`docembed encode --ratio`)."""
        if not 0 < ratio <= 1:
            raise UsageError(f"--ratio must be in (0, 1], got {ratio}")
        self.config.ratio = ratio
        self.model.ratio = ratio

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
        self, texts: Sequence[str], batch_size: int = 32
    ) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
        """Per text: (nugget vectors (k, d), token positions (k,), the text's token ids)."""
        ids = self.tokenize(texts)
        results: list[Any] = [None] * len(ids)
        for chunk, input_ids, attention in self._batches(ids, batch_size):
            out = self.model.encode_batch(input_ids, attention)
            vectors = out.nuggets.float().cpu().numpy()
            for row, i in enumerate(chunk):
                k = int(out.slots[row].sum())
                results[i] = (vectors[row, :k], out.indices[row, :k].cpu().numpy(), ids[i])
        return results

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> MultiVectors:
        texts = list(texts)
        if not texts:
            return MultiVectors(np.zeros((0, self.dim), dtype=np.float32), np.zeros(1, dtype=np.int64))
        items = self.nuggets(texts, batch_size)
        vectors = [
            v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) if self.normalized else v
            for v, _, _ in items
        ]
        return MultiVectors.from_list(vectors, [p for _, p, _ in items])

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


# --- probes: token statistics and reconstruction BLEU ---------------------------------------------------


def nugget_token_statistics(items, tokenizer) -> dict[str, Any]:
    """How often each token type is chosen as a nugget versus how often it occurs (paper Figure 5).
    `items` is what `NuggetEncoder.nuggets` returns. Rows are sorted by times chosen."""
    from collections import Counter

    seen, chosen = Counter(), Counter()
    for _, positions, ids in items:
        tokens = tokenizer.convert_ids_to_tokens(ids)
        seen.update(tokens)
        chosen.update(tokens[p] for p in positions.tolist())
    total_tokens, total_nuggets = sum(seen.values()), sum(chosen.values())

    def row(token: str) -> dict[str, Any]:
        return {
            "token": token,
            "chosen": chosen[token],
            "seen": seen[token],
            "nugget_share": chosen[token] / max(total_nuggets, 1),
            "token_share": seen[token] / max(total_tokens, 1),
            "selection_rate": chosen[token] / max(seen[token], 1),
        }

    return {
        "documents": len(items),
        "tokens": total_tokens,
        "nuggets": total_nuggets,
        "rows": [row(t) for t, _ in chosen.most_common()],
        "frequent": [row(t) for t, _ in seen.most_common(20)],
    }


def corpus_bleu(hypotheses: Sequence[list[str]], references: Sequence[list[str]], max_order: int = 4) -> dict:
    """Corpus BLEU (Papineni et al. 2002): geometric mean of clipped n-gram precisions (n = 1..4, counts
    summed over the corpus) times the brevity penalty exp(1 - r / c) when c < r. One reference each."""
    from collections import Counter

    matches, totals = [0] * max_order, [0] * max_order
    hyp_len = ref_len = 0
    for hyp, ref in zip(hypotheses, references, strict=True):
        hyp_len, ref_len = hyp_len + len(hyp), ref_len + len(ref)
        for n in range(1, max_order + 1):
            hyp_ngrams = Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
            ref_ngrams = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
            matches[n - 1] += sum(min(c, ref_ngrams[g]) for g, c in hyp_ngrams.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    precisions = [m / t if t else 0.0 for m, t in zip(matches, totals, strict=True)]
    geometric = 0.0 if min(precisions) == 0 else math.exp(sum(math.log(p) for p in precisions) / max_order)
    brevity = 1.0 if hyp_len > ref_len else (math.exp(1 - ref_len / hyp_len) if hyp_len else 0.0)
    return {
        "bleu": 100 * brevity * geometric,
        "precisions": [100 * p for p in precisions],
        "brevity_penalty": brevity,
        "hyp_len": hyp_len,
        "ref_len": ref_len,
    }


def token_words(tokenizer, ids: Sequence[int]) -> list[str]:
    """Words of a token id sequence: sub-word pieces joined ("##" continuations for WordPiece, a leading
    "Ġ"/"▁" starting a word for BPE/SentencePiece), special tokens dropped, punctuation kept separate
    (no detokenisation cleanup), so BLEU counts the same units in hypotheses and references."""
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens([i for i in ids if i not in special])
    marked = any(p.startswith(("Ġ", "▁")) for p in pieces)
    words: list[str] = []
    for piece in pieces:
        if piece.startswith("##") and words:
            words[-1] += piece[2:]
        elif marked and not piece.startswith(("Ġ", "▁")) and words:
            words[-1] += piece
        else:
            words.append(piece.lstrip("Ġ▁"))
    return [w for w in words if w]


def reconstruction_bleu(encoder: NuggetEncoder, texts: Sequence[str], beams: int = 5, max_length: int = 128):
    """Decode each text from its nuggets (beam search) and score corpus BLEU-4 against the text as the
    model saw it (cut to `max_length` tokens), both as `token_words`."""
    ids, outputs = encoder.reconstruct_ids(texts, beams=beams, max_length=max_length)
    references = [token_words(encoder.tokenizer, i) for i in ids]
    hypotheses = [token_words(encoder.tokenizer, o) for o in outputs]
    return corpus_bleu(hypotheses, references)
