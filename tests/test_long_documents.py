"""Whole documents: windows over every token (sbert's chunks and windows outputs, NUGGET's windows), the
same result as one pass for a document that fits in one window, and the --long switch."""

import math

import numpy as np
import pytest

import docembed
from cli_helpers import invoke
from docembed.errors import UsageError
from docembed.tensors import token_windows

LONG = " ".join(f"word{i % 97} is here" for i in range(400))  # well over one tiny window


def test_windows_cover_every_token_with_the_overlap_asked_for():
    ids = list(range(10))
    assert token_windows(ids, 4) == [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7]), (8, [8, 9])]
    assert [start for start, _ in token_windows(ids, 4, overlap=1)] == [0, 3, 6]
    assert token_windows([], 4) == [(0, [])]  # an empty text still gets one window
    assert token_windows(list(range(4)), 4, overlap=2) == [(0, [0, 1, 2, 3])]
    with pytest.raises(ValueError):
        token_windows(ids, 4, overlap=4)


@pytest.fixture(scope="module")
def sbert_outputs(tiny_sbert_dir):
    def load(output, overlap=0, normalize=True):
        model = docembed.load(str(tiny_sbert_dir), device="cpu")
        model.encoder.config.output = output
        model.encoder.config.window_overlap = overlap
        model.encoder.config.normalize = normalize
        return model

    return load


def test_a_text_within_one_window_reads_the_same_in_every_mode(sbert_outputs):
    short = ["a short text", "another short one"]
    mean = sbert_outputs("mean").encode(short)
    assert np.allclose(sbert_outputs("chunks").encode(short), mean, atol=1e-6)
    windows = sbert_outputs("windows").encode(short)
    assert windows.counts.tolist() == [1, 1] and np.allclose(windows.vectors, mean, atol=1e-6)


def test_windows_read_the_whole_text(sbert_outputs):
    model = sbert_outputs("windows", overlap=8)
    width = model.encoder.max_seq_length - 2
    n = len(model.encoder.tokenizer(LONG, add_special_tokens=False)["input_ids"])
    sets = model.encode([LONG])
    assert sets.counts[0] == len(token_windows(list(range(n)), width, 8)) > 1
    assert sets.positions.tolist() == [start for start, _ in token_windows(list(range(n)), width, 8)]
    assert model.max_tokens is None
    raw_windows = sbert_outputs("windows", overlap=8, normalize=False).encode([LONG])
    chunks = sbert_outputs("chunks", overlap=8, normalize=False).encode([LONG])[0]
    assert np.allclose(chunks, raw_windows[0].mean(axis=0), atol=1e-5)  # chunks = the mean of the windows


def test_long_switches_sbert_between_one_pass_and_windows(tiny_sbert_dir):
    model = docembed.load(str(tiny_sbert_dir), device="cpu", long_documents="windows")
    assert model.encoder.config.output == "chunks" and model.max_tokens is None
    tokens = docembed.load(str(tiny_sbert_dir), device="cpu")
    tokens.encoder.config.output = "tokens"
    with pytest.raises(docembed.DocembedError, match="not available"):
        tokens.encoder.set_long_documents("windows")


def test_nugget_windows_keep_about_r_of_all_tokens(minilm_tokenizer):
    from tiny_models import tiny_nugget

    encoder = tiny_nugget(minilm_tokenizer, ratio=0.25, max_length=64)
    assert encoder.config.long_documents == "windows"  # the default: the whole document
    short = ["a short document of a few words"]
    encoder.set_long_documents("truncate")
    truncated = encoder.encode(short + [LONG])
    encoder.set_long_documents("windows")
    whole = encoder.encode(short + [LONG])
    assert np.allclose(whole[0], truncated[0], atol=1e-5)  # one window: the same nuggets
    n = len(minilm_tokenizer(LONG, add_special_tokens=False)["input_ids"])
    windows = len(token_windows(list(range(n)), 64 - 2))
    k = int(whole.counts[1])
    assert math.ceil(0.25 * n) <= k <= math.ceil(0.25 * n) + 2 * windows  # each window's ceil (+ specials)
    assert int(truncated.counts[1]) == math.ceil(0.25 * 64)  # truncate: the first 64 tokens only
    assert whole.positions[whole.offsets[1] : whole.offsets[2]].max() > 64  # nuggets from beyond the cut
    assert encoder.max_tokens is None


def test_long_is_refused_by_families_without_it(tmp_path, capfd):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document\n")
    result = invoke(
        capfd, "encode", str(corpus), "-m", "glove-avg", "--long", "windows", "-o", str(tmp_path / "e.npy")
    )
    assert result.code != 0 and "--long" in result.err and "Traceback" not in result.err


