"""The blocked sliding-window attention (models/local_attention.py) against transformers' Longformer, against
a dense masked reference, and inside StudentEncoder.encode."""

import math

import numpy as np
import pytest
import torch

from docembed.models.local_attention import (
    BlockedLongformer,
    banded_attention,
    local_forward,
    self_attention,
    whole_blocks,
)
from docembed.models.student import StudentConfig, StudentEncoder, _longformer_dict

WINDOW = 8


def tiny_longformer(window: int = WINDOW):
    from transformers import LongformerConfig, LongformerModel

    torch.manual_seed(0)
    config = LongformerConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        attention_window=[window, 2 * window],  # layers may differ: each keeps its own band
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=1,
    )
    return LongformerModel(config, add_pooling_layer=False).eval()


@pytest.fixture(scope="module")
def longformer():
    """One tiny Longformer for the tests that only read it; a test that trains it builds its own."""
    return tiny_longformer()


def dense_reference(query, key, value, key_padding, one_sided):
    """Full (length x length) scores, masked to the band and to real keys: the definition, written out.
    Tensors (batch, length, heads, head_dim), as banded_attention takes them."""
    query, key, value = (x.transpose(1, 2) for x in (query, key, value))
    length = query.shape[2]
    positions = torch.arange(length)
    band = (positions[:, None] - positions[None, :]).abs() <= one_sided
    allowed = band & ~key_padding[:, None, None, :]
    scores = (query @ key.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    context = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ value
    return context.masked_fill(key_padding[:, None, :, None], 0.0).transpose(1, 2)


def batch(lengths, vocab=30000, pad=1):
    """Random token ids right-padded with `pad`, and the 1/0 mask."""
    generator = torch.Generator().manual_seed(sum(lengths))
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, vocab, (n,), generator=generator)
        mask[row, :n] = 1
    return ids, mask


@pytest.mark.parametrize("length", [1, 5, 16, 23, 40])
@pytest.mark.parametrize("block", [1, 3, 4, 64])
def test_banded_attention_equals_dense_reference(length, block):
    torch.manual_seed(length)
    one_sided = 4
    query, key, value = (torch.randn(2, length, 3, 8) for _ in range(3))
    key_padding = torch.zeros(2, length, dtype=torch.bool)
    key_padding[1, max(1, length - 6) :] = True  # the second row ends in padding
    got = banded_attention(query, key, value, key_padding, one_sided, block)
    expected = dense_reference(query, key, value, key_padding, one_sided)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # The band matters: one token narrower or wider gives another answer (when the band does not cover all).
    if length > one_sided + 2:
        for other in (one_sided - 1, one_sided + 1):
            assert not torch.allclose(got, dense_reference(query, key, value, key_padding, other), atol=1e-3)


