"""`encode --workers N` (docembed.parallel): N local processes, one output in input order, the same bytes as
one process; the model's options replayed in every worker."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings
from docembed.types import MultiVectors

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away", "into", "night"]


@pytest.fixture
def corpus(tmp_path):
    """40 texts of 1 to 90 words (many longer than the tiny models read), an empty one among them."""
    rng = random.Random(7)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 90))) for _ in range(40)]
    texts[5] = ""
    path = tmp_path / "docs.tsv"
    path.write_text("".join(f"d{i}\t{text}\n" for i, text in enumerate(texts)), encoding="utf-8")
    return path


def encode_with(capfd, corpus, model, output, *options):
    import torch

    threads = torch.get_num_threads()  # --workers/--threads set this process's torch threads
    try:
        result = invoke(capfd, "encode", corpus, "-m", model, "-o", output, "-b", "4", *options)
    finally:
        torch.set_num_threads(threads)
    assert result.code == 0, result.err
    return load_embeddings(str(output)), result.err


def assert_same_bytes(one, many):
    assert one.ids == many.ids == [f"d{i}" for i in range(40)]
    if isinstance(one.data, MultiVectors):
        assert np.array_equal(one.data.offsets, many.data.offsets)
        one_vectors, many_vectors = one.data.vectors, many.data.vectors
    else:
        one_vectors, many_vectors = one.data, many.data
    assert one_vectors.dtype == many_vectors.dtype == np.float32
    assert np.array_equal(one_vectors, many_vectors)


def test_sbert_in_two_processes_gives_the_bytes_of_one(capfd, tmp_path, corpus, tiny_sbert_dir):
    one, one_log = encode_with(capfd, corpus, tiny_sbert_dir, tmp_path / "one.npy", "--workers", "1")
    many, many_log = encode_with(capfd, corpus, tiny_sbert_dir, tmp_path / "two.npy", "--workers", "2")
    assert_same_bytes(one, many)
    # the note on what was not read counts every document once, whichever process encoded it
    assert one.metadata["coverage"] == many.metadata["coverage"]
    assert many.metadata["coverage"]["documents"] == 40 and many.metadata["coverage"]["documents_cut"] > 0
    assert "encoded 40 documents" in many_log


def test_options_reach_every_worker(capfd, tmp_path, corpus, minilm_tokenizer):
    """A multi-vector NUGGET at --ratio 0.5: the workers must apply the ratio the parent was given."""
    from tiny_models import tiny_nugget

    model_dir = tmp_path / "nugget"
    tiny_nugget(minilm_tokenizer).save(model_dir)
    options = ("--ratio", "0.5", "--threads", "1")
    one, _ = encode_with(capfd, corpus, model_dir, tmp_path / "one.npz", "--workers", "1", *options)
    many, _ = encode_with(capfd, corpus, model_dir, tmp_path / "two.npz", "--workers", "2", *options)
    assert_same_bytes(one, many)
    default_ratio, _ = encode_with(capfd, corpus, model_dir, tmp_path / "r.npz", "--workers", "1")
    assert many.data.counts.sum() > default_ratio.data.counts.sum()  # r = 0.5 keeps more than r = 0.25


@pytest.mark.slow  # two int8 exports in worker processes, 37 s here (make test-all)
def test_int8_workers_share_one_export_and_give_the_bytes_of_one(capfd, tmp_path, corpus, minilm_tokenizer):
    """--precision int8 in every worker: converted once (by the parent), read from the cache by each."""
    pytest.importorskip("openvino")
    from docembed.runtime import models_home
    from tiny_models import tiny_nugget

    model_dir = tmp_path / "nugget"
    tiny_nugget(minilm_tokenizer, feedback=False).save(model_dir)
    options = ("--precision", "int8", "--backend", "openvino")
    many, _ = encode_with(capfd, corpus, model_dir, tmp_path / "two.npz", "--workers", "2", *options)
    one, _ = encode_with(capfd, corpus, model_dir, tmp_path / "one.npz", "--workers", "1", *options)
    assert_same_bytes(one, many)
    assert many.metadata["inference"] == "openvino-int8"
    assert len(list((models_home() / "inference").glob("openvino-int8-*"))) == 1


def test_one_worker_is_the_one_process_encode_loop_on_one_thread(capfd, tmp_path, corpus, tiny_sbert_dir):
    """--workers 1 changes how texts are grouped, not what a text's vector is (the tiny model is
    deterministic on one thread, whatever the batch's other texts)."""
    plain, _ = encode_with(capfd, corpus, tiny_sbert_dir, tmp_path / "plain.npy", "--threads", "1")
    one, _ = encode_with(capfd, corpus, tiny_sbert_dir, tmp_path / "one.npy", "--workers", "1")
    assert plain.ids == one.ids
    np.testing.assert_allclose(one.data, plain.data, rtol=0, atol=1e-5)


def test_empty_input_is_refused_as_without_workers(capfd, tmp_path, tiny_sbert_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    result = invoke(capfd, "encode", empty, "-m", tiny_sbert_dir, "-o", tmp_path / "e.npy", "--workers", "2")
    assert result.code == 1
    assert "no documents to encode" in result.err
    assert not (tmp_path / "e.npy").exists()


@pytest.mark.parametrize("flag", ["--workers", "--threads"])
def test_workers_and_threads_are_for_the_local_engine(capfd, tmp_path, corpus, flag):
    result = invoke(
        capfd, "encode", corpus, "-m", "glove-avg", "-o", tmp_path / "out", "--engine", "ray", flag, "2"
    )
    assert result.code == 2
    assert "--num-workers" in result.err and "--cpus-per-worker" in result.err