def test_student_windows_average_every_token_of_a_long_text(tiny_bert_dir):
    from docembed.models.student import convert_long

    student = convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)
    student.config.normalize = False
    short = ["a short text"]
    assert student.config.long_documents == "windows"  # the default: the whole document
    student.set_long_documents("truncate")
    truncated = student.encode(short + [LONG])
    student.set_long_documents("windows")
    whole = student.encode(short + [LONG])
    assert np.allclose(whole[0], truncated[0], atol=1e-6)  # one window: the same vector
    assert not np.allclose(whole[1], truncated[1], atol=1e-3)  # the rest of the text counts now
    # the length-weighted mean of the windows' means = the mean over all the windows' tokens
    tokens = student.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    windows = [
        [student.tokenizer.cls_token_id, *w, student.tokenizer.sep_token_id]
        for _, w in token_windows(tokens, 38)
    ]
    means = student._means(windows, 8)
    weights = np.array([len(w) for w in windows], dtype=np.float64)
    assert np.allclose(whole[1], (means * weights[:, None]).sum(axis=0) / weights.sum(), atol=1e-5)
    assert student.max_tokens is None


def test_student_max_length_tiles_positions_as_convert_long_built_them(tiny_bert_dir):
    """A longer pass than the model was built for: the table continues as if converted at that length, so
    a student built short and lengthened encodes as one built long (same weights otherwise)."""
    import torch

    from docembed.models.student import convert_long

    torch.manual_seed(0)
    short = convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)
    long = convert_long(str(tiny_bert_dir), max_length=120, attention_window=8)
    short.set_long_documents("truncate")
    long.set_long_documents("truncate")
    before = short.encode([LONG])
    short.set_max_length(120)
    assert short.max_tokens == 120
    lengthened = short.encode([LONG])
    assert (
        short.model.embeddings.position_embeddings.num_embeddings == long.model.config.max_position_embeddings
    )
    np.testing.assert_allclose(lengthened, long.encode([LONG]), atol=1e-6, rtol=0)
    assert not np.allclose(lengthened, before, atol=1e-3)  # it reads 120 tokens now, not 40
    with pytest.raises(UsageError, match="max-length"):
        short.set_max_length(1)


def test_student_late_chunks_pool_each_256_tokens_of_the_long_pass(tiny_bert_dir):
    from docembed.models.student import convert_long

    student = convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)
    student.config.normalize = False
    student.config.chunk_tokens = 16
    student.set_long_documents("late-chunks")
    assert student.multi_vector and student.max_tokens is None
    out = student.encode(["a short text", LONG, ""])
    tokens = student.tokenizer(LONG, add_special_tokens=False, verbose=False)["input_ids"]
    # passes of 38 text tokens, each cut into chunks of 16, 16, 6: no chunk crosses a pass
    expected_starts = [
        p + c for p, _ in token_windows(tokens, 38) for c in (0, 16, 32) if p + c < len(tokens)
    ]
    assert out.counts.tolist() == [1, len(expected_starts), 1]
    assert out.positions[out.offsets[1] : out.offsets[2]].tolist() == expected_starts
    # each chunk is the mean of its tokens' states in its pass; [CLS] joins the first, [SEP] the last
    cls, sep = student.tokenizer.cls_token_id, student.tokenizer.sep_token_id
    first_pass = [cls, *tokens[:38], sep]
    ((_, states),) = student._token_states([first_pass], 8)
    np.testing.assert_allclose(out[1][0], states[0:17].mean(axis=0), atol=1e-6, rtol=0)
    np.testing.assert_allclose(out[1][1], states[17:33].mean(axis=0), atol=1e-6, rtol=0)
    np.testing.assert_allclose(out[1][2], states[33:40].mean(axis=0), atol=1e-6, rtol=0)
    # a text of one chunk (and an empty one): exactly the vector of the other modes
    student.set_long_documents("windows")
    means = student.encode(["a short text", ""])
    np.testing.assert_allclose(out[0][0], means[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(out[2][0], means[1], atol=1e-6, rtol=0)


def test_encode_late_chunks_and_max_length_from_the_command_line(tiny_bert_dir, tmp_path, capfd):
    from docembed.models.student import convert_long

    model_dir = tmp_path / "student"
    convert_long(str(tiny_bert_dir), max_length=40, attention_window=8).save(model_dir)
    corpus = tmp_path / "docs.txt"
    corpus.write_text(f"a short text\n{LONG}\n", encoding="utf-8")
    chunks = tmp_path / "chunks.npz"
    result = invoke(capfd, "encode", corpus, "-m", model_dir, "--long", "late-chunks", "-o", chunks)
    assert result.code == 0, result.err
    assert docembed.load_embeddings(str(chunks)).data.counts[1] > 1  # multi-vector output
    longer = tmp_path / "longer.npy"
    result = invoke(capfd, "encode", corpus, "-m", model_dir, "--max-length", "4096", "-o", longer)
    assert result.code == 0, result.err
    result = invoke(
        capfd, "encode", corpus, "-m", "glove-avg", "--max-length", "512", "-o", tmp_path / "g.npy"
    )
    assert result.code != 0 and "max-length" in result.err
