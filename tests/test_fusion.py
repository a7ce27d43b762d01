"""Fusion of a lexical scorer and a docembed model (`bm25+MODEL`): per-query normalisation, the weight
chosen on validation queries, saved and reloaded exactly, and the commands and tasks that use it."""

import json

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.models.fusion import FusionScorer, choose_weight, fit_fusion, normalize_rows
from docembed.models.registry import load_model

DOCS = [
    "the cat sat on the mat and purred at the dog",
    "dogs chase cats across the park every morning",
    "the central bank raised interest rates again this year",
    "python is a programming language with a large standard library",
    "stock markets fell sharply after the bank announcement",
    "a kitten and a puppy played in the garden",
]
QUERIES = ["a cat on a mat", "interest rates and the bank", "programming in python", "puppy in a garden"]
ANSWERS = [0, 2, 3, 5]


@pytest.fixture
def fusion(tiny_sbert_dir):
    model = load_model(f"bm25+{tiny_sbert_dir}")
    assert isinstance(model, FusionScorer) and model.requires_fit
    return model.fit(DOCS)


def test_zscore_is_per_query():
    scores = np.array([[1.0, 2.0, 3.0], [10.0, 10.0, 10.0], [0.0, 0.0, 4.0]])
    z = normalize_rows(scores, "zscore")
    s = np.sqrt(2.0 / 3.0)
    np.testing.assert_allclose(z[0], [-1 / s, 0.0, 1 / s])
    np.testing.assert_array_equal(z[1], [0.0, 0.0, 0.0])  # no spread: no signal, not a division by zero
    np.testing.assert_allclose(z[2], [-1 / np.sqrt(2), -1 / np.sqrt(2), np.sqrt(2)])
    np.testing.assert_allclose(normalize_rows(scores, "minmax")[0], [0.0, 0.5, 1.0])


def test_a_spread_within_rounding_is_no_spread(fusion):
    """Identical candidates score a few 1e-8 apart through a matrix product: that is not a ranking."""
    noisy = np.array([[0.5, 0.5 + 3e-8, 0.5 - 2e-8, 0.5 + 1e-8]])
    for method in ("zscore", "minmax"):
        np.testing.assert_array_equal(normalize_rows(noisy, method), np.zeros_like(noisy))
    real = np.array([[0.5, 0.5 + 1e-3, 0.5]])  # a small real spread still normalises
    np.testing.assert_allclose(normalize_rows(real, "minmax"), [[0.0, 1.0, 0.0]])
    copies = [DOCS[0]] * 6
    scores = fusion.fit(copies).score(QUERIES[0], copies)
    np.testing.assert_array_equal(scores, np.zeros(6))


def test_fused_scores_of_a_query_do_not_depend_on_the_other_queries(fusion):
    together = fusion.score_matrix(QUERIES, DOCS)
    for row, query in enumerate(QUERIES):
        np.testing.assert_allclose(together[row], fusion.score(query, DOCS), atol=1e-4)  # batching noise
    lexical, model = fusion.part_scores(QUERIES, DOCS)
    expected = 0.5 * normalize_rows(lexical, "zscore") + 0.5 * normalize_rows(model, "zscore")
    np.testing.assert_allclose(together, expected)


def test_rrf_option():
    np.testing.assert_allclose(normalize_rows([[0.2, 0.9, 0.5]], "rrf", 60), [[1 / 63, 1 / 61, 1 / 62]])
    np.testing.assert_allclose(normalize_rows([[0.2, 0.9, 0.5]], "rrf", 0), [[1 / 3, 1 / 1, 1 / 2]])
    # ties keep input order, as every ranking here does
    np.testing.assert_allclose(normalize_rows([[1.0, 1.0]], "rrf", 0), [[1.0, 0.5]])


def test_rrf_fusion_scores(tiny_sbert_dir):
    model = load_model(f"bm25+{tiny_sbert_dir}")
    model.config.normalization, model.config.rrf_k, model.config.weight = "rrf", 10, 0.25
    model.fit(DOCS)
    lexical, dense = model.part_scores(QUERIES[:1], DOCS)

    def rrf(row):
        ranks = np.empty(len(row))
        ranks[np.argsort(-row, kind="stable")] = np.arange(1, len(row) + 1)
        return 1.0 / (10 + ranks)

    expected = 0.75 * rrf(lexical[0]) + 0.25 * rrf(dense[0])
    np.testing.assert_allclose(model.score(QUERIES[0], DOCS), expected, rtol=1e-6)


