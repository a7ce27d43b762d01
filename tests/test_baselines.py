"""Baselines: tfidf (fit, sparse/dense output, save/load), bm25 (hand-computed Okapi scores), glove-avg."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from docembed.errors import UsageError
from docembed.models.baselines import (
    BM25Config,
    BM25Scorer,
    GloveAverageEncoder,
    GloveConfig,
    TfidfConfig,
    TfidfEncoder,
    tokenize,
)
from docembed.models.registry import load_model

CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "cats and dogs are pets",
    "a stock market report",
    "",
]


def test_tokenize_splits_clitics_like_glove():
    assert tokenize("I don't know, it's Mrs. Smith's") == [
        "i",
        "do",
        "n't",
        "know",
        ",",
        "it",
        "'s",
        "mrs",
        ".",
        "smith",
        "'s",
    ]


def test_tfidf_sparse_rows_are_sublinear_and_normalised():
    model = TfidfEncoder(TfidfConfig(svd_dim=0)).fit(CORPUS)
    rows = model.encode_sparse(["the the the cat", ""])
    assert rows.shape[0] == 2
    assert np.linalg.norm(rows[0].toarray()) == pytest.approx(1.0, abs=1e-6)
    assert rows[1].nnz == 0  # empty text: zero row
    vocab = model.vectorizer.vocabulary_
    idf = model.vectorizer.idf_
    weights = rows[0].toarray()[0]
    # sublinear tf: 1 + ln(3) for "the" against 1 for "cat", each times its idf
    ratio = weights[vocab["the"]] / weights[vocab["cat"]]
    assert ratio == pytest.approx((1 + math.log(3)) * idf[vocab["the"]] / idf[vocab["cat"]], rel=1e-5)
    dense = model.encode(["the cat"])
    assert dense.shape == (1, len(vocab)) and dense.dtype == np.float32


def test_tfidf_projects_only_when_an_lsa_reduces():
    """An LSA is kept only of more documents and terms than its size: of fewer it dropped a real dimension
    (of two documents it kept one, where every cosine is +-1, so `load("tfidf").fit(two texts)` scored both
    1.0); the exact rows are kept instead, and rank by the words the texts share."""
    import docembed

    docs = ["a dog barked", "the cat slept"]
    model = docembed.load("tfidf").fit(docs)
    scores = model.similarity("cat", docs)[0]
    assert scores[0] == 0.0 and scores[1] > 0.3
    vocabulary = model.encoder.vectorizer.vocabulary_
    assert model.encoder.components is None and model.encode(docs).shape == (2, len(vocabulary))
    dense = model.encode(["cat", *docs])  # the sparse scoring gives the cosines of the dense rows
    np.testing.assert_allclose(scores, dense[1:] @ dense[0], atol=1e-6)
    assert TfidfEncoder(TfidfConfig(svd_dim=3)).fit(CORPUS).components.shape[0] == 3
    assert TfidfEncoder(TfidfConfig(svd_dim=len(CORPUS))).fit(CORPUS).components is None


def test_tfidf_save_load_round_trip_with_svd(tmp_path):
    model = TfidfEncoder(TfidfConfig(svd_dim=3)).fit(CORPUS)
    before = model.encode(["the cat sat", "market"])
    assert before.shape == (2, 3)
    model.save(tmp_path / "tfidf")
    assert {p.name for p in (tmp_path / "tfidf").iterdir()} == {
        "config.json",
        "vocab.json",
        "model.safetensors",
    }
    loaded = load_model(str(tmp_path / "tfidf"))
    assert not loaded.requires_fit
    assert np.allclose(loaded.encode(["the cat sat", "market"]), before, atol=1e-6)
    assert (loaded.encode_sparse(["dog"]) != model.encode_sparse(["dog"])).nnz == 0


def test_unfitted_tfidf_says_how_to_fit():
    with pytest.raises(UsageError, match="docembed fit tfidf"):
        TfidfEncoder(TfidfConfig()).encode(["x"])


def test_bm25_matches_hand_computed_okapi():
    docs = ["a b", "a c c", "d"]
    scorer = BM25Scorer(BM25Config(k1=1.2, b=0.75)).fit(docs)
    avg_len = 6 / 3

    def idf(df):
        return math.log(1 + (3 - df + 0.5) / (df + 0.5))

    def term(tf, length, df):
        return idf(df) * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / avg_len))

    scores = scorer.score("a c", docs)
    assert scores[0] == pytest.approx(term(1, 2, 2), rel=1e-5)
    assert scores[1] == pytest.approx(term(1, 3, 2) + term(2, 3, 1), rel=1e-5)
    assert scores[2] == 0.0
    with pytest.raises(UsageError, match="scorer"):
        scorer.encode(["a"])


def test_bm25_save_load(tmp_path):
    scorer = BM25Scorer(BM25Config()).fit(CORPUS)
    scorer.save(tmp_path / "bm25")
    loaded = load_model(str(tmp_path / "bm25"))
    query, candidates = "the cat", CORPUS
    assert np.allclose(loaded.score(query, candidates), scorer.score(query, candidates))


def test_glove_average_of_word_vectors_file(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("3 2\nhello 1 0\nworld 0 1\n, 5 5\n", encoding="utf-8")  # word2vec header line
    model = GloveAverageEncoder(GloveConfig(vectors=str(path)))
    out = model.encode(["Hello world", "hello unknown", "", "nothing known"])
    assert out.tolist() == [[0.5, 0.5], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    model.save(tmp_path / "saved")
    again = load_model(str(tmp_path / "saved"))
    assert np.array_equal(again.encode(["hello , world"]), model.encode(["hello , world"]))


def test_glove_avg_builtin_uses_offline_vectors():
    from docembed.models.word_vectors import offline_glove

    model = load_model("glove-avg")
    words, matrix = offline_glove()
    expected = (matrix[words.index("good")] + matrix[words.index("movie")]) / 2
    assert np.allclose(model.encode(["Good movie"])[0], expected)
    assert model.dim == 50


def test_cli_fit_then_encode(tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:4]) + "\n", encoding="utf-8")
    runner = CliRunner()
    fitted = runner.invoke(
        app, ["-q", "fit", "tfidf", str(corpus), "-o", str(tmp_path / "m"), "--svd-dim", "2"]
    )
    assert fitted.exit_code == 0, fitted.output
    out = tmp_path / "emb.npy"
    encoded = runner.invoke(
        app, ["-q", "encode", str(corpus), "--model", str(tmp_path / "m"), "-o", str(out)]
    )
    assert encoded.exit_code == 0, encoded.output
    assert np.load(out).shape == (4, 2)
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    assert meta["family"] == "tfidf"


def test_bm25_english_analyzer_stems_and_drops_stopwords():
    from docembed.text import analyze

    assert analyze("The rocket launches; they launched it", "english") == ["rocket", "launch", "launch"]
    docs = ["rocket launches from the pad", "the weather report for the week"]
    plain = BM25Scorer(BM25Config()).fit(docs)
    english = BM25Scorer(BM25Config(analyzer="english")).fit(docs)
    assert plain.score("launch", docs).tolist() == [0.0, 0.0]  # no analyzer: "launch" is not "launches"
    scores = english.score("launch", docs)
    assert scores[0] > 0 and scores[1] == 0.0
    assert english.score("the", docs).tolist() == [0.0, 0.0]  # a stopword is no term


def test_bm25_settings_round_trip_and_bad_values_fail(tmp_path):
    scorer = BM25Scorer(BM25Config(analyzer="english", k1=0.9, b=0.4)).fit(CORPUS)
    scorer.save(tmp_path / "bm25")
    loaded = load_model(str(tmp_path / "bm25"))
    assert (loaded.config.analyzer, loaded.config.k1, loaded.config.b) == ("english", 0.9, 0.4)
    np.testing.assert_allclose(loaded.score("cats", CORPUS), scorer.score("cats", CORPUS), rtol=1e-6)
    assert loaded.score("cats", CORPUS)[0] > 0  # "cat" and "cats" share a stem
    with pytest.raises(UsageError, match="analyzer"):
        BM25Config(analyzer="klingon")
    with pytest.raises(UsageError, match="b="):
        BM25Config(b=1.5)


def test_settings_added_later_keep_older_config_hashes():
    """A setting added to a family after its outputs were in use changes no existing identity at its
    default (so --reuse, caches and indexes still match), and does once it is set."""
    import hashlib

    default = BM25Config()
    values = {k: v for k, v in default.to_dict().items() if k != "analyzer"}
    before = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert default.hash() == before
    assert BM25Config(analyzer="english").hash() != before


def test_cli_fit_bm25_with_analyzer_and_refusals(tmp_path, capfd):
    from cli_helpers import invoke

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("rocket launches from the pad\nthe weather report\n", encoding="utf-8")
    out = tmp_path / "m"
    fitted = invoke(capfd, "-q", "fit", "bm25", corpus, "-o", out, "--analyzer", "english", "--k1", "1.5")
    assert fitted.code == 0, fitted.err
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["analyzer"], config["k1"], config["b"]) == ("english", 1.5, 0.75)
    wrong = invoke(capfd, "-q", "fit", "tfidf", corpus, "-o", tmp_path / "t", "--k1", "1")
    assert wrong.code != 0 and "--k1 applies to bm25 only" in wrong.err
    unknown = invoke(capfd, "-q", "fit", "bm25", corpus, "-o", tmp_path / "u", "--analyzer", "klingon")
    assert unknown.code != 0 and "analyzer" in unknown.err
    assert not (tmp_path / "u").exists()


def test_rerank_with_tfidf_fitted_on_a_few_candidates_scores_the_exact_rows(tmp_path, capfd):
    """An LSA of two candidates has one dimension, where every cosine is +-1: `rerank -m tfidf` fitted on
    fewer candidates than its LSA size scores the exact tf-idf rows: the one with the query's word wins."""
    from cli_helpers import invoke

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": "cat", "candidates": ["a dog barked", "the cat slept"]}) + "\n")
    result = invoke(capfd, "rerank", tasks, "-m", "tfidf")
    assert result.code == 0, result.err
    ranking = json.loads(result.out)["ranking"]
    assert [r["text"] for r in ranking] == ["the cat slept", "a dog barked"]
    assert ranking[0]["score"] > 0.3 and ranking[1]["score"] == 0.0
    assert "exact tf-idf rows" in result.err


