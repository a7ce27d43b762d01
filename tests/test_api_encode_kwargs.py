"""`Model.encode` takes the keywords of sentence-transformers' `SentenceTransformer.encode` (#47): each works
as there (convert_to_tensor, convert_to_numpy, precision, truncate_dim, output_value, prompt_name, device,
...) or fails in one line naming the keyword; an unknown keyword is a TypeError with a did-you-mean."""

import numpy as np
import pytest
import torch

import docembed
from docembed.errors import UsageError
from docembed.types import MultiVectors

TEXTS = ["The cat sat on the mat.", "A dog barked at the postman all morning.", "", "Rates rose again."]


@pytest.fixture(scope="module")
def glove():
    return docembed.load("glove-avg", device="cpu")


@pytest.fixture(scope="module")
def tiny(tiny_sbert_dir):
    return docembed.load(tiny_sbert_dir, device="cpu")


@pytest.fixture(scope="module")
def tiny_tokens(tiny_sbert_tokens_dir):
    return docembed.load(tiny_sbert_tokens_dir, device="cpu")


def one_line_usage_error(call, *words):
    with pytest.raises(UsageError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_convert_to_tensor_and_convert_to_numpy(glove):
    full = glove.encode(TEXTS)
    tensor = glove.encode(TEXTS, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == full.shape
    assert np.array_equal(tensor.numpy(), full)
    one = glove.encode(TEXTS[0], convert_to_tensor=True)
    assert isinstance(one, torch.Tensor) and one.ndim == 1
    rows = glove.encode(TEXTS, convert_to_numpy=False)  # sentence-transformers: a list of tensors
    assert isinstance(rows, list) and len(rows) == len(TEXTS)
    assert all(isinstance(row, torch.Tensor) for row in rows)
    assert np.array_equal(torch.stack(rows).numpy(), full)
    # convert_to_tensor wins over convert_to_numpy, as there
    assert isinstance(glove.encode(TEXTS, convert_to_numpy=False, convert_to_tensor=True), torch.Tensor)


def test_truncate_dim_keeps_the_first_dimensions(tiny):
    full = tiny.encode(TEXTS)
    short = tiny.encode(TEXTS, truncate_dim=8)
    assert short.shape == (len(TEXTS), 8)
    assert np.array_equal(short, full[:, :8])
    assert not np.allclose(np.linalg.norm(short, axis=1), 1.0)  # not made unit length again ...
    unit = tiny.encode(TEXTS, truncate_dim=8, normalize_embeddings=True)  # ... unless asked
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    assert np.allclose(unit, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)
    assert tiny.encode(TEXTS, truncate_dim=10_000).shape == full.shape  # more than there are: all of them
    one_line_usage_error(lambda: tiny.encode(TEXTS, truncate_dim=0), "truncate_dim")


def test_truncate_dim_of_a_multi_vector_model(tiny_tokens):
    sets = tiny_tokens.encode(TEXTS[:2])
    short = tiny_tokens.encode(TEXTS[:2], truncate_dim=4)
    assert isinstance(short, MultiVectors) and short.dim == 4
    assert np.array_equal(short.vectors, sets.vectors[:, :4])
    assert short.counts.tolist() == sets.counts.tolist()


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precision_quantizes_as_sentence_transformers_does(glove, precision):
    from sentence_transformers import quantize_embeddings

    texts = TEXTS[:2] + TEXTS[3:]
    expected = quantize_embeddings(glove.encode(texts, normalize_embeddings=True), precision)
    got = glove.encode(texts, normalize_embeddings=True, precision=precision)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    tensor = glove.encode(texts, normalize_embeddings=True, precision=precision, convert_to_tensor=True)
    assert np.array_equal(tensor.numpy(), expected)


def test_precision_of_a_multi_vector_model_is_every_vector_quantized(tiny_tokens):
    sets = tiny_tokens.encode(TEXTS[:2], precision="int8")
    assert isinstance(sets, MultiVectors) and sets.vectors.dtype == np.int8
    assert np.array_equal(
        sets.vectors, docembed.quantize_embeddings(tiny_tokens.encode(TEXTS[:2]), "int8").vectors
    )


def test_precision_is_the_embeddings_type_not_the_models_arithmetic(glove):
    message = one_line_usage_error(lambda: glove.encode(TEXTS, precision="fp16"), "precision", "int8")
    assert "load(" in message
    assert glove.encode(TEXTS, precision="float32").dtype == np.float32


def test_token_embeddings_of_an_sbert_model(tiny):
    tokens = tiny.encode(TEXTS, output_value="token_embeddings")
    assert isinstance(tokens, MultiVectors) and len(tokens) == len(TEXTS)
    # the transformer's last layer, one vector per token, as sentence-transformers gives them
    st = tiny.encoder.model.encode(TEXTS, output_value="token_embeddings", show_progress_bar=False)
    assert tokens.counts.tolist() == [len(t) for t in st]
    for ours, theirs in zip(tokens, st, strict=True):
        assert np.allclose(ours, theirs.numpy(), atol=1e-5)
    assert not np.allclose(np.linalg.norm(tokens.vectors, axis=1), 1.0)  # raw, as there
    unit = tiny.encode(TEXTS, output_value="token_embeddings", normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(unit.vectors, axis=1), 1.0, atol=1e-5)
    pooled = tiny.encode(TEXTS, output_value="token_embeddings", pooling="mean")
    assert pooled.shape == (len(TEXTS), tokens.dim)
    as_tensors = tiny.encode(TEXTS, output_value="token_embeddings", convert_to_tensor=True)
    assert isinstance(as_tensors, list) and as_tensors[0].shape == (tokens.counts[0], tokens.dim)
    assert tiny.encoder.config.output != "tokens"  # the model itself is unchanged
    assert tiny.encode(TEXTS).shape == (len(TEXTS), tiny.dim)


def test_token_embeddings_of_a_model_without_them_is_a_one_line_error(glove):
    one_line_usage_error(lambda: glove.encode(TEXTS, output_value="token_embeddings"), "token_embeddings")
    one_line_usage_error(lambda: glove.encode(TEXTS, output_value=None), "output_value")
    one_line_usage_error(lambda: glove.encode(TEXTS, output_value="cls"), "output_value")


def test_batch_size_progress_bar_normalize_and_device(glove):
    full = glove.encode(TEXTS)
    same = glove.encode(TEXTS, batch_size=1, show_progress_bar=False, device="cpu")
    assert np.array_equal(same, full)
    unit = glove.encode(TEXTS[:2], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    one_line_usage_error(lambda: glove.encode(TEXTS, device=["cpu", "cpu"]), "device", "--workers")
    one_line_usage_error(lambda: glove.encode(TEXTS, batch_size=0), "batch_size")
    # sentence-transformers' second positional argument is prompt_name; here it is batch_size
    one_line_usage_error(lambda: glove.encode(TEXTS, "query"), "batch_size", "prompt_name")


def test_device_moves_a_torch_model(tiny):
    vectors = tiny.encode(TEXTS, device="cpu")
    assert tiny.device == "cpu" and np.array_equal(vectors, tiny.encode(TEXTS))
    if not torch.cuda.is_available():
        one_line_usage_error(lambda: tiny.encode(TEXTS, device="cuda"), "cuda")


def test_prompt_and_prompt_name(glove):
    with_prompts = docembed.Model(glove.encoder, prompts={"query": "query: ", "document": "passage: "})
    asked = with_prompts.encode(TEXTS, prompt_name="query")
    assert np.array_equal(asked, glove.encode(["query: " + t for t in TEXTS]))
    # as in sentence-transformers, an explicit prompt wins over prompt_name
    both = with_prompts.encode(TEXTS, prompt="x: ", prompt_name="query")
    assert np.array_equal(both, glove.encode(["x: " + t for t in TEXTS]))
    one_line_usage_error(lambda: with_prompts.encode(TEXTS, prompt_name="classify"), "classify", "query")
    one_line_usage_error(lambda: glove.encode(TEXTS, prompt_name="query"), "prompt_name", "no prompts")


def test_unknown_keywords_are_a_type_error_with_a_did_you_mean(glove):
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalise_embeddings'") as error:
        glove.encode(TEXTS, normalise_embeddings=True)
    assert "Did you mean 'normalize_embeddings'?" in str(error.value)
    with pytest.raises(TypeError, match="'convert_to_tensors'.*Did you mean 'convert_to_tensor'"):
        glove.encode(TEXTS, convert_to_tensors=True)
    with pytest.raises(TypeError) as error:
        glove.encode(TEXTS, zzz=1)
    assert "Did you mean" not in str(error.value)
    # sentence-transformers' multi-process keywords: named, with what to use instead
    one_line_usage_error(lambda: glove.encode(TEXTS, pool={}), "pool", "--workers")
    one_line_usage_error(lambda: glove.encode(TEXTS, chunk_size=8), "chunk_size")


def test_encode_query_and_document_take_the_keywords(glove):
    model = docembed.Model(glove.encoder, prompts={"query": "query: "})
    tensor = model.encode_query(TEXTS[:2], convert_to_tensor=True, truncate_dim=5)
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (2, 5)


def test_quantize_embeddings_takes_sentence_transformers_arguments_in_their_order(glove):
    import inspect

    from sentence_transformers import quantize_embeddings

    ours, theirs = inspect.signature(docembed.quantize_embeddings), inspect.signature(quantize_embeddings)
    assert list(ours.parameters) == list(theirs.parameters)
    vectors = glove.encode(TEXTS[:2], normalize_embeddings=True)
    ranges = np.stack([vectors.min(axis=0) - 0.5, vectors.max(axis=0) + 0.5])
    expected = quantize_embeddings(vectors, "int8", ranges)
    assert np.array_equal(docembed.quantize_embeddings(vectors, "int8", ranges), expected)
    assert not np.array_equal(expected, quantize_embeddings(vectors, "int8"))  # the ranges count
