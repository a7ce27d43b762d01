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
    block = max(1, min(block, length))
    count = -(-length // block)
    extra = count * block - length  # the last block is filled up with padding queries and keys
    span = block + 2 * one_sided
    # Column c of block b is key b * block + c - one_sided; keys before 0 and after the end are padding.
    # Blocks go to the batch dimension, so that one scaled_dot_product_attention call (fused on CPU) does all.
    keys = F.pad(key, (0, 0, 0, 0, one_sided, one_sided + extra)).unfold(1, span, block)
    values = F.pad(value, (0, 0, 0, 0, one_sided, one_sided + extra)).unfold(1, span, block)
    keys = keys.permute(0, 1, 2, 4, 3).reshape(batch * count, heads, span, head_dim)
    values = values.permute(0, 1, 2, 4, 3).reshape(batch * count, heads, span, head_dim)
    queries = F.pad(query, (0, 0, 0, 0, 0, extra)).view(batch, count, block, heads, head_dim)
    queries = queries.transpose(2, 3).reshape(batch * count, heads, block, head_dim)

    # Row r of every block sees columns r .. r + 2 * one_sided: one band for all blocks.
    rows = torch.arange(block, device=query.device)[:, None]
    columns = torch.arange(span, device=query.device)[None, :]
    band = (columns >= rows) & (columns <= rows + 2 * one_sided)
    real_key = ~F.pad(key_padding, (one_sided, one_sided + extra), value=True).unfold(1, span, block)
    allowed = (band & real_key[:, :, None, :]).reshape(batch * count, 1, block, span)

    context = F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed, scale=1.0)
    context = context.view(batch, count, heads, block, head_dim).transpose(2, 3)
    context = context.reshape(batch, count * block, heads, head_dim)[:, :length]
    return context.masked_fill(key_padding[:, :, None, None], 0.0)


def self_attention(module, hidden_states, key_padding, block: int = DEFAULT_BLOCK):
    """What `module` (a LongformerSelfAttention) returns for `hidden_states` (batch, length, dim) when no
    token has global attention: (batch, length, dim)."""
    batch, length, dim = hidden_states.shape
    shape = (batch, length, module.num_heads, module.head_dim)
    query = (module.query(hidden_states) / math.sqrt(module.head_dim)).view(shape)
    key, value = module.key(hidden_states).view(shape), module.value(hidden_states).view(shape)
    context = banded_attention(query, key, value, key_padding, module.one_sided_attn_window_size, block)
    return context.reshape(batch, length, dim)


def local_forward(model, input_ids, attention_mask, block: int = DEFAULT_BLOCK):
    """The last hidden state of a transformers LongformerModel for `input_ids` with `attention_mask` (1 real,
    0 padding; batch, length), computed with `banded_attention`. Falls back to the model's own forward when
    the result could differ: in training mode (attention dropout) or with global attention (mask values 2)."""
    if model.training or bool((attention_mask > 1).any()):
        return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    key_padding = attention_mask == 0
    hidden = model.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
    for layer in model.encoder.layer:
        context = self_attention(layer.attention.self, hidden, key_padding, block)
        hidden = layer.ff_chunk(layer.attention.output(context, hidden))
    return hidden