def test_rerank_with_tfidf_scores_the_exact_rows_whatever_the_number_of_candidates(tmp_path, capfd):
    """`rerank -m tfidf` is the rule `evaluate` and the results page measure, the cosine of the exact tf-idf
    rows, with more candidates than the LSA size (256) too: it used to score an LSA projection there, so the
    rule changed with the number of candidates. A folder fitted with `--svd-dim 0` scores the same rows
    (sparse, never a vocabulary-wide dense copy), in `rerank` and in `similarity`."""
    import random

    from cli_helpers import invoke

    rng = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    candidates = list(dict.fromkeys(" ".join(rng.choices(words, k=12)) for _ in range(300)))
    query = " ".join(rng.choices(words, k=6))
    rows = TfidfEncoder(TfidfConfig(svd_dim=0)).fit(candidates).encode_sparse([query, *candidates])
    exact = (rows[1:] @ rows[0].T).toarray().ravel()
    assert np.sort(exact)[-10] > 0  # the query shares words with several candidates: a ranking to check

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": query, "candidates": candidates}) + "\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(candidates) + "\n")
    assert invoke(capfd, "-q", "fit", "tfidf", corpus, "-o", tmp_path / "exact", "--svd-dim", "0").code == 0
    for model in ("tfidf", tmp_path / "exact"):
        result = invoke(capfd, "rerank", tasks, "-m", model)
        assert result.code == 0, result.err
        scores = {r["text"]: r["score"] for r in json.loads(result.out)["ranking"]}
        np.testing.assert_allclose([scores[c] for c in candidates], exact, atol=2e-6)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text1": query, "text2": c}) + "\n" for c in candidates[:20]))
    result = invoke(capfd, "similarity", "--pairs", pairs, "-m", tmp_path / "exact")
    assert result.code == 0, result.err
    paired = [json.loads(line)["score"] for line in result.out.splitlines()]
    np.testing.assert_allclose(paired, exact[:20], atol=2e-6)