@pytest.mark.parametrize("normalization", ["zscore", "minmax", "rrf"])
def test_weight_0_and_1_rank_as_each_part_alone(fusion, normalization):
    from docembed.scoring import rank

    fusion.config.normalization = normalization
    lexical, dense = fusion.part_scores(QUERIES, DOCS)
    for weight, part in ((0.0, lexical), (1.0, dense)):
        fused = fusion.score_matrix(QUERIES, DOCS, weight=weight)
        for row in range(len(QUERIES)):
            assert list(rank(fused[row])) == list(rank(part[row])), (weight, row)
    # and the parts disagree somewhere, so the two checks above test different things
    assert any(list(rank(lexical[r])) != list(rank(dense[r])) for r in range(len(QUERIES)))


def test_choose_weight_follows_the_part_that_is_right():
    # the lexical part finds every answer (index 0), the model part puts it last
    lexical = [np.array([[3.0, 1.0, 0.0, 0.5]])] * 3
    model = [np.array([[0.1, 0.9, 0.8, 0.7]])] * 3
    weight, table = choose_weight(lexical, model, [0, 0, 0])
    assert weight < 0.5 and table[0.0] == 100.0 and table[1.0] == 25.0
    weight, _ = choose_weight(model, lexical, [0, 0, 0])
    assert weight > 0.5


def test_saved_fusion_reloads_with_identical_scores(fusion, tmp_path, tiny_sbert_dir):
    validation = [(q, DOCS, a) for q, a in zip(QUERIES, ANSWERS, strict=True)]
    choice = fit_fusion(fusion, None, validation)
    assert set(choice["mrr_by_weight"]) >= {0.0, 0.5, 1.0} and fusion.config.chosen_on
    fusion.config.weight = 0.35  # not the default, so a reload that lost it gives other scores
    directory = tmp_path / "fused"
    from docembed.models.base import save_encoder

    save_encoder(fusion, directory)
    config = json.loads((directory / "config.json").read_text())
    assert config["family"] == "fusion" and config["config"]["weight"] == 0.35
    assert config["config"]["lexical"] == "lexical" and (directory / "lexical" / "config.json").is_file()
    assert config["config"]["model"] == str(tiny_sbert_dir.resolve())  # a folder part: by path
    assert not list(directory.rglob("*.pkl")) and not list(directory.rglob("*.pickle"))
    loaded = load_model(str(directory))
    assert isinstance(loaded, FusionScorer) and not loaded.requires_fit
    assert loaded.config.to_dict() == fusion.config.to_dict()
    np.testing.assert_array_equal(loaded.score_matrix(QUERIES, DOCS), fusion.score_matrix(QUERIES, DOCS))
    assert not np.allclose(loaded.score_matrix(QUERIES, DOCS), fusion.score_matrix(QUERIES, DOCS, weight=0.5))
    # a single pair uses the statistics saved with the weight
    pair = loaded.pair_scores(QUERIES[:2], DOCS[:2])
    np.testing.assert_array_equal(pair, fusion.pair_scores(QUERIES[:2], DOCS[:2]))
    stats = loaded.config.pair_stats
    lexical, dense = loaded.part_scores(QUERIES[1:2], DOCS[1:2])
    expected = (
        0.65 * (lexical[0, 0] - stats["lexical"]["mean"]) / stats["lexical"]["std"]
        + 0.35 * (dense[0, 0] - stats["model"]["mean"]) / stats["model"]["std"]
    )
    assert pair[1] == pytest.approx(expected, abs=1e-5)


def test_python_api_loads_a_fusion_folder(fusion, tmp_path):
    import docembed

    fusion.config.weight = 0.6
    fusion.save(tmp_path / "f")
    model = docembed.load(str(tmp_path / "f"), device="cpu")
    assert "scorer" in repr(model)
    scores = model.similarity(QUERIES, DOCS)
    np.testing.assert_allclose(scores, fusion.score_matrix(QUERIES, DOCS), rtol=1e-6, atol=1e-6)


