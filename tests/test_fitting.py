"""The corpus-fitted families fitted from Python (docembed.training.fitting): each fit function gives a
working model, the same one its command makes with the same settings and seed, and the commands' defaults
are the functions' defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from docembed.cli import app
from docembed.errors import UsageError
from docembed.models.baselines import BM25Config, TfidfConfig, fit_bm25, fit_tfidf
from docembed.models.paragraph_vector import PVConfig, fit_pv
from docembed.models.registry import FIT_COMMANDS, load_model
from docembed.models.setenc import SetEncoderConfig
from docembed.training.fitting import (
    FIT_FUNCTIONS,
    SETENC_ATTENTION,
    SetEncoderTraining,
    fit_family,
    fit_setenc,
    setenc_loop,
)

TOPICS = ["apple pear plum fruit juice orchard", "boat sail harbour ship anchor sea", "code bug test merge"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL corpus of 40 documents on three topics, and its texts."""
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(TOPICS[i % 3].split(), size=10).tolist()) for i in range(40)]
    path = tmp_path_factory.mktemp("fitting") / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path, texts


def run(*args: str):
    result = CliRunner().invoke(app, ["-q", *args])
    assert result.exit_code == 0, result.output
    return result


def command_defaults(name: str) -> dict:
    command = typer.main.get_command(app).commands[name]
    return {param.name: param.default for param in command.params}


def test_every_corpus_fitted_family_has_one_fit_function():
    assert set(FIT_FUNCTIONS) == set(FIT_COMMANDS)
    with pytest.raises(UsageError, match="corpus-fitted"):
        fit_family("sbert", ["a text"])


def test_tfidf_from_python_is_the_fit_command(corpus, tmp_path):
    path, texts = corpus
    model = fit_tfidf(texts, TfidfConfig(svd_dim=4, seed=3), tmp_path / "python")
    assert model.encode(texts[:5]).shape == (5, 4)
    run("--seed", "3", "fit", "tfidf", str(path), "-o", str(tmp_path / "cli"), "--svd-dim", "4")
    from_cli = load_model(str(tmp_path / "cli")).encode(texts)
    np.testing.assert_allclose(model.encode(texts), from_cli, atol=1e-6)
    np.testing.assert_allclose(load_model(str(tmp_path / "python")).encode(texts), from_cli, atol=1e-6)


def test_tfidf_bigrams_from_python_is_the_fit_command_with_ngram_max_2(corpus, tmp_path):
    path, texts = corpus
    model = fit_family("tfidf-bigrams", texts, seed=3)
    assert model.config.ngram_max == 2 and any(" " in term for term in model.vectorizer.vocabulary_)
    run("--seed", "3", "fit", "tfidf", str(path), "-o", str(tmp_path / "cli"), "--ngram-max", "2")
    from_cli = load_model(str(tmp_path / "cli"))
    assert (model.encode_sparse(texts) != from_cli.encode_sparse(texts)).nnz == 0
    bm25 = ["fit", "bm25", str(path), "-o", str(tmp_path / "b"), "--ngram-max", "2"]
    result = CliRunner().invoke(app, bm25)
    assert result.exit_code != 0 and "--ngram-max applies to tfidf only" in str(result.exception)


def test_bm25_from_python_is_the_fit_command(corpus, tmp_path):
    path, texts = corpus
    scorer = fit_bm25(texts, BM25Config(k1=1.2, b=0.75))
    assert scorer.num_docs == len(texts) and not (tmp_path / "cli").exists()
    run("fit", "bm25", str(path), "-o", str(tmp_path / "cli"))
    from_cli = load_model(str(tmp_path / "cli"))
    query, candidates = "ship anchor", texts[:6]
    np.testing.assert_allclose(scorer.score(query, candidates), from_cli.score(query, candidates))
    assert scorer.score(query, candidates)[1] > scorer.score(query, candidates)[0]  # the boat topic wins


def test_pv_from_python_is_train_pv(corpus, tmp_path):
    path, texts = corpus
    settings = {"mode": "dbow", "vector_size": 8, "epochs": 5, "min_count": 1, "workers": 1}
    model = fit_pv(texts, PVConfig(**settings, seed=4, encode_workers=1), tmp_path / "python")
    assert model.encode(texts[:3]).shape == (3, 8)
    log = [json.loads(line) for line in (tmp_path / "python" / "train_log.jsonl").read_text().splitlines()]
    assert [entry["kind"] for entry in log] == ["dbow"] and log[0]["documents"] == len(texts)
    flags = ["--mode", "dbow", "--dim", "8", "--epochs", "5", "--min-count", "1", "--workers", "1"]
    run("--seed", "4", "train-pv", str(path), "-o", str(tmp_path / "cli"), *flags, "--encode-workers", "1")
    from_cli = load_model(str(tmp_path / "cli"))
    np.testing.assert_allclose(model.encode(texts), from_cli.encode(texts), atol=1e-6)
    assert from_cli.tags[:2] == ["d0", "d1"] and model.tags[:2] == ["0", "1"]  # Documents give their ids


