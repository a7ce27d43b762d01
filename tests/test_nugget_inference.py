"""NUGGET's encoder pass on OpenVINO / ONNX Runtime, fp32 and int8 (models/nugget_inference.py): the vectors
stay close to PyTorch's, the selection and MaxSim are untouched, and the choice is part of the model's
identity."""

from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import encode_fp32_and_int8
from docembed.models.base import NotSupportedError
from tiny_models import tiny_nugget

TEXTS = [
    "The cat sat on the mat while the dog slept by the fire.",
    "Quantum computers use qubits, which hold superpositions of states.",
    "",
    "short",
    "A much longer text about rivers, boats and the villages along the banks. " * 4,
]
# A tiny random model's states are nearly all of one direction, so int8 keeps them very close; the
# thresholds leave room for a real model (the zoo nugget is measured in bench, see README).
INT8_MEAN_COSINE, INT8_MIN_COSINE = 0.99, 0.97
ENGINE_MODULE = {"openvino": "openvino", "onnx": "onnxruntime"}


def pytorch_and(backend: str, precision: str, tokenizer):
    pytest.importorskip(ENGINE_MODULE[backend])
    reference = tiny_nugget(tokenizer, feedback=False).encode(TEXTS)
    encoder = tiny_nugget(tokenizer, feedback=False).set_inference(backend, precision)
    return reference, encoder, encoder.encode(TEXTS)


@pytest.mark.parametrize("backend", ["openvino", "onnx"])
def test_int8_nuggets_are_close_to_fp32_and_selected_alike(backend, minilm_tokenizer):
    reference, encoder, int8 = pytorch_and(backend, "int8", minilm_tokenizer)
    # the same tokens chosen: the scorer reads int8 layer-l states, but its ranking holds on these texts
    assert np.array_equal(int8.offsets, reference.offsets)
    assert np.array_equal(int8.positions, reference.positions)
    cosines = (int8.vectors * reference.vectors).sum(axis=1)  # both L2-normalised
    assert cosines.mean() > INT8_MEAN_COSINE and cosines.min() > INT8_MIN_COSINE
    assert not np.array_equal(int8.vectors, reference.vectors)  # it did run another engine
    assert encoder.metadata()["inference"] == f"{backend}-int8"


def test_an_fp32_export_computes_pytorchs_states(minilm_tokenizer):
    reference, _, exported = pytorch_and("openvino", "fp32", minilm_tokenizer)
    assert np.array_equal(exported.positions, reference.positions)
    np.testing.assert_allclose(exported.vectors, reference.vectors, rtol=0, atol=1e-5)


def test_the_choice_keeps_pytorch_vectors_apart_in_caches(minilm_tokenizer):
    pytest.importorskip("openvino")
    from docembed.encoding import model_identity

    encoder = tiny_nugget(minilm_tokenizer, feedback=False)
    plain = model_identity(encoder)
    assert "inference" not in encoder.metadata()
    encoder.set_inference("openvino", "int8")
    assert model_identity(encoder) != plain
    encoder.set_inference("auto", "fp32")
    assert model_identity(encoder) == plain


def test_a_model_with_feedback_runs_in_pytorch_only(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer, feedback=True)
    with pytest.raises(NotSupportedError, match="PyTorch only"):
        encoder.set_inference("auto", "int8")
    encoder.set_inference("torch", "fp32")  # PyTorch itself stays available
    assert encoder.encode(TEXTS[:2]).vectors.shape[1] == encoder.dim


def test_encode_precision_int8_for_a_saved_nugget(capfd, tmp_path, minilm_tokenizer):
    pytest.importorskip("openvino")
    model_dir = tmp_path / "nugget"
    tiny_nugget(minilm_tokenizer, feedback=False).save(model_dir)
    outputs = encode_fp32_and_int8(capfd, model_dir, TEXTS, ".npz")
    cosines = (outputs["int8"].data.vectors * outputs["fp32"].data.vectors).sum(axis=1)
    assert cosines.min() > INT8_MIN_COSINE
    from docembed.runtime import models_home

    assert len(list((models_home() / "inference").glob("openvino-int8-*"))) == 1  # exported once, cached