def test_halves_task_runs_a_fusion_and_weight_0_is_bm25(fusion):
    from docembed.evaluation.base import EvalOptions
    from docembed.evaluation.long_documents import Halves

    documents = [d + " " + d.upper().lower() for d in DOCS]
    task = Halves(documents, EvalOptions(cache=False))
    bm25 = load_model("bm25").fit(documents)
    fused = task.run(fusion.fit(documents)).score
    fusion.config.weight = 0.0
    assert task.run(fusion).score == task.run(bm25).score
    assert 0.0 < fused <= 100.0


@pytest.mark.parametrize("first", ["bm25", "a model"])
def test_cli_fit_fusion_then_rerank_with_the_folder(
    capfd, tmp_path, tiny_sbert_dir, tiny_sbert_tokens_dir, first
):
    parts = ("bm25", tiny_sbert_dir) if first == "bm25" else (tiny_sbert_dir, tiny_sbert_tokens_dir)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(DOCS)))
    validation = tmp_path / "val.jsonl"
    validation.write_text(
        "".join(
            json.dumps({"query": q, "candidates": DOCS, "answer": a}) + "\n"
            for q, a in zip(QUERIES, ANSWERS, strict=True)
        )
    )
    out = tmp_path / "fusion"
    result = invoke(
        capfd, "fit", "fusion", corpus, "--lexical", parts[0], "-m", parts[1],
        "--validation", validation, "-o", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "chosen on 4 queries" in result.err
    loaded = load_model(str(out))
    assert loaded.hybrid == (first == "bm25")
    assert loaded.config.long_query_weight is None  # token vectors do not make a query long
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"query": q, "candidates": DOCS}) + "\n" for q in QUERIES))
    result = invoke(capfd, "rerank", tasks, "-m", out)
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert len(rows) == len(QUERIES)
    for row, query in zip(rows, QUERIES, strict=True):
        expected = loaded.score(query, DOCS)
        assert [r["text"] for r in row["ranking"]] == [DOCS[i] for i in np.argsort(-expected, kind="stable")]
        # computed floats: the last of 6 decimals may differ on another CPU (1.197094 vs 1.197093)
        ranked_scores = sorted((float(s) for s in expected), reverse=True)
        assert [r["score"] for r in row["ranking"]] == pytest.approx(ranked_scores, abs=1e-5)
    # a pair: scored with the saved statistics
    result = invoke(capfd, "similarity", QUERIES[0], DOCS[0], "-m", out)
    assert result.code == 0 and float(result.out) == pytest.approx(
        loaded.pair_scores([QUERIES[0]], [DOCS[0]])[0], abs=1e-5
    )
    # the Python API scores a text against one other text the same way (not 0, a one-candidate z-score)
    import docembed

    api = docembed.load(str(out)).similarity(QUERIES[:2], DOCS[0])
    assert api.shape == (2, 1)
    np.testing.assert_allclose(api[:, 0], loaded.pair_scores(QUERIES[:2], DOCS[:1] * 2), atol=1e-5)
    assert float(result.out) == pytest.approx(float(api[0, 0]), abs=1e-5)