@pytest.mark.parametrize("lengths", [[16, 16], [16, 11], [32, 3], [24, 17]])
def test_self_attention_equals_transformers_layer(longformer, lengths):
    """transformers' own layer, fed the inputs LongformerModel gives it: a length that is a multiple of the
    window, mask values 0 (attend) / finfo.min (padding, including what pads a length up to the window)."""
    layer = longformer.encoder.layer[0].attention.self
    torch.manual_seed(1)
    hidden = torch.randn(len(lengths), max(lengths), 32)
    _, mask = batch(lengths)
    key_padding = mask == 0
    layer_mask = torch.zeros(mask.shape).masked_fill(key_padding, torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected = layer(
            hidden,
            attention_mask=layer_mask,
            is_index_masked=key_padding,
            is_index_global_attn=torch.zeros_like(key_padding),
            is_global_attn=False,
        )[0]
        got = self_attention(
            layer, hidden, key_padding, lambda q, k, v, padding, w: banded_attention(q, k, v, padding, w, 3)
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    hf_reference = dense_reference_from_layer(layer, hidden, key_padding)
    # and transformers' own band is |i - j| <= w/2 with padding keys left out
    torch.testing.assert_close(expected, hf_reference, atol=1e-5, rtol=0)


def dense_reference_from_layer(layer, hidden, key_padding):
    batch_size, length, dim = hidden.shape

    def split(x):
        return x.view(batch_size, length, layer.num_heads, layer.head_dim)

    query = split(layer.query(hidden) / math.sqrt(layer.head_dim))
    key, value = split(layer.key(hidden)), split(layer.value(hidden))
    context = dense_reference(query, key, value, key_padding, layer.one_sided_attn_window_size)
    return context.reshape(batch_size, length, dim)


@pytest.mark.parametrize("lengths", [[16], [13], [37, 37], [37, 20, 2], [1]])
def test_local_forward_equals_longformer_model(longformer, lengths):
    """Whole model, any length: transformers pads to a multiple of the window, local_forward does not."""
    ids, mask = batch(lengths)
    with torch.no_grad():
        expected = longformer(input_ids=ids, attention_mask=mask).last_hidden_state
        got = local_forward(longformer, ids, mask, block=4)
    assert got.shape == expected.shape
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)  # padding rows too


def test_local_forward_falls_back_for_global_attention_and_training():
    model = tiny_longformer()  # its own: switched to training mode below
    ids, mask = batch([20])
    with torch.no_grad():
        global_mask = mask.clone()
        global_mask[0, 0] = 2  # LongformerModel's merged mask: 2 = global attention on that token
        expected = model(input_ids=ids, attention_mask=global_mask).last_hidden_state
        torch.testing.assert_close(local_forward(model, ids, global_mask), expected, atol=0, rtol=0)
        model.train()
        torch.manual_seed(0)
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.manual_seed(0)
        torch.testing.assert_close(local_forward(model, ids, mask), expected, atol=0, rtol=0)


def test_student_encode_same_with_and_without_local_attention(longformer, minilm_tokenizer):
    config = StudentConfig(
        max_length=100, attention_window=WINDOW, longformer=_longformer_dict(longformer.config)
    )
    student = StudentEncoder(config, model=longformer, tokenizer=minilm_tokenizer)
    texts = ["a short one", "", "a longer text " * 12, "x " * 150, "odd length words, not a window multiple"]
    fast = student.encode(texts, batch_size=3)
    student.local_attention = False
    slow = student.encode(texts, batch_size=3)
    assert fast.shape == (len(texts), 32)
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lengths", [[16], [37, 20, 2]])
def test_blocked_longformer_equals_longformer_model_on_whole_blocks(longformer, lengths):
    """The exportable graph: a batch padded to whole blocks gives transformers' states on the real tokens."""
    multiple = whole_blocks(longformer, block=3)
    assert (
        multiple == 2
    )  # windows 8 and 16: one-sided 4 and 8, both in blocks of 2 (the largest divisor <= 3)
    ids, mask = batch(lengths)
    width = -(-ids.shape[1] // multiple) * multiple
    padded_ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=1)
    padded_mask = torch.nn.functional.pad(mask, (0, width - mask.shape[1]))
    with torch.no_grad():
        expected = longformer(input_ids=ids, attention_mask=mask).last_hidden_state
        got = BlockedLongformer(longformer, block=3)(padded_ids, padded_mask)[:, : ids.shape[1]]
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def test_blocked_longformer_traced_once_holds_for_other_lengths(longformer):
    """What an exporter does: trace at one length, run at others (no branch or shape frozen in the graph)."""
    module = BlockedLongformer(longformer).eval()
    multiple = whole_blocks(longformer)
    ids, mask = batch([2 * multiple])
    with torch.no_grad():
        traced = torch.jit.trace(module, (ids, mask), check_trace=False)
        for lengths in ([multiple], [5 * multiple, 3 * multiple - 1, 1]):
            ids, mask = batch(lengths)
            torch.testing.assert_close(traced(ids, mask), module(ids, mask), atol=1e-5, rtol=0)
