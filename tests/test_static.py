"""The `static` family: the distillation steps on a tiny BERT, encoding as the mean of every token's vector,
the save/load round trip, and the shipped model loading offline by name."""

import numpy as np
import pytest

import docembed
from cli_helpers import invoke
from docembed.models.static import StaticConfig
from docembed.training.static_distill import build_static, token_frequencies, token_outputs, token_weights

CORPUS = ["the cat sat on the mat", "the dog ate the bone", "a rare zygote appeared"]


@pytest.fixture(scope="module")
def outputs(tiny_bert_dir, minilm_tokenizer):
    from transformers import AutoModel

    return token_outputs(AutoModel.from_pretrained(str(tiny_bert_dir)), minilm_tokenizer, batch_size=4096)


@pytest.fixture(scope="module")
def tiny_static(outputs, minilm_tokenizer):
    counts = token_frequencies(minilm_tokenizer, CORPUS)
    return build_static(outputs, counts, StaticConfig(dim=8), tokenizer=minilm_tokenizer)


def test_token_outputs_are_the_model_outputs_of_cls_token_sep(outputs, tiny_bert_dir, minilm_tokenizer):
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_bert_dir)).eval()
    token = minilm_tokenizer.convert_tokens_to_ids("cat")
    ids = torch.tensor([[minilm_tokenizer.cls_token_id, token, minilm_tokenizer.sep_token_id]])
    with torch.inference_mode():
        states = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
    assert outputs["token"].shape == (len(minilm_tokenizer), model.config.hidden_size)
    assert np.allclose(outputs["token"][token], states[1].numpy(), atol=1e-5)
    assert np.allclose(outputs["mean"][token], states.mean(dim=0).numpy(), atol=1e-5)


def test_token_weights_favour_rare_tokens():
    counts = np.array([100, 10, 1, 0])
    zipf = token_weights(counts, "zipf")
    sif = token_weights(counts, "sif", sif_a=1e-2)
    assert np.all(np.diff(zipf) > 0) and np.all(np.diff(sif) > 0)
    assert sif[3] == 1.0 and sif[0] == pytest.approx(1e-2 / (1e-2 + 100 / 111))
    assert np.array_equal(token_weights(counts, "none"), np.ones(4, dtype=np.float32))
    with pytest.raises(ValueError, match="weighting"):
        token_weights(counts, "tfidf")


def test_a_document_is_the_mean_of_all_its_token_vectors(tiny_static, minilm_tokenizer):
    long_text = "the cat sat on the mat " * 2000  # 12,000 tokens: all of them are read
    vectors = tiny_static.encode(["the cat", long_text, ""])
    table = tiny_static.table.weight.numpy()
    for text, vector in zip(["the cat", long_text], vectors[:2], strict=True):
        ids = minilm_tokenizer(text, add_special_tokens=False)["input_ids"]
        expected = table[ids].astype(np.float64).mean(axis=0)
        assert np.allclose(vector, expected / np.linalg.norm(expected), atol=1e-4)  # float32 sums
    assert not vectors[2].any()  # no tokens: the zero vector
    assert tiny_static.max_tokens is None and tiny_static.token_counts([long_text]) is None


def test_save_and_load_round_trip(tiny_static, tmp_path):
    tiny_static.save(tmp_path / "static")
    again = docembed.load(str(tmp_path / "static"), device="cpu")
    assert again.family == "static" and again.dim == 8
    assert np.array_equal(again.encode(CORPUS), tiny_static.encode(CORPUS))


def test_a_damaged_table_is_a_one_line_error(tiny_static, tmp_path, capfd):
    folder = tmp_path / "static"
    tiny_static.save(folder)
    (folder / "model.safetensors").write_bytes(b"not a table")
    result = invoke(capfd, "similarity", "a", "b", "-m", str(folder))
    assert result.code == 1 and "static model" in result.err and "Traceback" not in result.err


def test_distill_static_refuses_unknown_settings(tmp_path, capfd):
    (tmp_path / "corpus.txt").write_text("a line of text\n")
    corpus = str(tmp_path / "corpus.txt")
    result = invoke(capfd, "distill-static", corpus, "-o", str(tmp_path / "m"), "--weighting", "idf")
    assert result.code == 2 and "--weighting" in result.err
    assert not (tmp_path / "m").exists()


def test_the_shipped_static_model_loads_offline_and_encodes_deterministically():
    first = docembed.load("static", device="cpu")
    assert first.dim == 256 and first.max_tokens is None
    texts = ["a quiet, moving film", "a calm and touching movie", "the stock market fell"]
    vectors = first.encode(texts)
    assert np.array_equal(vectors, docembed.load("static", device="cpu").encode(texts))
    scores = first.similarity(texts[:1], texts[1:])[0]
    assert scores[0] > scores[1]  # the paraphrase is closer than the unrelated text