def test_cli_fit_fusion_applies_the_lexical_parts_options(capfd, tmp_path, tiny_sbert_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(DOCS)))
    out = tmp_path / "bm25-fusion"
    result = invoke(
        capfd, "fit", "fusion", corpus, "--lexical", "bm25", "-m", tiny_sbert_dir, "--weight", "0.3",
        "--k1", "2.5", "--b", "0.1", "--analyzer", "english", "-o", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    saved = json.loads((out / "lexical" / "config.json").read_text())["config"]
    assert (saved["k1"], saved["b"], saved["analyzer"]) == (2.5, 0.1, "english")
    out = tmp_path / "tfidf-fusion"
    result = invoke(
        capfd, "fit", "fusion", corpus, "--lexical", "tfidf", "-m", tiny_sbert_dir, "--weight", "0.3",
        "--ngram-max", "2", "-o", out,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert json.loads((out / "lexical" / "config.json").read_text())["config"]["ngram_max"] == 2
    # an option of another rule, or of a first part that is a model, is refused before anything loads
    for lexical, option in (
        ("bm25", ["--svd-dim", "4"]),
        ("tfidf", ["--k1", "2"]),
        (tiny_sbert_dir, ["--b", "0.5"]),
    ):
        result = invoke(
            capfd, "fit", "fusion", corpus, "--lexical", lexical, "-m", tiny_sbert_dir, "--weight", "0.3",
            *option, "-o", tmp_path / "refused",
        )  # fmt: skip
        assert result.code != 0 and "applies to" in result.err and not (tmp_path / "refused").exists()
    bad = tmp_path / "val.jsonl"
    bad.write_text(json.dumps({"query": "a cat", "candidates": DOCS, "answer": 9}) + "\n")
    result = invoke(
        capfd, "fit", "fusion", corpus, "-m", tiny_sbert_dir, "--validation", bad, "-o", tmp_path / "refused"
    )
    assert result.code != 0 and "'answer' must be the index" in result.err
    result = invoke(
        capfd, "fit", "fusion", corpus, "-m", "no-such-model", "--validation", bad, "-o", tmp_path / "refused"
    )
    assert result.code != 0 and "unknown model 'no-such-model'" in result.err


def test_cli_rerank_a_plain_spec_fits_bm25_on_the_candidates(capfd, tmp_path, tiny_sbert_dir):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"query": q, "candidates": DOCS}) + "\n" for q in QUERIES))
    result = invoke(capfd, "rerank", tasks, "-m", f"bm25+{tiny_sbert_dir}")
    assert result.code == 0, result.err
    assert f"fitted on the {len(DOCS)} candidate documents" in result.err and "default" in result.err
    first = json.loads(result.out.splitlines()[0])
    expected = load_model(f"bm25+{tiny_sbert_dir}").fit(DOCS).score(QUERIES[0], DOCS)
    assert first["ranking"][0]["text"] == DOCS[int(np.argmax(expected))]
    # a single pair has no candidates to normalise over: a plain spec says what to do instead
    result = invoke(capfd, "similarity", "a", "b", "-m", f"bm25+{tiny_sbert_dir}")
    assert result.code != 0 and "fit fusion" in result.err
    import docembed

    with pytest.raises(docembed.DocembedError, match="fit fusion"):  # the API too, not a score of 0
        docembed.load(f"bm25+{tiny_sbert_dir}").similarity("a", "b")


def test_a_fitted_tfidf_folder_and_a_multi_vector_model(tmp_path, tiny_tfidf_dir, tiny_sbert_tokens_dir):
    from docembed.scoring import maxsim_one_to_many, rank

    docs = [" ".join(f"w{i + j}" for j in range(6)) for i in range(0, 40, 5)]
    fusion = load_model(f"{tiny_tfidf_dir}+{tiny_sbert_tokens_dir}")
    assert not fusion.requires_fit and fusion.model.multi_vector  # a fitted folder is used as it is
    queries = ["w1 w2", "w30 w31 w32"]
    vectors = fusion.model.encode(queries + docs)
    for row, query in enumerate(queries):
        maxsim = maxsim_one_to_many(vectors[row], vectors.select(list(range(2, 2 + len(docs)))))
        assert list(rank(fusion.score_matrix([query], docs, weight=1.0)[0])) == list(rank(maxsim))
    # weight 0 scores as the tfidf model itself does: its own (LSA) vectors, not another representation
    from docembed.models.fusion import normalize_rows

    tfidf = load_model(tiny_tfidf_dir)
    assert tfidf.components is not None  # this folder projects (svd_dim)
    own = tfidf.encode(queries) @ tfidf.encode(docs).T
    np.testing.assert_allclose(
        fusion.score_matrix(queries, docs, weight=0.0), normalize_rows(own, "zscore"), atol=1e-5
    )
    fusion.config.weight = 0.3
    fusion.save(tmp_path / "f")
    np.testing.assert_array_equal(
        load_model(str(tmp_path / "f")).score_matrix(queries, docs), fusion.score_matrix(queries, docs)
    )


