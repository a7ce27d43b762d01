"""The student's Longformer pass on OpenVINO / ONNX Runtime, fp32 and int8 (models/student_inference.py):
exported once at one length, it holds for batches of every length (sliding-window attention included), stays
close to PyTorch, and is part of the model's identity."""

from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import encode_fp32_and_int8
from docembed.models.student import convert_long

TEXTS = [
    "The cat sat on the mat while the dog slept by the fire.",
    "",
    "A much longer text about rivers, boats and the villages along the banks. " * 6,
    "short",
    "Quantum computers use qubits, which hold superpositions of states. " * 3,
]
# A tiny random model's states are nearly all of one direction; the thresholds leave room for a real model
# (the zoo student: mean cosine 0.995 on long IMDB reviews, see bench/results/int8_student.json).
INT8_MEAN_COSINE, INT8_MIN_COSINE = 0.99, 0.97
ENGINE_MODULE = {"openvino": "openvino", "onnx": "onnxruntime"}


def tiny_student(tiny_bert_dir):
    # window 8: a 60-token text spans several blocks, so the exported band is exercised beyond one block
    return convert_long(str(tiny_bert_dir), max_length=60, attention_window=8)


def pytorch_and(backend: str, precision: str, tiny_bert_dir):
    pytest.importorskip(ENGINE_MODULE[backend])
    reference = tiny_student(tiny_bert_dir).encode(TEXTS, batch_size=2)
    encoder = tiny_student(tiny_bert_dir).set_inference(backend, precision)
    return reference, encoder, encoder.encode(TEXTS, batch_size=2)


@pytest.mark.parametrize("backend", ["openvino", "onnx"])
def test_an_fp32_export_computes_pytorchs_vectors_at_every_length(backend, tiny_bert_dir):
    reference, encoder, exported = pytorch_and(backend, "fp32", tiny_bert_dir)
    np.testing.assert_allclose(exported, reference, rtol=0, atol=1e-5)
    assert encoder.metadata()["inference"] == f"{backend}-fp32"


def test_int8_vectors_are_close_to_fp32(tiny_bert_dir):
    reference, encoder, int8 = pytorch_and("openvino", "int8", tiny_bert_dir)
    cosines = (int8 * reference).sum(axis=1)  # both L2-normalised
    assert cosines.mean() > INT8_MEAN_COSINE and cosines.min() > INT8_MIN_COSINE
    assert not np.array_equal(int8, reference)  # it did run another engine


def test_the_choice_keeps_pytorch_vectors_apart_in_caches(tiny_bert_dir):
    pytest.importorskip("openvino")
    from docembed.encoding import model_identity

    encoder = tiny_student(tiny_bert_dir)
    plain = model_identity(encoder)
    encoder.set_inference("openvino", "int8")
    assert model_identity(encoder) != plain
    encoder.set_inference("auto", "fp32")
    assert model_identity(encoder) == plain


def test_encode_precision_int8_for_a_saved_student(capfd, tmp_path, tiny_bert_dir):
    pytest.importorskip("openvino")
    model_dir = tmp_path / "student"
    tiny_student(tiny_bert_dir).save(model_dir)
    outputs = encode_fp32_and_int8(capfd, model_dir, TEXTS, ".npy")
    cosines = (outputs["int8"].data * outputs["fp32"].data).sum(axis=1)
    assert cosines.min() > INT8_MIN_COSINE
