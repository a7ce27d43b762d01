"""Paragraph Vector (gensim Doc2Vec): tokenizer, long-document pieces, training signal, deterministic and
parallel inference, pickle-free save/load, and the train-pv -> encode command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from docembed.errors import CorruptModelError, UsageError
from docembed.models import paragraph_vector as pv
from docembed.models.paragraph_vector import (
    MAX_PIECE_TOKENS,
    ParagraphVectorEncoder,
    PVConfig,
    TaggedCorpus,
    split_pieces,
    tokenize,
    train_paragraph_vectors,
)
from docembed.models.registry import load_model
from docembed.types import l2_normalize

TOPIC_A = [f"apple{i}" for i in range(30)]
TOPIC_B = [f"boat{i}" for i in range(30)]
SHARED = [f"the{i}" for i in range(20)]


def topic_text(rng: np.random.Generator, topic: int, length: int = 30) -> str:
    words = TOPIC_A if topic == 0 else TOPIC_B
    return " ".join(rng.choice(words) if rng.random() < 0.7 else rng.choice(SHARED) for _ in range(length))


def tiny_config(**overrides) -> PVConfig:
    values = {
        "mode": "concat",
        "vector_size": 16,
        "window": 5,
        "epochs": 10,
        "min_count": 1,
        "sample": 0.0,
        "workers": 1,
        "encode_workers": 1,
    }
    return PVConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    rng = np.random.default_rng(0)
    return [topic_text(rng, i % 2) for i in range(300)]


@pytest.fixture(scope="module")
def trained(corpus) -> ParagraphVectorEncoder:
    encoder, stats = train_paragraph_vectors(corpus, tiny_config())
    assert [s.kind for s in stats] == ["dm", "dbow"]
    return encoder


@pytest.fixture(scope="module")
def probe_texts() -> list[str]:
    rng = np.random.default_rng(1)
    return [topic_text(rng, i % 2) for i in range(40)]


def within_minus_across(vectors: np.ndarray, labels: np.ndarray) -> float:
    unit = l2_normalize(vectors)
    sims = unit @ unit.T
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(labels), dtype=bool)
    return float(sims[same & off_diagonal].mean() - sims[~same].mean())


# --- tokenizer and pieces -------------------------------------------------------------------------------
def test_tokenize_lowercases_and_keeps_inner_apostrophes():
    assert tokenize("Don't STOP, it's 2024-ish!") == ["don't", "stop", "it's", "2024", "ish"]
    assert tokenize("") == [] and tokenize(" ... ") == []
    assert tokenize("'quoted'") == ["quoted"]


def test_split_pieces_covers_every_token_within_the_gensim_limit():
    tokens = [f"w{i}" for i in range(2 * MAX_PIECE_TOKENS + 7)]
    pieces = split_pieces(tokens)
    assert [len(p) for p in pieces] == [MAX_PIECE_TOKENS, MAX_PIECE_TOKENS, 7]
    assert sum(pieces, []) == tokens
    assert split_pieces([]) == [[]]


def test_training_corpus_gives_a_long_document_one_tag_over_all_pieces():
    long_text = " ".join(["word"] * (MAX_PIECE_TOKENS * 2 + 5))
    corpus = TaggedCorpus(["short text", long_text, ""])
    tagged = list(corpus)
    assert [(len(d.words), d.tags) for d in tagged] == [
        (2, [0]),
        (MAX_PIECE_TOKENS, [1]),
        (MAX_PIECE_TOKENS, [1]),
        (5, [1]),
        (0, [2]),  # an empty document still owns its row of doc vectors
    ]
    assert corpus.ids == ["0", "1", "2"] and corpus.long_documents == 1


# --- training -------------------------------------------------------------------------------------------
def test_training_separates_topics(trained, corpus, probe_texts):
    labels = np.arange(40) % 2
    inferred = trained.encode(probe_texts)
    assert inferred.shape == (40, 32) and inferred.dtype == np.float32
    assert within_minus_across(inferred, labels) > 0.3
    ids, learned = trained.training_vectors()
    assert ids == [str(i) for i in range(300)] and learned.shape == (300, 32)
    assert within_minus_across(learned, np.arange(300) % 2) > 0.3
    # Each half (DM, DBOW) learns on its own, too.
    for half in (slice(0, 16), slice(16, 32)):
        assert within_minus_across(inferred[:, half], labels) > 0.2


def test_untrained_baseline_does_not_separate_topics(probe_texts):
    # The same check on random start vectors (1 inference epoch at a tiny rate) shows the test can fail.
    rng = np.random.default_rng(2)
    encoder, _ = train_paragraph_vectors([topic_text(rng, i % 2) for i in range(20)], tiny_config(epochs=1))
    encoder.config.alpha = encoder.config.min_alpha = 1e-9
    assert abs(within_minus_across(encoder.encode(probe_texts), np.arange(40) % 2)) < 0.2


def test_empty_corpus_and_bad_config_are_user_errors():
    with pytest.raises(UsageError):
        train_paragraph_vectors([], tiny_config())
    with pytest.raises(UsageError):
        PVConfig(mode="dmc")
    with pytest.raises(UsageError):
        PVConfig(negative=0)


# --- inference ------------------------------------------------------------------------------------------
def test_empty_and_out_of_vocabulary_texts_get_finite_vectors(trained):
    vectors = trained.encode(["", "   ", "?!", "zzz unseen words"])
    assert vectors.shape == (4, 32) and np.isfinite(vectors).all()
    assert (np.linalg.norm(vectors, axis=1) > 0).all()
    assert trained.encode([]).shape == (0, 32)


def test_encode_is_bit_identical_across_calls_and_orders(trained, probe_texts):
    first = trained.encode(probe_texts)
    again = trained.encode(probe_texts)
    reversed_order = trained.encode(probe_texts[::-1])[::-1]
    assert np.array_equal(first, again) and np.array_equal(first, reversed_order)


def test_encode_is_bit_identical_in_another_process(trained, probe_texts, tmp_path):
    trained.save(tmp_path / "model")
    script = (
        "import sys, numpy as np; from docembed.models.paragraph_vector import ParagraphVectorEncoder as E;"
        "m = E.load(sys.argv[1]); t = [l.rstrip('\\n') for l in open(sys.argv[2])];"
        "np.save(sys.argv[3], m.encode(t))"
    )
    (tmp_path / "texts.txt").write_text("\n".join(probe_texts) + "\n")
    # A different hash seed: gensim's own infer_vector would start from a different vector here.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "model"),
            str(tmp_path / "texts.txt"),
            str(tmp_path / "o.npy"),
        ],
        check=True,
        env=env,
    )
    assert np.array_equal(np.load(tmp_path / "o.npy"), trained.encode(probe_texts))


def test_normalize_weighs_both_halves_equally(trained, probe_texts):
    normalized = ParagraphVectorEncoder(tiny_config(normalize=True), models=trained.models, tags=trained.tags)
    vectors = normalized.encode(probe_texts[:4])
    assert normalized.normalized and not trained.normalized
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors[:, :16], axis=1), 0.5**0.5, rtol=1e-5)
    raw = trained.encode(probe_texts[:4])
    np.testing.assert_allclose(vectors[:, 16:], l2_normalize(raw[:, 16:]) * 0.5**0.5, rtol=1e-5, atol=1e-7)


def test_seed_changes_inference(trained, probe_texts):
    other = ParagraphVectorEncoder(tiny_config(seed=1), models=trained.models, tags=trained.tags)
    assert not np.array_equal(other.encode(probe_texts[:2]), trained.encode(probe_texts[:2]))


def test_pool_workers_drop_docembed_signal_handlers(trained):
    """The pool stops its workers with SIGTERM; a worker that kept docembed's SIGTERM handler printed
    "docembed: terminated" (in about half of the runs: a race with the pool's shutdown)."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, lambda *_: None)  # as docembed.cli.main installs one
        pv._init_worker(str(trained._saved_dir()))
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # Ctrl-C is the parent's to handle
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_two_processes_give_the_one_process_result(trained, probe_texts, monkeypatch):
    texts = probe_texts * 2  # 80 texts: enough for MIN_TEXTS_PER_WORKER with 2 workers
    single = trained.encode(texts)
    monkeypatch.setattr(pv.os, "cpu_count", lambda: 2)
    pools = []
    original = ParagraphVectorEncoder._encode_parallel

    def recording_encode_parallel(self, texts, workers):
        pools.append(workers)
        return original(self, texts, workers)

    monkeypatch.setattr(ParagraphVectorEncoder, "_encode_parallel", recording_encode_parallel)
    trained.set_workers(2)
    try:
        parallel = trained.encode(texts)
    finally:
        trained.set_workers(1)
    assert pools == [2]
    assert np.array_equal(parallel, single)


def test_workers_are_never_forked_from_this_process():
    """A child forked after torch/onnxruntime started their thread pools can hang forever on a lock (seen at
    pytest's exit): the workers come from a fork server or are spawned."""
    assert pv._start_method() in ("forkserver", "spawn")


@pytest.mark.slow
def test_spawned_workers_load_the_saved_model(trained, probe_texts, monkeypatch):
    texts = probe_texts * 2
    single = trained.encode(texts)
    monkeypatch.setattr(pv, "_start_method", lambda: "spawn")
    monkeypatch.setattr(pv.os, "cpu_count", lambda: 2)
    trained.set_workers(2)
    try:
        assert np.array_equal(trained.encode(texts), single)
    finally:
        trained.set_workers(1)


def test_long_document_tail_is_used(trained):
    rng = np.random.default_rng(3)
    head = " ".join(rng.choice(TOPIC_A, size=MAX_PIECE_TOKENS))
    tail_b = " ".join(rng.choice(TOPIC_B, size=6000))
    tail_a = " ".join(rng.choice(TOPIC_A, size=6000))
    centroid_b = l2_normalize(trained.encode([topic_text(rng, 1) for _ in range(20)]).mean(0))
    with_b, with_a = l2_normalize(trained.encode([f"{head} {tail_b}", f"{head} {tail_a}"]))
    # If the words after token 10,000 were dropped (gensim's silent limit), both would look the same.
    assert with_b @ centroid_b - with_a @ centroid_b > 0.1


# --- save / load ----------------------------------------------------------------------------------------
def test_save_load_round_trip_is_exact_and_pickle_free(trained, probe_texts, tmp_path):
    before = trained.encode(probe_texts)
    trained.save(tmp_path / "pv")
    assert sorted(p.name for p in (tmp_path / "pv").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tags.json",
        "vocab.json",
    ]
    config = json.loads((tmp_path / "pv" / "config.json").read_text())
    assert (
        config["family"] == "pv"
        and config["config"]["window"] == 5
        and config["sub_models"] == ["dm", "dbow"]
    )
    loaded = load_model(str(tmp_path / "pv"))
    assert isinstance(loaded, ParagraphVectorEncoder)
    assert np.array_equal(loaded.encode(probe_texts), before)
    for kind in ("dm", "dbow"):
        original, rebuilt = trained.models[kind], loaded.models[kind]
        assert np.array_equal(original.cum_table, rebuilt.cum_table)
        assert np.array_equal(original.wv.expandos["sample_int"], rebuilt.wv.expandos["sample_int"])
    assert np.array_equal(loaded.training_vectors()[1], trained.training_vectors()[1])


def test_round_trip_with_subsampling_and_ties_in_counts(corpus, tmp_path):
    # sample > 0 makes the rebuilt subsampling thresholds matter; tied counts test the vocabulary order.
    encoder, _ = train_paragraph_vectors(corpus[:60], tiny_config(mode="dm", sample=1e-2, epochs=2))
    encoder.save(tmp_path / "m")
    loaded = ParagraphVectorEncoder.load(tmp_path / "m")
    assert loaded.models["dm"].wv.index_to_key == encoder.models["dm"].wv.index_to_key
    assert np.array_equal(loaded.encode(corpus[:5]), encoder.encode(corpus[:5]))


def test_corrupt_model_directories_are_reported(trained, tmp_path):
    trained.save(tmp_path / "m")
    (tmp_path / "m" / "vocab.json").write_text("{not json")
    with pytest.raises(CorruptModelError, match="vocab.json"):
        ParagraphVectorEncoder.load(tmp_path / "m")
    trained.save(tmp_path / "m")
    (tmp_path / "m" / "tags.json").write_text("[]\n")  # doc vectors no longer match the tags
    with pytest.raises(CorruptModelError, match="doc_vectors"):
        ParagraphVectorEncoder.load(tmp_path / "m")


def test_config_hash_ignores_worker_counts():
    assert PVConfig(workers=1, encode_workers=1).hash() == PVConfig(workers=2, encode_workers=4).hash()
    assert PVConfig(window=5).hash() != PVConfig(window=10).hash()


# --- command line ---------------------------------------------------------------------------------------
def test_cli_train_pv_then_encode(corpus, tmp_path):
    from docembed.cli import app

    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"doc": f"d{i}", "body": t}) + "\n" for i, t in enumerate(corpus[:80]))
    )
    model_dir = tmp_path / "pv-model"
    runner = CliRunner()
    args = ["--seed", "3", "train-pv", str(docs), "-o", str(model_dir), "--mode", "dbow", "--dim", "8"]
    args += [
        "--epochs",
        "2",
        "--min-count",
        "1",
        "--workers",
        "1",
        "--id-field",
        "doc",
        "--text-field",
        "body",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((model_dir / "config.json").read_text())["config"]
    assert saved["mode"] == "dbow" and saved["vector_size"] == 8 and saved["seed"] == 3
    assert json.loads((model_dir / "tags.json").read_text())[:2] == ["d0", "d1"]
    log = [json.loads(line) for line in (model_dir / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["kind"] == "dbow" and log[0]["raw_words"] == 2 * 80 * 30

    out = tmp_path / "out.npy"
    result = runner.invoke(
        app,
        [
            "encode",
            str(docs),
            "--model",
            str(model_dir),
            "-o",
            str(out),
            "--text-field",
            "body",
            "--id-field",
            "doc",
        ],
    )
    assert result.exit_code == 0, result.output
    vectors = np.load(out)
    assert vectors.shape == (80, 8) and vectors.dtype == np.float32
    model = load_model(str(model_dir))
    assert np.array_equal(vectors[:3], model.encode(corpus[:3]))

    # Training again into a non-empty directory needs --overwrite; stdin cannot be read twice.
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "output exists" in str(result.exception)
    result = runner.invoke(app, ["train-pv", "-", "-o", str(tmp_path / "x"), "--format", "txt"])
    assert isinstance(result.exception, UsageError)


def test_encode_workers_saved_in_config_are_used(corpus, tmp_path):
    encoder, _ = train_paragraph_vectors(corpus[:40], tiny_config(mode="dbow", epochs=1, encode_workers=3))
    encoder.save(tmp_path / "m")
    assert ParagraphVectorEncoder.load(Path(tmp_path / "m")).workers == 3