def test_tfidf_bigrams_ranks_by_word_pairs_alone_and_as_a_fusions_lexical_side(tiny_sbert_dir):
    # the same words in another order: word tf-idf cannot tell the two apart, word pairs can
    docs = ["york new and the city", "new york and the city", "a harbour city by the sea"]
    words = load_model("tfidf").fit(docs).encode_sparse(["new york"])
    pairs = load_model("tfidf-bigrams")
    assert pairs.requires_fit and pairs.config.ngram_max == 2
    with pytest.raises(Exception, match="--ngram-max 2"):  # what to run, with the option that makes it
        pairs.encode(["new york"])
    plain = (words @ load_model("tfidf").fit(docs).encode_sparse(docs).T).toarray()[0]
    assert plain[0] == pytest.approx(plain[1])
    fusion = load_model(f"tfidf-bigrams+{tiny_sbert_dir}").fit(docs)
    assert fusion.lexical.config.svd_dim == 0  # the exact rows of the rule the weights were chosen with
    lexical, _ = fusion.part_scores(["new york"], docs)
    assert lexical[0, 1] > lexical[0, 0] > lexical[0, 2]
    assert list(np.argsort(-fusion.score_matrix(["new york"], docs, weight=0.0)[0])) == [1, 0, 2]


def test_a_fusion_of_two_models_fuses_each_ones_own_scores(tmp_path, tiny_sbert_dir, tiny_sbert_tokens_dir):
    """`MODEL+MODEL` (`student-passages+nugget-passages`): no lexical part and nothing to fit; the first
    model's scores (by its own vectors and scoring) take the lexical part's place, and a saved fusion names
    both models and reloads with the same scores."""
    from docembed.scoring import passage_scoring, score_matrix

    fusion = load_model(f"{tiny_sbert_dir}+{tiny_sbert_tokens_dir}")
    assert isinstance(fusion, FusionScorer) and not fusion.hybrid and not fusion.requires_fit
    fusion.config.weight = 0.3
    parts = []
    for model in (load_model(str(tiny_sbert_dir)), load_model(str(tiny_sbert_tokens_dir))):
        scores = score_matrix(model.encode(QUERIES), model.encode(DOCS), *passage_scoring(model))
        parts.append(normalize_rows(scores, "zscore"))
    assert not np.allclose(parts[0], parts[1])  # two rankings, so the weight matters
    np.testing.assert_allclose(fusion.score_matrix(QUERIES, DOCS), 0.7 * parts[0] + 0.3 * parts[1], atol=1e-5)
    assert fusion.fit(DOCS) is fusion and not fusion.requires_fit  # a corpus changes nothing

    validation = [(q, DOCS, a) for q, a in zip(QUERIES, ANSWERS, strict=True)]
    fit_fusion(fusion, None, validation)
    fusion.save(tmp_path / "f")
    config = json.loads((tmp_path / "f" / "config.json").read_text())["config"]
    assert config["lexical"] == str(tiny_sbert_dir.resolve()) and not (tmp_path / "f" / "lexical").exists()
    loaded = load_model(str(tmp_path / "f"))
    assert not loaded.hybrid and loaded.config.to_dict() == fusion.config.to_dict()
    np.testing.assert_array_equal(loaded.score_matrix(QUERIES, DOCS), fusion.score_matrix(QUERIES, DOCS))
    np.testing.assert_array_equal(
        loaded.pair_scores(QUERIES[:2], DOCS[:2]), fusion.pair_scores(QUERIES[:2], DOCS[:2])
    )


def test_a_fusions_parts_are_a_lexical_rule_or_a_model_then_a_model(fusion, tiny_sbert_dir):
    from docembed.errors import UsageError
    from docembed.models.fusion import FusionConfig

    with pytest.raises(UsageError, match="first part of a fusion is a lexical model .* or a model with"):
        FusionScorer(FusionConfig(), fusion, load_model(str(tiny_sbert_dir)))  # a fusion is no first part
    with pytest.raises(UsageError, match="second part of a fusion is a model with embeddings"):
        load_model(f"{tiny_sbert_dir}+bm25")


