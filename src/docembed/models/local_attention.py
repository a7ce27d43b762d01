"""Exact sliding-window attention for Longformer inference: the sequence cut into blocks of queries, each
reading its own keys widened by w/2 on either side, masked to |i - j| <= w/2, in one fused
scaled_dot_product_attention call. Same outputs as transformers' LongformerSelfAttention without global
tokens, without its overlapping-chunk matmuls, diagonal copies and padding to a window multiple (timings:
bench/bench_local_attention.py). Training keeps transformers' code (dropout, global attention).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DEFAULT_BLOCK = 64  # queries per block; smaller blocks waste fewer scores, larger ones make bigger matmuls


def banded_attention(query, key, value, key_padding, one_sided: int, block: int = DEFAULT_BLOCK):
    """Softmax attention of each position i over the keys j with |i - j| <= one_sided that are not padding.

    query, key, value: (batch, length, heads, head_dim), query already scaled; key_padding: (batch, length)
    bool, True where the token is padding. Returns (batch, length, heads, head_dim); rows of padding queries
    are zero, as in transformers (a softmax over no real key would be undefined)."""
    batch, length, heads, head_dim = query.shape
    if length <= block + 2 * one_sided:
        # A sequence no longer than one block's key span: one dense call over its own keys is cheaper than a
        # block reading padding beyond the ends (e.g. 230 keys per query instead of 320 for a short review).
        positions = torch.arange(length, device=query.device)
        band = (positions[:, None] - positions[None, :]).abs() <= one_sided
        allowed = (band & ~key_padding[:, None, :])[:, None]  # (batch, 1, length, length)
        context = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (query, key, value)), attn_mask=allowed, scale=1.0
        )
        return context.transpose(1, 2).masked_fill(key_padding[:, :, None, None], 0.0)
    block = dividing_block(one_sided, block)
    extra = -length % block  # the last block is filled up with padding queries and keys
    if extra:
        query, key, value = (F.pad(t, (0, 0, 0, 0, 0, extra)) for t in (query, key, value))
        key_padding = F.pad(key_padding, (0, extra), value=True)
    context = blocked_attention(query, key, value, key_padding, one_sided, block)
    return context[:, :length]


def dividing_block(one_sided: int, block: int) -> int:
    """The largest block of at most `block` queries that divides `one_sided`: then a block's keys are whole
    neighbouring blocks (blocked_attention)."""
    return max(size for size in range(1, max(1, min(block, one_sided)) + 1) if one_sided % size == 0)


def blocked_attention(query, key, value, key_padding, one_sided: int, block: int):
    """banded_attention for a length that is a multiple of `block`, with `block` dividing `one_sided`. Every
    shape is a constant or taken from the inputs by -1, and every slice has constant bounds, so a traced or
    exported graph (OpenVINO, ONNX) holds for any length and batch: no branch on the length, no unfold.

    The keys of query block b are the blocks b - r .. b + r (r = one_sided / block) of keys padded by
    one_sided on either side; all blocks go to the batch of one fused scaled_dot_product_attention."""
    reach = 2 * (one_sided // block)  # neighbouring key blocks per query block, besides its own
    span = block + 2 * one_sided

    def neighbours(blocks):  # (batch, count + reach, block, ...) -> (batch, count, span, ...)
        last = blocks.shape[1]
        return torch.cat([blocks[:, i : last - reach + i] for i in range(reach + 1)], dim=2)

    padded = [F.pad(t, (0, 0, 0, 0, one_sided, one_sided)).unflatten(1, (-1, block)) for t in (key, value)]
    keys, values = (neighbours(t).permute(0, 1, 3, 2, 4) for t in padded)  # (batch, count, heads, span, d)
    queries = query.unflatten(1, (-1, block)).permute(0, 1, 3, 2, 4)  # (batch, count, heads, block, d)
    real_key = ~neighbours(F.pad(key_padding, (one_sided, one_sided), value=True).unflatten(1, (-1, block)))

    # Row r of every block sees columns r .. r + 2 * one_sided: one band for all blocks.
    rows = torch.arange(block, device=query.device)[:, None]
    columns = torch.arange(span, device=query.device)[None, :]
    band = (columns >= rows) & (columns <= rows + 2 * one_sided)
    allowed = (band & real_key[:, :, None, :]).unsqueeze(2)  # (batch, count, 1, block, span)

    # Four dimensions, blocks in the batch: the layout engines fuse best (OpenVINO's SDPA among them).
    queries, keys, values, allowed = (t.flatten(0, 1) for t in (queries, keys, values, allowed))
    context = F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed, scale=1.0)
    context = context.transpose(1, 2).reshape(query.shape)  # (batch, length, heads, d)
    return context.masked_fill(key_padding[:, :, None, None], 0.0)


def self_attention(module, hidden_states, key_padding, attend):
    """What `module` (a LongformerSelfAttention) returns for `hidden_states` (batch, length, dim) when no
    token has global attention: (batch, length, dim). `attend(query, key, value, key_padding, one_sided)`
    is banded_attention or, for a length already in whole blocks, blocked_attention."""
    heads = (module.num_heads, module.head_dim)
    query = (module.query(hidden_states) / math.sqrt(module.head_dim)).unflatten(-1, heads)
    key, value = (
        module.key(hidden_states).unflatten(-1, heads),
        module.value(hidden_states).unflatten(-1, heads),
    )
    return attend(query, key, value, key_padding, module.one_sided_attn_window_size).flatten(2)


def local_layers(model, input_ids, key_padding, attend):
    """The last hidden state of a transformers LongformerModel without global attention, its attention
    computed by `attend` (see self_attention)."""
    hidden = model.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
    for layer in model.encoder.layer:
        context = self_attention(layer.attention.self, hidden, key_padding, attend)
        hidden = layer.ff_chunk(layer.attention.output(context, hidden))
    return hidden


def local_forward(model, input_ids, attention_mask, block: int = DEFAULT_BLOCK):
    """The last hidden state of a transformers LongformerModel for `input_ids` with `attention_mask` (1 real,
    0 padding; batch, length), computed with `banded_attention`. Falls back to the model's own forward when
    the result could differ: in training mode (attention dropout) or with global attention (mask values 2)."""
    if model.training or bool((attention_mask > 1).any()):
        return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def attend(query, key, value, key_padding, one_sided):
        return banded_attention(query, key, value, key_padding, one_sided, block)

    return local_layers(model, input_ids, attention_mask == 0, attend)


def layer_blocks(model, block: int = DEFAULT_BLOCK) -> dict[int, int]:
    """Each layer's one-sided window -> the block blocked_attention uses for it (dividing_block)."""
    windows = {layer.attention.self.one_sided_attn_window_size for layer in model.encoder.layer}
    return {one_sided: dividing_block(one_sided, block) for one_sided in windows}


def whole_blocks(model, block: int = DEFAULT_BLOCK) -> int:
    """The multiple of tokens a batch is padded to for `BlockedLongformer`: every layer's block divides it."""
    return math.lcm(*layer_blocks(model, block).values())


class BlockedLongformer(torch.nn.Module):
    """A LongformerModel's inference pass (no global attention) as one graph that tracers and exporters keep
    valid for every batch and length: inputs padded to a multiple of `whole_blocks(model)` tokens,
    attention by blocked_attention. (input_ids, attention_mask) -> the last hidden state."""

    def __init__(self, model, block: int = DEFAULT_BLOCK):
        super().__init__()
        self.model = model
        self.blocks = layer_blocks(model, block)

    def forward(self, input_ids, attention_mask):
        def attend(query, key, value, key_padding, one_sided):
            return blocked_attention(query, key, value, key_padding, one_sided, self.blocks[one_sided])

        return local_layers(self.model, input_ids, attention_mask == 0, attend)
