"""The Python API (docembed.load / Model): the same vectors as `docembed encode`, bit for bit, for every
family; the sentence-transformers conventions it promises (one string -> one vector, normalisation, pooling,
torch output, prompts, a similarity matrix); silent loading; a light `import docembed`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import docembed
from cli_helpers import invoke
from docembed.errors import UsageError

TEXTS = [
    "The cat sat on the mat. It was warm.",
    "A dog barked at the postman all morning.",
    "",
    "Stock markets fell sharply on Tuesday after the central bank raised interest rates. " * 30,
    "How do I catch an exception in Python?",
    "Catching errors with try and except.",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, corpus):
    """Saved models of the corpus-fitted families, fitted on the test corpus."""
    from docembed.datasets import Corpus
    from docembed.training.fitting import fit_family

    root = tmp_path_factory.mktemp("fitted")
    for family in ("tfidf", "pv", "setenc"):
        fit_family(family, Corpus(str(corpus)), root / family, seed=0, device="cpu")
    return root


# Every family with an encode (bm25 is a scorer): built-in names where they are cheap to load, the
# corpus-fitted ones from a folder fitted above. The shipped nugget, student and quickthoughts are the
# zoo's own weights, loaded as users load them.
FAMILIES = ["glove-avg", "sbert", "sbert-tokens", "sbert-chunks", "nugget", "student", "quickthoughts"]
FITTED = ["tfidf", "pv", "setenc"]


@pytest.mark.filterwarnings("ignore::docembed.errors.TruncationWarning")
@pytest.mark.parametrize("name", FAMILIES + FITTED)
def test_api_gives_the_cli_vectors_bit_for_bit(name, corpus, fitted, tmp_path, capfd):
    spec = str(fitted / name) if name in FITTED else name
    out = tmp_path / "cli.npz"
    result = invoke(capfd, "-q", "encode", str(corpus), "-m", spec, "-o", str(out))
    assert result.code == 0, result.err
    from_cli = docembed.load_embeddings(str(out))

    model = docembed.load(spec, device="cpu")
    from_api = model.encode(TEXTS)

    assert from_cli.ids == [f"d{i}" for i in range(len(TEXTS))]
    if model.is_multi_vector:
        assert isinstance(from_api, docembed.MultiVectors)
        assert np.array_equal(from_api.offsets, from_cli.data.offsets)
        assert np.array_equal(from_api.vectors, from_cli.data.vectors)
    else:
        assert from_api.dtype == np.float32 and from_api.shape == (len(TEXTS), model.dim)
        assert np.array_equal(from_api, from_cli.data)


@pytest.fixture(scope="module")
def glove():
    return docembed.load("glove-avg", device="cpu")


@pytest.fixture(scope="module")
def tokens_model(tiny_sbert_tokens_dir):
    return docembed.load(str(tiny_sbert_tokens_dir), device="cpu")


def test_a_single_string_gives_one_vector_not_one_per_character(glove, tokens_model):
    one = glove.encode("a single string")
    assert one.shape == (glove.dim,)
    assert np.array_equal(one, glove.encode(["a single string"])[0])
    vectors = tokens_model.encode("a single string")
    assert vectors.ndim == 2 and vectors.shape[1] == tokens_model.dim
    assert np.array_equal(vectors, tokens_model.encode(["a single string"])[0])


def test_encode_refuses_what_is_not_text(glove):
    with pytest.raises(UsageError, match="string"):
        glove.encode([1, 2])
    with pytest.raises(UsageError, match="text 1 is not valid Unicode"):
        glove.encode(["fine", "a \ud800 lone surrogate"])
    with pytest.raises(UsageError, match="convert_to"):
        glove.encode(["x"], convert_to="list")


def test_multi_vector_output_is_flat_vectors_with_offsets_and_a_list_view(tokens_model):
    out = tokens_model.encode(TEXTS[:3])
    assert out.offsets[0] == 0 and out.offsets[-1] == len(out.vectors) and len(out) == 3
    views = out.to_list()
    assert [len(v) for v in views] == out.counts.tolist()
    assert all(np.array_equal(a, b) for a, b in zip(views, out, strict=True))
    assert np.array_equal(np.concatenate(views), out.vectors)


def test_mean_pooling_gives_one_vector_per_text(tokens_model):
    sets = tokens_model.encode(TEXTS[:2])
    pooled = tokens_model.encode(TEXTS[:2], pooling="mean")
    assert pooled.shape == (2, tokens_model.dim)
    assert np.allclose(pooled, [v.mean(axis=0) for v in sets], atol=1e-6)
    unit = tokens_model.encode(TEXTS[:2], pooling="mean", normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)


def test_normalize_embeddings_gives_unit_vectors(glove, tokens_model):
    raw = glove.encode(TEXTS[:2])
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    unit = glove.encode(TEXTS[:2], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    assert np.allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    multi = tokens_model.encode(TEXTS[:2], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(multi.vectors, axis=1), 1.0, atol=1e-5)


def test_convert_to_torch(glove, tokens_model):
    import torch

    dense = glove.encode(TEXTS[:2], convert_to="torch")
    assert isinstance(dense, torch.Tensor) and tuple(dense.shape) == (2, glove.dim)
    assert np.array_equal(dense.numpy(), glove.encode(TEXTS[:2]))
    sets = tokens_model.encode(TEXTS[:2], convert_to="torch")
    assert isinstance(sets, list) and all(isinstance(t, torch.Tensor) for t in sets)


def test_prompts_go_before_queries_and_documents_only_when_a_model_has_them(tiny_sbert_dir):
    plain = docembed.load(str(tiny_sbert_dir), device="cpu")
    assert np.array_equal(plain.encode_query(["x"]), plain.encode(["x"]))
    prompted = docembed.load(str(tiny_sbert_dir), device="cpu", prompts={"query": "query: "})
    assert np.array_equal(prompted.encode_query(["x"]), plain.encode(["query: x"]))
    assert np.array_equal(prompted.encode_document(["x"]), plain.encode(["x"]))
    with pytest.raises(UsageError, match="prompts"):
        docembed.load(str(tiny_sbert_dir), device="cpu", prompts={"passage": "p: "})


def test_similarity_matches_the_cli_for_dense_and_multi_vector(
    glove, tokens_model, tiny_sbert_tokens_dir, capfd
):
    for model, spec in ((glove, "glove-avg"), (tokens_model, str(tiny_sbert_tokens_dir))):
        matrix = model.similarity(TEXTS[4:6], TEXTS[4:6])
        assert matrix.shape == (2, 2)
        result = invoke(capfd, "similarity", TEXTS[4], TEXTS[5], "-m", spec)
        assert result.code == 0, result.err
        assert float(result.out) == pytest.approx(float(matrix[0, 1]), abs=1e-6)
        # from embeddings too, the same scores
        assert np.allclose(model.similarity(model.encode(TEXTS[4:6]), model.encode(TEXTS[4:6])), matrix)


def test_no_texts_give_typed_empty_results(glove, tokens_model):
    assert glove.encode([]).shape == (0, glove.dim)
    assert len(tokens_model.encode([])) == 0 and tokens_model.encode([]).vectors.shape == (
        0,
        tokens_model.dim,
    )
    assert glove.similarity([], ["a"]).shape == (0, 1)
    assert tokens_model.similarity(["a b"], []).shape == (1, 0)


def test_similarity_refuses_dense_against_multi_vector(tokens_model):
    sets = tokens_model.encode(["a b"])
    with pytest.raises(UsageError, match="dense"):
        tokens_model.similarity(sets, sets.mean())


def test_max_tokens_says_what_a_model_reads():
    assert docembed.load("glove-avg", device="cpu").max_tokens is None  # reads the whole text
    assert docembed.load("sbert", device="cpu").max_tokens is None  # the mean of windows over all of it
    assert docembed.load("sbert", device="cpu", long_documents="truncate").max_tokens == 256
    assert docembed.load("sbert-tokens", device="cpu").max_tokens == 256


def test_fit_for_corpus_fitted_families(glove):
    model = docembed.load("tfidf", device="cpu").fit(TEXTS)
    vectors = model.encode(TEXTS)
    assert vectors.shape[0] == len(TEXTS)
    with pytest.raises(UsageError, match="fit"):
        glove.fit(TEXTS)


def test_loading_is_silent_and_leaves_library_logging_as_it_was(capfd):
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_warning()
    capfd.readouterr()
    model = docembed.load("nugget", device="cpu")  # its base checkpoint has heads NUGGET does not use
    model.encode(["a short text to embed"])
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert transformers_logging.get_verbosity() == transformers_logging.WARNING


def test_a_model_without_torch_loads_without_it_and_a_first_transformers_load_is_silent(tmp_path):
    """In a fresh process (where nothing imported transformers yet): glove-avg loads on a machine without a
    GPU driver without importing torch or transformers (seconds of start-up); the first load that does
    import transformers prints nothing and leaves its logging and bars at their defaults."""
    from docembed.runtime import _gpu_driver_present

    script = (
        "import sys, docembed\n"
        "docembed.load('glove-avg', device='auto').encode(['a text'])\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
        "docembed.load('nugget', device='cpu').encode(['a short text to embed'])\n"
        "from transformers.utils import logging\n"
        "from huggingface_hub.utils import are_progress_bars_disabled\n"
        "print(logging.get_verbosity() == logging.WARNING, logging.is_progress_bar_enabled(),"
        " are_progress_bars_disabled())\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    light, defaults = done.stdout.splitlines()
    assert light == ("True True" if _gpu_driver_present() else "False False")
    assert defaults == "True True False" and done.stderr == ""


def test_save_and_load_embeddings_at_the_top(glove, tmp_path):
    vectors = glove.encode(TEXTS[:2])
    docembed.save_embeddings(
        docembed.EmbeddingSet(vectors, ["a", "b"], glove.metadata()), str(tmp_path / "e.npy")
    )
    back = docembed.load_embeddings(str(tmp_path / "e.npy"))
    assert back.ids == ["a", "b"] and np.array_equal(back.data, vectors)


def test_import_docembed_is_light():
    heavy = "('torch', 'transformers', 'numpy')"
    code = f"import sys, docembed; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_counting_long_texts_in_pieces_gives_the_whole_texts_count(minilm_tokenizer, monkeypatch):
    from docembed import tensors
    from docembed.models import base

    monkeypatch.setattr(tensors, "STREAM_CHARS", 40)  # texts over 40 characters counted in blocks
    monkeypatch.setattr(tensors, "BLOCK_CHARS", 50)  # many blocks, cut at spaces
    texts = ["", "one", "a sentence of several words, " * 20, "many short words " * 30]
    whole = [len(minilm_tokenizer(t, verbose=False)["input_ids"]) for t in texts]
    assert base.count_tokens(minilm_tokenizer, texts) == whole
    # a run of text with no space is cut where it must: a count, not the model's input, so close is enough
    assert base.count_tokens(minilm_tokenizer, ["x" * 120])[0] > 0


def test_what_a_model_does_not_read_is_reported(tiny_sbert_dir, tmp_path, capfd):
    import warnings

    from docembed.errors import TruncationWarning

    model = docembed.load(str(tiny_sbert_dir), device="cpu")
    long_text = "word " * (3 * model.max_tokens)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.encode(["short", long_text])
    messages = [str(w.message) for w in caught if issubclass(w.category, TruncationWarning)]
    assert len(messages) == 1 and "1 of 2 documents were longer" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode(["short", "also short"])  # nothing cut: no warning

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        json.dumps({"id": "a", "text": "short"}) + "\n" + json.dumps({"id": "b", "text": long_text})
    )
    result = invoke(capfd, "encode", str(corpus), "-m", str(tiny_sbert_dir), "-o", str(tmp_path / "e.npy"))
    assert result.code == 0 and "1 of 2 documents were longer" in result.err
    coverage = docembed.load_embeddings(str(tmp_path / "e.npy")).metadata["coverage"]
    assert coverage["documents_cut"] == 1 and coverage["max_tokens"] == model.max_tokens
    assert coverage["tokens_not_read"] == 3 * model.max_tokens + 2 - model.max_tokens


def test_save_writes_a_model_folder_and_never_over_a_users_folder(tmp_path):
    model = docembed.load("tfidf", device="cpu").fit(TEXTS)
    model.save(tmp_path / "tfidf")
    assert np.array_equal(
        docembed.load(str(tmp_path / "tfidf"), device="cpu").encode(TEXTS), model.encode(TEXTS)
    )
    with pytest.raises(docembed.DocembedError, match="exists"):
        model.save(tmp_path / "tfidf")
    model.save(tmp_path / "tfidf", overwrite=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(docembed.DocembedError):
        model.save(mine, overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep"


def test_api_edge_cases_of_vectors_passed_to_similarity_and_passages(tiny_sbert_dir, tiny_sbert_tokens_dir):
    """A multi-vector model's one-string output (in a list) beside a set, a dense model's list of rows, a
    negative index into a set, and a prompt given to encode_query."""
    import docembed

    tokens = docembed.load(str(tiny_sbert_tokens_dir), device="cpu")
    texts = ["a cat sat on the mat", "dogs run in the park", "stocks fell"]
    sets = tokens.encode(texts)
    one = tokens.encode("a cat on a mat")
    assert one.ndim == 2
    expected = tokens.similarity(["a cat on a mat"], texts)
    np.testing.assert_allclose(tokens.similarity([one], sets), expected, atol=1e-5)  # one text: in a list
    with pytest.raises(docembed.DocembedError, match=r"go in a list, \[vectors\]"):
        tokens.similarity(one, sets)  # a bare (k, dim) array could be k pooled rows: not guessed
    assert np.array_equal(sets[-1], sets[2]) and len(sets[-1]) > 0
    with pytest.raises(IndexError):
        sets[3]
    dense = docembed.load(str(tiny_sbert_dir), device="cpu")
    rows = dense.encode(texts, convert_to_numpy=False)
    np.testing.assert_allclose(
        dense.similarity(rows, texts[:1]), dense.similarity(texts, texts[:1]), atol=1e-5
    )
    prompted = docembed.load(str(tiny_sbert_dir), device="cpu", prompts={"query": "q: "})
    np.testing.assert_allclose(prompted.encode_query("x", prompt="zz "), prompted.encode("zz x"), atol=1e-6)
    np.testing.assert_allclose(prompted.encode_query("x"), prompted.encode("q: x"), atol=1e-6)
    with pytest.raises(docembed.DocembedError, match="device is auto, cpu, cuda"):
        docembed.load(str(tiny_sbert_dir), device="gpu")