def test_long_document_task_fuses_retrieval_and_probes_the_model_part(fusion):
    from docembed.evaluation.base import EvalOptions
    from docembed.evaluation.long_documents import IMDBLong

    labels = [0, 0, 1, 1, 0, 1]
    rows = [{"text": d, "label": y} for d, y in zip(DOCS, labels, strict=True)]
    task = IMDBLong(DOCS * 2, labels * 2, rows, EvalOptions(cache=False))
    result = task.run(fusion)
    alone = task.run(fusion.model)
    assert result.metrics["accuracy"] == alone.metrics["accuracy"]  # the probe: the model part's features
    assert any("fusion's model part" in note for note in result.notes)
    fusion.config.weight = 1.0  # retrieval fused: at weight 1, the model's own ranking
    assert task.run(fusion).metrics["map@100"] == pytest.approx(alone.metrics["map@100"])


@pytest.mark.parametrize("storage", ["flat", "multi"])
def test_hybrid_search_ranks_as_the_fusion_reranks_the_whole_corpus(
    capfd, tmp_path, tiny_sbert_dir, tiny_sbert_tokens_dir, storage
):
    """`search INDEX --lexical-index BM25 -m bm25+MODEL`: with --depth covering the corpus, every document is
    a candidate, so the fused ranking is the fusion's own over all of them; a small depth keeps only hits of
    either index, each scored by both parts."""
    model = tiny_sbert_dir if storage == "flat" else tiny_sbert_tokens_dir
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    assert invoke(capfd, "encode", corpus, "-m", model, "-o", tmp_path / "e.npz").code == 0
    assert invoke(capfd, "index", "build", tmp_path / "e.npz", "-o", tmp_path / "dense").code == 0
    assert invoke(capfd, "index", "build", corpus, "-t", "bm25", "-o", tmp_path / "bm25").code == 0
    args = ["search", tmp_path / "dense", "--lexical-index", tmp_path / "bm25", "-m", f"bm25+{model}"]
    result = invoke(capfd, *args, *[x for q in QUERIES for x in ("--query", q)], "-k", "3", "--depth", "50")
    assert result.code == 0, result.err
    fusion = load_model(f"bm25+{model}").fit(DOCS)
    for line, query in zip(result.out.splitlines(), QUERIES, strict=True):
        expected = fusion.score(query, DOCS)
        order = np.argsort(-expected, kind="stable")[:3]
        hits = json.loads(line)["results"]
        assert [h["id"] for h in hits] == [f"d{i}" for i in order]
        assert [h["score"] for h in hits] == pytest.approx([float(expected[i]) for i in order], abs=1e-5)

    # depth 1: the candidates are the top hit of each index, no other document
    def top(*search_args):
        return json.loads(invoke(capfd, "search", *search_args, "-k", "1").out)["results"][0]["id"]

    for query in QUERIES:
        tops = {top(tmp_path / "dense", "--query", query), top(tmp_path / "bm25", "--query", query)}
        shallow = json.loads(invoke(capfd, *args, "--query", query, "-k", "1", "--depth", "1").out)["results"]
        assert len(shallow) == 1 and shallow[0]["id"] in tops