def test_setenc_from_python_is_train_setenc(corpus, tmp_path):
    path, texts = corpus
    shape = {"num_buckets": 256, "word_dim": 8, "heads": 2, "dim": 8, "hidden": 8}
    config = SetEncoderConfig(**shape, attention=SETENC_ATTENTION)
    training = SetEncoderTraining(batch_size=10)
    loop = setenc_loop(seed=5, device="cpu", epochs=2)
    model = fit_setenc(texts, config, None, training, loop)  # no output: trained in a temporary directory
    vectors = model.encode(texts)
    assert vectors.shape == (len(texts), 8)
    flags = ["--buckets", "256", "--word-dim", "8", "--heads", "2", "--dim", "8", "--hidden", "8", "-b", "10"]
    flags += ["--epochs", "2"]
    run("--seed", "5", "--device", "cpu", "train-setenc", str(path), "-o", str(tmp_path / "cli"), *flags)
    np.testing.assert_allclose(vectors, load_model(str(tmp_path / "cli")).encode(texts), atol=1e-5)
    other_seed = fit_setenc(texts, config, None, training, setenc_loop(seed=6, device="cpu", epochs=2))
    assert not np.allclose(other_seed.encode(texts), vectors, atol=1e-3)


def test_encode_fit_is_fit_family(corpus, tmp_path):
    path, texts = corpus
    run("--seed", "2", "encode", str(path), "-m", "tfidf", "--fit", "-o", str(tmp_path / "t.npy"))
    model = fit_family("tfidf", texts, tmp_path / "python", seed=2)
    assert (tmp_path / "t.model" / "config.json").exists() and (tmp_path / "python" / "config.json").exists()
    np.testing.assert_allclose(np.load(tmp_path / "t.npy"), model.encode(texts), atol=1e-6)
    # PV with train-pv's defaults (two training threads: not bit-reproducible, so its settings are compared)
    run("--seed", "2", "encode", str(path), "-m", "pv", "--fit", "-o", str(tmp_path / "p.npy"))
    pv_model = load_model(str(tmp_path / "p.model"))
    assert pv_model.config == PVConfig(seed=2) and pv_model.tags[0] == "d0"
    assert np.load(tmp_path / "p.npy").shape == (len(texts), PVConfig().vector_size)
    # setenc with train-setenc's defaults (one step per epoch here: 40 documents, batches of 256)
    run(
        "--seed",
        "3",
        "--device",
        "cpu",
        "encode",
        str(path),
        "-m",
        "setenc",
        "--fit",
        "-o",
        str(tmp_path / "s.npy"),
    )
    run("--seed", "3", "--device", "cpu", "train-setenc", str(path), "-o", str(tmp_path / "setenc"))
    from_command = load_model(str(tmp_path / "setenc")).encode(texts)
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), from_command, atol=1e-5)


def test_the_commands_defaults_are_the_fit_functions_defaults():
    pv_cli, pv = command_defaults("train-pv"), PVConfig()
    renamed = {"dim": "vector_size"}
    shared = [name for name in pv_cli if renamed.get(name, name) in pv.to_dict() and name != "infer_epochs"]
    assert len(shared) >= 12
    for name in shared:
        assert pv_cli[name] == getattr(pv, renamed.get(name, name)), name

    setenc_cli = command_defaults("train-setenc")
    config = SetEncoderConfig(attention=SETENC_ATTENTION)
    renamed = {"buckets": "num_buckets", "hashes": "num_hashes"}
    for name in (
        "buckets",
        "hashes",
        "word_dim",
        "heads",
        "dim",
        "hidden",
        "counts",
        "token_norm",
        "attention",
    ):
        assert setenc_cli[name] == getattr(config, renamed.get(name, name)), name
    training = SetEncoderTraining()
    for name, value in vars(training).items():
        assert setenc_cli[name] == value, name
    loop = setenc_loop()
    loop_fields = [
        name for name in setenc_cli if hasattr(loop, name) and name not in ("resume", "output_dir")
    ]
    assert {"epochs", "lr", "weight_decay", "warmup_steps", "amp"} <= set(loop_fields)
    for name in loop_fields:
        assert setenc_cli[name] == getattr(loop, name), name
