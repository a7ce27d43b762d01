"""Weight-space interpolation (WiSE-FT) of a tuned model with its start: exact per tensor, tied weights once,
refusals for models that do not match."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from docembed.errors import DocembedError, UsageError
from docembed.training.weight_averaging import interpolate_weights


def _static(dim, seed):
    from docembed.models.static import StaticConfig, StaticEncoder

    encoder = StaticEncoder(StaticConfig(dim=dim))
    return encoder.set_table(np.random.default_rng(seed).standard_normal((30522, dim)).astype(np.float32))


def test_interpolation_is_the_weighted_sum_and_changes_the_embeddings_accordingly():
    tuned, start = _static(4, 0), _static(4, 1)
    a, b = tuned.table.weight.detach().clone(), start.table.weight.detach().clone()
    interpolate_weights(tuned, start, 0.25)
    assert torch.equal(tuned.table.weight, 0.25 * a + 0.75 * b)
    assert torch.equal(start.table.weight, b)  # the start is left as it was
    interpolate_weights(tuned, start, 0.0)
    assert torch.equal(tuned.table.weight, b)
    text = ["interpolated weights"]
    np.testing.assert_allclose(tuned.encode(text), start.encode(text), atol=0)


def test_tied_tensors_are_mixed_once():
    def model(value):
        module = nn.Module()
        module.first, module.second = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
        module.second.weight = module.first.weight  # tied: two names, one tensor
        nn.init.constant_(module.first.weight, value)
        return SimpleNamespace(family="toy", weights_module=module)

    tuned, start = model(1.0), model(3.0)
    interpolate_weights(tuned, start, 0.5)
    assert torch.equal(tuned.weights_module.second.weight, torch.full((2, 2), 2.0))


def test_a_tensor_neither_model_changed_stays_bit_for_bit():
    def model(frozen, tuned):
        module = nn.Module()
        module.frozen, module.tuned = nn.Linear(100, 10, bias=False), nn.Linear(2, 2, bias=False)
        module.frozen.weight.data, module.tuned.weight.data = frozen.clone(), tuned.clone()
        return SimpleNamespace(family="toy", weights_module=module)

    frozen = torch.randn(10, 100, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(0.7 * frozen + 0.3 * frozen, frozen)  # the arithmetic alone would move it
    tuned, start = model(frozen, torch.ones(2, 2)), model(frozen, torch.zeros(2, 2))
    interpolate_weights(tuned, start, 0.7)
    assert torch.equal(tuned.weights_module.frozen.weight, frozen)
    assert torch.allclose(tuned.weights_module.tuned.weight, torch.full((2, 2), 0.7))


def test_models_that_do_not_match_are_refused():
    with pytest.raises(UsageError, match=r"\[0, 1\]"):
        interpolate_weights(_static(4, 0), _static(4, 1), 1.5)
    with pytest.raises(DocembedError, match=r"\(30522, 4\) in one model, \(30522, 5\)"):
        interpolate_weights(_static(4, 0), _static(5, 1), 0.5)
    other = SimpleNamespace(family="sbert", weights_module=nn.Linear(1, 1))
    with pytest.raises(DocembedError, match="static model with a sbert model"):
        interpolate_weights(_static(4, 0), other, 0.5)