def test_hybrid_search_refusals(capfd, tmp_path, tiny_sbert_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    assert invoke(capfd, "encode", corpus, "-m", tiny_sbert_dir, "-o", tmp_path / "e.npz").code == 0
    assert invoke(capfd, "index", "build", tmp_path / "e.npz", "-o", tmp_path / "dense").code == 0
    assert invoke(capfd, "index", "build", corpus, "-t", "bm25", "-o", tmp_path / "bm25").code == 0
    plain = invoke(
        capfd, "search", tmp_path / "dense", "--lexical-index", tmp_path / "bm25", "--query", "cat"
    )
    assert plain.code != 0 and "LEXICAL+MODEL" in plain.err
    no_index = invoke(capfd, "search", tmp_path / "dense", "-m", f"bm25+{tiny_sbert_dir}", "--query", "cat")
    assert no_index.code != 0 and "--lexical-index" in no_index.err
    swapped = invoke(
        capfd, "search", tmp_path / "bm25", "--lexical-index", tmp_path / "dense", "--query", "x"
    )
    assert swapped.code != 0 and "bm25 index" in swapped.err
    two_models = invoke(
        capfd,
        *("search", tmp_path / "dense", "--lexical-index", tmp_path / "bm25", "--query", "cat"),
        *("-m", f"{tiny_sbert_dir}+{tiny_sbert_dir}"),
    )
    assert two_models.code != 0 and "fuses two models" in two_models.err


def test_a_corpus_fitted_second_part_is_fitted_on_the_documents(capfd, tmp_path, tiny_sbert_dir):
    """`MODEL+pv` (`retriever+pv`): Paragraph Vectors fitted, as a lexical part is, on the documents
    the fusion is fitted on, the same model every time (one thread), refitted on each new set of documents;
    a saved fusion keeps its fitted PV inside and reloads with the same scores."""
    from docembed.errors import ModelNotFoundError, UsageError
    from docembed.models.registry import resolve_model
    from docembed.scoring import cosine_matrix
    from docembed.types import texts_hash

    assert resolve_model("retriever+pv").parts[1].kind == "fitted"  # found before anything loads
    with pytest.raises(ModelNotFoundError, match="train-pv"):  # alone, pv is still trained by the user
        resolve_model("pv")
    fusion = load_model(f"{tiny_sbert_dir}+pv")
    assert isinstance(fusion, FusionScorer) and fusion.requires_fit and not fusion.hybrid
    with pytest.raises(UsageError, match="pv in a fusion is fitted on the documents first"):
        fusion.score_matrix(QUERIES, DOCS)
    assert fusion.fit(DOCS) is fusion and not fusion.requires_fit
    pv = fusion.model
    assert pv.family == "pv" and pv.fitted_on == texts_hash(DOCS)
    sbert = load_model(str(tiny_sbert_dir))
    first = normalize_rows(cosine_matrix(sbert.encode(QUERIES), sbert.encode(DOCS)), "zscore")
    second = normalize_rows(cosine_matrix(pv.encode(QUERIES), pv.encode(DOCS)), "zscore")
    assert not np.allclose(first, second)
    scores = fusion.score_matrix(QUERIES, DOCS)
    np.testing.assert_allclose(scores, 0.5 * first + 0.5 * second, atol=1e-5)
    again = load_model(f"{tiny_sbert_dir}+pv").fit(DOCS)
    np.testing.assert_array_equal(again.score_matrix(QUERIES, DOCS), scores)  # reproducible
    fusion.fit(DOCS[:4] + QUERIES)  # other documents: fitted anew on them
    assert fusion.model is not pv and fusion.model.fitted_on == texts_hash(DOCS[:4] + QUERIES)

    again.save(tmp_path / "f")
    assert json.loads((tmp_path / "f" / "config.json").read_text())["config"]["model"] == "model"
    loaded = load_model(str(tmp_path / "f"))
    assert not loaded.requires_fit and loaded.model.family == "pv"
    np.testing.assert_allclose(loaded.score_matrix(QUERIES, DOCS), scores, atol=1e-6)
    loaded.fit(QUERIES)  # a saved fusion keeps the PV it was saved with
    np.testing.assert_allclose(loaded.score_matrix(QUERIES, DOCS), scores, atol=1e-6)

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"query": q, "candidates": DOCS}) + "\n" for q in QUERIES))
    result = invoke(capfd, "rerank", tasks, "-m", f"{tiny_sbert_dir}+pv")
    assert result.code == 0, result.err
    assert f"pv fitted on the {len(DOCS)} candidate documents" in result.err
    top = [json.loads(line)["ranking"][0]["text"] for line in result.out.splitlines()]
    assert top == [DOCS[int(np.argmax(row))] for row in scores]

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(DOCS)))
    out = tmp_path / "fitted"
    result = invoke(
        capfd, "fit", "fusion", corpus, "--lexical", tiny_sbert_dir, "-m", "pv", "--weight", "0.5", "-o", out
    )
    assert result.code == 0, result.err
    np.testing.assert_allclose(load_model(str(out)).score_matrix(QUERIES, DOCS), scores, atol=1e-6)
