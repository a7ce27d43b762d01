import numpy as np
import pytest
import torch

from docembed.models.sbert import SBertConfig, SBertEncoder


@pytest.fixture(scope="module")
def minilm_chunks():
    return SBertEncoder(SBertConfig(output="chunks"))


def _long_text(tokenizer, n_tokens: int) -> str:
    sentences, i = [], 0
    while len(tokenizer(" ".join(sentences), add_special_tokens=False)["input_ids"]) < n_tokens:
        sentences.append(f"Boat {i} drifted past the quiet village while herons watched.")
        i += 1
    return " ".join(sentences)


def test_chunks_average_the_windows_encoded_one_by_one(minilm_chunks):
    model = minilm_chunks
    tokenizer = model.tokenizer
    text = _long_text(tokenizer, 600)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert 600 <= len(ids) < 610 and model.max_seq_length == 256
    # Reference: each window through the bare transformer, mean-pooled and normalised, one at a time.
    bert = model.model[0].auto_model
    window_vectors = []
    for start in range(0, len(ids), 254):
        window = [tokenizer.cls_token_id, *ids[start : start + 254], tokenizer.sep_token_id]
        with torch.inference_mode():
            hidden = bert(input_ids=torch.tensor([window])).last_hidden_state[0]
        vector = hidden.mean(0).numpy()
        window_vectors.append(vector / np.linalg.norm(vector))
    assert len(window_vectors) == 3
    expected = np.mean(window_vectors, axis=0)
    expected /= np.linalg.norm(expected)

    short = "A short text fits in one window."
    got = model.encode([short, text, ""], batch_size=2)
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got[1], expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # One window: exactly what `mean` gives; and the first window is `mean`'s truncation of the long text.
    mean = SBertEncoder(SBertConfig(output="mean"))
    np.testing.assert_allclose(got[[0, 2]], mean.encode([short, ""]), atol=1e-5)
    np.testing.assert_allclose(mean.encode([text])[0], window_vectors[0], atol=1e-5)


# --- inference backends: conftest's tiny sbert (2 layers, 32-d, 32-token windows, mean pooling) -----------
TEXTS = [
    "A man is playing a guitar on the street.",
    "The stock market fell sharply after the announcement.",
    "",
    "Cats sleep for most of the day, and wake up hungry at night.",
]


@pytest.fixture
def shared_home(tmp_path_factory, monkeypatch):
    """One models home for this module's engine tests, so each export runs once (seconds each)."""
    root = tmp_path_factory.getbasetemp() / "backends_home"
    monkeypatch.setenv("DOCEMBED_HOME", str(root))
    return root


def _load(directory, output="mean", **inference):
    from docembed.models.registry import load_model

    model = load_model(str(directory))
    model.config.output = output
    return model.set_inference(**inference) if inference else model


def _cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize(("backend", "threshold"), [("openvino", 0.99), ("onnx", 0.98)])
def test_int8_embeddings_close_to_fp32(tiny_sbert_dir, shared_home, backend, threshold):
    pytest.importorskip("openvino" if backend == "openvino" else "onnxruntime")
    reference = _load(tiny_sbert_dir).encode(TEXTS, batch_size=3)
    model = _load(tiny_sbert_dir, backend=backend, precision="int8")
    assert model.backend == backend
    got = model.encode(TEXTS, batch_size=3)
    assert got.shape == reference.shape
    cosines = _cosines(got, reference)
    assert cosines.min() > threshold, cosines
    assert cosines.min() < 0.99999  # really quantised, not the float model under another name
    assert model.config_hash() != _load(tiny_sbert_dir).config_hash()


@pytest.mark.parametrize("output", ["mean", "tokens", "chunks"])
def test_fp32_engine_matches_torch_for_every_output(tiny_sbert_dir, shared_home, output):
    pytest.importorskip("openvino")
    texts = [*TEXTS, " ".join(TEXTS * 6)]  # the last one spans several 32-token windows
    reference = _load(tiny_sbert_dir, output).encode(texts, batch_size=2)
    got = _load(tiny_sbert_dir, output, backend="openvino").encode(texts, batch_size=2)
    if output == "tokens":
        assert got.counts.tolist() == reference.counts.tolist()
        got, reference = got.vectors, reference.vectors
    np.testing.assert_allclose(got, reference, atol=1e-4)


def test_export_is_cached(tiny_sbert_dir, monkeypatch):
    pytest.importorskip("openvino")
    from docembed.models import inference_backends
    from docembed.runtime import models_home

    first = _load(tiny_sbert_dir, backend="openvino", precision="int8").encode(TEXTS)
    exported = list((models_home() / "inference").iterdir())  # this test's own, empty home
    assert len(exported) == 1 and (exported[0] / "done.json").exists()

    def no_export(*args, **kwargs):
        raise AssertionError("the second load exported again")

    monkeypatch.setattr(inference_backends, "_export_openvino", no_export)
    second = _load(tiny_sbert_dir, backend="openvino", precision="int8").encode(TEXTS)
    np.testing.assert_array_equal(first, second)
    assert list((models_home() / "inference").iterdir()) == exported
    # Other settings are other artefacts, never the cached int8 one.
    with pytest.raises(AssertionError, match="exported again"):
        _load(tiny_sbert_dir, backend="openvino", precision="fp32").encode(TEXTS)


def test_missing_engine_says_what_to_install(tiny_sbert_dir, monkeypatch):
    import sys

    from docembed.errors import DocembedError, UsageError

    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(DocembedError, match=r"pip install 'docembed\[openvino\]'"):
        _load(tiny_sbert_dir, backend="openvino", precision="int8")
    with pytest.raises(DocembedError, match=r"pip install 'docembed\[openvino\]'"):
        _load(tiny_sbert_dir, precision="int8")  # auto: no engine to fall back on for int8
    with pytest.raises(UsageError, match="openvino or onnx"):
        _load(tiny_sbert_dir, backend="torch", precision="int8")
    # fp32 needs no extra: auto runs PyTorch.
    assert _load(tiny_sbert_dir, backend="auto").backend == "torch"


def test_cli_backend_without_the_extra_exits_1_with_one_line(tiny_sbert_dir, tmp_path, monkeypatch, capfd):
    import sys

    from cli_helpers import invoke

    monkeypatch.setitem(sys.modules, "openvino", None)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one text\nanother text\n")
    args = ["encode", corpus, "-m", tiny_sbert_dir, "-o", tmp_path / "out.npy", "--backend", "openvino"]
    result = invoke(capfd, *args, "--precision", "int8")
    assert result.code == 1
    # (transformers' own "Loading weights" bar may precede it on stderr)
    assert (
        result.err.strip()
        .splitlines()[-1]
        .endswith("error: --backend openvino needs openvino and nncf: pip install 'docembed[openvino]'")
    )
    assert "Traceback" not in result.err
    assert not (tmp_path / "out.npy").exists()
