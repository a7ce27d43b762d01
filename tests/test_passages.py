"""Passage scoring (#45): a document scored through its passages (sbert's windows, the student's late
chunks) with one pooling setting, `passage_temperature` (0 the best passage, larger towards their mean),
the same in the Python API, similarity, rerank, a fusion, encode's metadata and a search index; a BM25
index with the English analyzer."""

import importlib.util
import json

import numpy as np
import pytest

import docembed
from cli_helpers import encode_and_index, invoke
from docembed.models.base import NotSupportedError
from docembed.scoring import LONG_QUERY_PASSAGES, maxsim_one_to_many

QUERY = "the cat sat on the mat"
# long enough for several of the tiny model's windows each, with one part about the query
DOCS = [
    "stocks fell sharply today " * 12 + "the cat sat on the mat " + "rates rose again " * 12,
    "a dog ran in the park " * 30,
    "the cat and the mat and the cat " * 25,
]


@pytest.fixture(scope="module")
def passages_dir(tiny_bert_dir, tmp_path_factory):
    """The tiny sbert model with the windows output and a smooth pooling of its windows, saved."""
    from tiny_models import save_tiny_sbert

    directory = save_tiny_sbert(tiny_bert_dir, tmp_path_factory.mktemp("passages"), output="windows")
    model = docembed.load(str(directory), device="cpu", passage_temperature=0.05)
    smooth = directory.parent / "smooth"
    model.save(smooth)
    return smooth


def expected_scores(model, temperature):
    vectors = model.encode([QUERY, *DOCS])
    return maxsim_one_to_many(vectors[0], vectors.select([1, 2, 3]), temperature)


def test_a_saved_temperature_is_used_by_similarity_and_round_trips(passages_dir):
    model = docembed.load(str(passages_dir), device="cpu")
    assert model.encoder.passage_temperature == 0.05
    scores = model.similarity([QUERY], DOCS)[0]
    np.testing.assert_allclose(scores, expected_scores(model, 0.05), rtol=1e-5)
    best = docembed.load(str(passages_dir), device="cpu", passage_temperature=0.0)
    assert not np.allclose(best.similarity([QUERY], DOCS)[0], scores)  # the max differs from its smooth form
    np.testing.assert_allclose(best.similarity([QUERY], DOCS)[0], expected_scores(model, 0.0), rtol=1e-5)


def test_only_a_passage_output_takes_a_temperature(tiny_sbert_dir):
    with pytest.raises(NotSupportedError, match="passage output"):
        docembed.load(str(tiny_sbert_dir), device="cpu", passage_temperature=0.1)  # one mean vector
    with pytest.raises(NotSupportedError, match="does not support"):
        docembed.load("glove-avg", device="cpu", passage_temperature=0.1)
    with pytest.raises(docembed.errors.UsageError, match="between 0"):
        docembed.load(str(tiny_sbert_dir), device="cpu", long_documents="windows", passage_temperature=-1)


def test_the_default_keeps_the_config_hash_older_outputs_were_written_with(passages_dir):
    """A model at the default pooling has the identity it had before the setting existed, so --reuse,
    caches and indexes of earlier runs still match; a smoothed one is another configuration."""
    default = docembed.load(str(passages_dir), device="cpu", passage_temperature=0.0).encoder
    values = default.config.to_dict()
    values.pop("passage_temperature")
    assert default.config.hash() == type(default.config)(**values).hash()
    assert "passage_temperature" not in default.metadata()
    smooth = docembed.load(str(passages_dir), device="cpu").encoder
    assert smooth.config.hash() != default.config.hash()
    assert smooth.metadata()["passage_temperature"] == 0.05


def test_similarity_rerank_and_a_fusion_score_as_the_api(capfd, tmp_path, passages_dir):
    model = docembed.load(str(passages_dir), device="cpu")
    expected = model.similarity([QUERY], DOCS)[0]
    pair = invoke(capfd, "similarity", QUERY, DOCS[0], "-m", passages_dir)
    assert pair.code == 0, pair.err
    assert float(pair.out.strip()) == pytest.approx(float(expected[0]), abs=1e-5)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": QUERY, "candidates": DOCS}) + "\n")
    ranked = invoke(capfd, "rerank", tasks, "-m", passages_dir)
    assert ranked.code == 0, ranked.err
    ranking = json.loads(ranked.out)["ranking"]
    by_text = {row["text"]: row["score"] for row in ranking}
    assert [by_text[d] for d in DOCS] == pytest.approx([float(s) for s in expected], abs=1e-5)
    from docembed.models.fusion import FusionScorer

    fusion = FusionScorer.from_parts("bm25", str(passages_dir), device="cpu").fit(DOCS)
    _, model_part = fusion.part_scores([QUERY], DOCS)
    np.testing.assert_allclose(model_part[0], expected, rtol=1e-5)


def test_encode_records_the_pooling_and_the_index_searches_with_it(capfd, tmp_path, passages_dir):
    encode_and_index(capfd, tmp_path, passages_dir, DOCS)
    meta = json.loads((tmp_path / "docs.index" / "meta.json").read_text())
    assert meta["passage_temperature"] == 0.05
    found = invoke(capfd, "search", tmp_path / "docs.index", "--query", QUERY, "-k", "3")
    assert found.code == 0, found.err
    hits = {h["id"]: h["score"] for h in json.loads(found.out)["results"]}
    expected = docembed.load(str(passages_dir), device="cpu").similarity([QUERY], DOCS)[0]
    assert [hits[f"d{i}"] for i in range(3)] == pytest.approx([float(s) for s in expected], abs=1e-5)


def test_encode_takes_the_pooling_as_an_option(capfd, tmp_path, tiny_sbert_dir, passages_dir):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(DOCS) + "\n")
    out = tmp_path / "v.npz"
    for model in (tiny_sbert_dir, "glove-avg"):  # one vector per document: no passages to pool
        refused = invoke(capfd, "encode", corpus, "-m", model, "-o", out, "--passage-temperature", "0.2")
        assert refused.code != 0 and "passage" in refused.err and not out.exists()
    done = invoke(capfd, "encode", corpus, "-m", passages_dir, "-o", out, "--passage-temperature", "0.2")
    assert done.code == 0, done.err
    from docembed.io.embeddings import load_embeddings

    assert load_embeddings(out).metadata["passage_temperature"] == 0.2


def test_bm25_index_with_the_english_analyzer(capfd, tmp_path):
    corpus = tmp_path / "docs.jsonl"
    rows = [("a", "the rocket launches at noon"), ("b", "weather report for the week")]
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    plain, english = tmp_path / "plain.index", tmp_path / "english.index"
    assert invoke(capfd, "index", "build", corpus, "--type", "bm25", "-o", plain).code == 0
    built = invoke(capfd, "index", "build", corpus, "--type", "bm25", "-o", english, "--analyzer", "english")
    assert built.code == 0, built.err
    assert json.loads((english / "meta.json").read_text())["config"]["analyzer"] == "english"
    assert json.loads(invoke(capfd, "search", plain, "--query", "launch").out)["results"] == []
    hits = json.loads(invoke(capfd, "search", english, "--query", "launched").out)["results"]
    assert [h["id"] for h in hits] == ["a"]
    wrong = invoke(capfd, "index", "build", corpus, "-o", tmp_path / "x", "--analyzer", "english")
    assert wrong.code != 0 and "--analyzer is for bm25" in wrong.err


def test_passage_spans_follow_the_vectors_encode_gives(passages_dir):
    model = docembed.load(str(passages_dir), device="cpu")
    texts = [*DOCS, "", "one short text"]
    spans = model.encoder.passage_spans(texts)
    vectors = model.encode(texts)
    assert [len(s) for s in spans] == vectors.counts.tolist()
    for text, rows in zip(texts, spans, strict=True):
        assert rows[0][0] <= rows[-1][1] <= len(text)
        assert np.all(rows[1:, 0] >= rows[:-1, 1])  # consecutive windows, no overlap by default
    assert spans[3].tolist() == [[0, 0]]  # an empty text: one empty passage
    assert texts[0][spans[0][0][0] : spans[0][-1][1]].strip() == texts[0].strip()


def test_the_best_passage_is_the_part_about_the_query(capfd, tmp_path, passages_dir):
    model = docembed.load(str(passages_dir), device="cpu")
    found = model.best_passages(QUERY, DOCS)
    vectors = model.encode([QUERY, DOCS[0]])
    sims = (vectors[0] / np.linalg.norm(vectors[0])) @ (
        vectors[1] / np.linalg.norm(vectors[1], axis=1)[:, None]
    ).T
    start, end = model.encoder.passage_spans([DOCS[0]])[0][int(np.argmax(sims.mean(axis=0)))]
    assert (found[0]["start"], found[0]["end"]) == (start, end)
    assert found[0]["text"] == DOCS[0][start:end] and found[0]["score"] == pytest.approx(sims.max(), abs=1e-5)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": QUERY, "candidates": DOCS}) + "\n")
    ranked = invoke(capfd, "rerank", tasks, "-m", passages_dir, "--passages")
    assert ranked.code == 0, ranked.err
    by_text = {row["text"]: row["passage"] for row in json.loads(ranked.out)["ranking"]}
    assert [by_text[d] for d in DOCS] == [[f["start"], f["end"]] for f in found]
    dense = invoke(capfd, "rerank", tasks, "-m", "glove-avg", "--passages")
    assert dense.code != 0 and "passages" in dense.err
    with pytest.raises(NotSupportedError):
        docembed.load("glove-avg", device="cpu").best_passages(QUERY, DOCS)
    # an empty document has no passage to name, in the API and in rerank
    assert model.best_passages(QUERY, ["", "   ", DOCS[0]])[:2] == [None, None]
    assert model.best_passages(QUERY, []) == []
    tasks.write_text(json.dumps({"query": QUERY, "candidates": ["", "   ", DOCS[0]]}) + "\n")
    ranked = invoke(capfd, "rerank", tasks, "-m", passages_dir, "--passages")
    by_text = {row["text"]: row["passage"] for row in json.loads(ranked.out)["ranking"]}
    assert by_text[""] is None and by_text["   "] is None and by_text[DOCS[0]] is not None


def test_a_fusion_ranks_by_its_score_and_names_the_passage_of_its_part_with_passages(
    capfd, tmp_path, passages_dir
):
    found = docembed.load(str(passages_dir), device="cpu").best_passages(QUERY, DOCS)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": QUERY, "candidates": DOCS}) + "\n")
    hybrid = f"tfidf+{passages_dir}"
    ranked = invoke(capfd, "rerank", tasks, "-m", hybrid, "--passages")
    assert ranked.code == 0, ranked.err
    plain = invoke(capfd, "rerank", tasks, "-m", hybrid)
    rows = json.loads(ranked.out)["ranking"]
    assert [(r["text"], r["score"]) for r in rows] == [
        (r["text"], r["score"]) for r in json.loads(plain.out)["ranking"]
    ]
    by_text = {row["text"]: row["passage"] for row in rows}
    assert [by_text[d] for d in DOCS] == [[f["start"], f["end"]] for f in found]
    for spec in (hybrid, f"{passages_dir}+glove-avg"):  # the model part, else the first model
        assert docembed.load(spec, device="cpu").best_passages(QUERY, DOCS) == found
    refused = invoke(capfd, "rerank", tasks, "-m", "tfidf+glove-avg", "--passages")
    assert refused.code != 0 and "or a fusion with one of them" in refused.err


def test_a_fusion_of_built_ins_uses_its_validated_weight_and_exact_tfidf():
    from docembed.models.fusion import DEFAULT_WEIGHT, VALIDATED_WEIGHTS
    from docembed.models.registry import load_model

    fusion = load_model("tfidf+sbert-windows")
    assert fusion.config.weight == VALIDATED_WEIGHTS["tfidf", "sbert-windows"] != DEFAULT_WEIGHT
    assert "long-document" in fusion.config.chosen_on
    fusion.fit(DOCS)
    assert fusion.lexical.components is None  # the exact tf-idf rows the weight was chosen with
    other = load_model("bm25+glove-avg")  # not validated: the default, and it says so
    assert other.config.weight == DEFAULT_WEIGHT and other.config.chosen_on is None


def test_long_queries_read_whole_in_the_api_encode_and_the_index(capfd, tmp_path, passages_dir):
    """`long_queries="whole"`: a query of many windows (a whole document here) is scored by the two texts'
    window means, a short query by its passages; encode records the setting and search scores with it."""
    model = docembed.load(str(passages_dir), device="cpu", long_queries="whole")
    assert model.encoder.long_queries == "whole" and model.encoder.metadata()["long_queries"] == "whole"
    vectors = model.encode([DOCS[2], QUERY, *DOCS])
    assert len(vectors[0]) >= LONG_QUERY_PASSAGES and len(vectors[1]) == 1  # a long and a short query
    docs = vectors.select([2, 3, 4])
    np.testing.assert_allclose(
        model.similarity([DOCS[2]], DOCS)[0], maxsim_one_to_many(vectors[0], docs, 0.05, "whole"), rtol=1e-5
    )
    assert not np.allclose(model.similarity([DOCS[2]], DOCS)[0], maxsim_one_to_many(vectors[0], docs, 0.05))
    np.testing.assert_allclose(
        model.similarity([QUERY], DOCS)[0], maxsim_one_to_many(vectors[1], docs, 0.05), rtol=1e-5
    )
    # the default keeps older outputs' identity; the setting is saved with the model
    default = docembed.load(str(passages_dir), device="cpu").encoder
    assert default.long_queries == "passages" and "long_queries" not in default.metadata()
    model.save(tmp_path / "whole")
    assert docembed.load(str(tmp_path / "whole"), device="cpu").encoder.long_queries == "whole"
    # encode --long-queries: recorded beside the vectors and in the index, which searches with it
    encode_and_index(capfd, tmp_path, passages_dir, DOCS, "--long-queries", "whole")
    assert json.loads((tmp_path / "docs.index" / "meta.json").read_text())["long_queries"] == "whole"
    found = invoke(capfd, "search", tmp_path / "docs.index", "--query", DOCS[2], "-k", "3")
    assert found.code == 0, found.err
    hits = {h["id"]: h["score"] for h in json.loads(found.out)["results"]}
    expected = model.similarity([DOCS[2]], DOCS)[0]
    assert [hits[f"d{i}"] for i in range(3)] == pytest.approx([float(s) for s in expected], abs=1e-5)


def test_long_queries_is_checked_before_a_model_loads(capfd, tmp_path, tiny_sbert_dir):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(DOCS) + "\n")
    out = tmp_path / "v.npz"
    bad = invoke(capfd, "encode", corpus, "-m", "sbert-windows", "-o", out, "--long-queries", "mean")
    assert bad.code == 2 and "long_queries is one of passages, whole" in bad.err and not out.exists()
    refused = invoke(capfd, "encode", corpus, "-m", tiny_sbert_dir, "-o", out, "--long-queries", "whole")
    assert refused.code != 0 and "passage output" in refused.err and not out.exists()
    with pytest.raises(NotSupportedError, match="does not support"):
        docembed.load("glove-avg", device="cpu", long_queries="whole")


def test_a_fusion_weighs_a_long_query_with_its_own_weight(
    passages_dir, tiny_sbert_dir, tmp_path, monkeypatch
):
    """`long_query_weight`: a long query (many passages: a half) and a short one, each fused with its kind's
    weight, in rerank scores, single pairs, a saved fusion, `fit_fusion` and a validated built-in pair."""
    from docembed.models import fusion as fusion_module
    from docembed.models.fusion import FusionScorer, fit_fusion, normalize_rows

    fusion = FusionScorer.from_parts("bm25", str(passages_dir), weight=0.2, long_query_weight=0.9).fit(DOCS)
    queries = [DOCS[2], QUERY]  # a long query and a short one
    lexical, model = (normalize_rows(x, "zscore") for x in fusion.part_scores(queries, DOCS))
    expected = np.stack([0.1 * lexical[0] + 0.9 * model[0], 0.8 * lexical[1] + 0.2 * model[1]])
    np.testing.assert_allclose(fusion.score_matrix(queries, DOCS), expected, rtol=1e-6)
    assert fusion.weights_text() == "0.2, 0.9 for long queries"  # what rerank and fit fusion log
    assert "long_queries" not in json.loads(
        json.dumps(fusion.metadata())
    )  # a scorer's, not a passage model's
    one_weight = FusionScorer.from_parts("bm25", str(passages_dir), weight=0.2).fit(DOCS)
    assert not np.allclose(one_weight.score_matrix(queries, DOCS)[0], expected[0])
    np.testing.assert_allclose(one_weight.score_matrix(queries, DOCS)[1], expected[1], rtol=1e-6)
    # fit_fusion: one weight per kind when the validation queries hold both; one weight otherwise
    validation = [(DOCS[2], DOCS, 2), (QUERY, DOCS, 0), ("a dog in the park", DOCS, 1)]
    choice = fit_fusion(fusion, None, validation)
    assert choice["long_queries"] == 1 and fusion.config.long_query_weight == choice["long_query_weight"]
    assert fusion.config.weight == choice["weight"] and set(choice["mrr_by_kind_and_weight"]["long"]) >= {
        0.0,
        1.0,
    }
    assert fit_fusion(one_weight, None, validation[1:]).get("long_query_weight") is None
    assert one_weight.config.long_query_weight is None
    # saved and reloaded with both weights; single pairs take their left text's kind
    fusion.config.weight, fusion.config.long_query_weight = 0.2, 0.9
    fusion.save(tmp_path / "fused")
    loaded = docembed.load(str(tmp_path / "fused"), device="cpu").encoder
    assert (loaded.config.weight, loaded.config.long_query_weight) == (0.2, 0.9)
    np.testing.assert_allclose(loaded.score_matrix(queries, DOCS), expected, rtol=1e-6)
    stats, pairs = loaded.config.pair_stats, loaded.part_scores(queries, DOCS[:1])
    z = [(pairs[i][:, 0] - stats[k]["mean"]) / stats[k]["std"] for i, k in enumerate(("lexical", "model"))]
    np.testing.assert_allclose(
        loaded.pair_scores(queries, DOCS[:1] * 2),
        [0.1 * z[0][0] + 0.9 * z[1][0], 0.8 * z[0][1] + 0.2 * z[1][1]],
        rtol=1e-5,
    )
    # a validated built-in pair gets both weights; a model of one vector per text has no long queries
    monkeypatch.setitem(fusion_module.VALIDATED_WEIGHTS, ("bm25", str(passages_dir)), 0.55)
    monkeypatch.setitem(fusion_module.VALIDATED_LONG_QUERY_WEIGHTS, ("bm25", str(passages_dir)), 0.9)
    validated = FusionScorer.from_parts("bm25", str(passages_dir))
    assert (validated.config.weight, validated.config.long_query_weight) == (0.55, 0.9)
    with pytest.raises(NotSupportedError, match="long-query weight"):
        FusionScorer.from_parts("bm25", str(tiny_sbert_dir), long_query_weight=0.9)


def test_hybrid_search_fuses_a_long_query_with_its_own_weight(capfd, tmp_path, passages_dir):
    """`search --lexical-index` (faiss + bm25) and a Lance collection's fused search weigh a long query and a
    short one each by its kind, as rerank does over every document."""
    from docembed.models.fusion import FusionScorer

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    fusion = FusionScorer.from_parts("bm25", str(passages_dir), weight=0.2, long_query_weight=0.9).fit(DOCS)
    fusion.save(tmp_path / "fused")
    assert invoke(capfd, "encode", corpus, "-m", passages_dir, "-o", tmp_path / "e.npz").code == 0
    assert invoke(capfd, "index", "build", tmp_path / "e.npz", "-o", tmp_path / "dense").code == 0
    assert invoke(capfd, "index", "build", corpus, "-t", "bm25", "-o", tmp_path / "bm25").code == 0
    searches = [["search", tmp_path / "dense", "--lexical-index", tmp_path / "bm25"]]
    if importlib.util.find_spec("lance") is not None:
        lance_args = ["-o", tmp_path / "docs.lance", "--store", "lance", "--text-from", corpus]
        assert invoke(capfd, "-q", "index", "build", tmp_path / "e.npz", *lance_args).code == 0
        searches.append(["search", tmp_path / "docs.lance"])
    for args in searches:
        found = invoke(
            capfd, *args, "-m", tmp_path / "fused", "--query", DOCS[2], "--query", QUERY, "-k", "3"
        )
        assert found.code == 0, found.err
        for line, query in zip(found.out.splitlines(), (DOCS[2], QUERY), strict=True):
            expected = sorted(fusion.score(query, DOCS).tolist(), reverse=True)
            assert [h["score"] for h in json.loads(line)["results"]] == pytest.approx(expected, abs=1e-5)


def test_passages_through_a_server_are_the_passages_of_the_model_loaded_here(capfd, tmp_path, passages_dir):
    """`--server`: the spans come from the server's tokenizer (/spans), the same as in-process."""
    import signal

    from cli_helpers import start_server

    index = encode_and_index(capfd, tmp_path, passages_dir, DOCS)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": QUERY, "candidates": DOCS}) + "\n")
    search = [
        "search",
        index,
        "--query",
        QUERY,
        "-k",
        "3",
        "--text-from",
        tmp_path / "docs.jsonl",
        "--passages",
    ]
    local = [
        invoke(capfd, "-q", *args) for args in (["rerank", tasks, "-m", passages_dir, "--passages"], search)
    ]
    server, url = start_server("-m", passages_dir)
    try:
        for args, here in zip(
            (["rerank", tasks, "-m", passages_dir, "--passages"], search), local, strict=True
        ):
            remote = invoke(capfd, "-q", "--server", url, *args)
            assert remote.code == 0 and here.code == 0, remote.err + here.err
            assert remote.out == here.out and '"passage": [' in remote.out
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def test_search_reads_queries_as_the_documents_were_encoded(capfd, tmp_path, tiny_sbert_dir):
    """Settings given to `encode` (here --long windows) are recorded with the vectors, and `search` encodes
    its queries with them: a long query is the mean of its windows, as each document was, not its first."""
    from docembed.io.embeddings import load_embeddings

    index = encode_and_index(capfd, tmp_path, tiny_sbert_dir, DOCS, "--long", "windows")
    recorded = load_embeddings(str(tmp_path / "docs.npz")).metadata["encode_settings"]
    assert recorded == {"long_documents": "windows"}
    long_query = " ".join([QUERY, *DOCS[1].split()[:80]])
    found = json.loads(invoke(capfd, "search", index, "--query", long_query, "-k", "3").out)["results"]
    windows = docembed.load(str(tiny_sbert_dir), long_documents="windows")
    expected = windows.similarity(long_query, DOCS)[0]
    by_id = {hit["id"]: hit["score"] for hit in found}
    np.testing.assert_allclose([by_id[f"d{i}"] for i in range(len(DOCS))], expected, atol=1e-5)
    queries_by_default = docembed.load(str(tiny_sbert_dir)).encode([long_query])
    assert not np.allclose(
        windows.similarity(queries_by_default, windows.encode(DOCS))[0], expected, atol=1e-3
    )
    # `serve --index` (its model from the index) reads queries the same way
    import signal
    import urllib.request

    from cli_helpers import start_server

    server, url = start_server("--index", index)
    try:
        body = json.dumps({"queries": [long_query], "k": 3}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{url}/search", body), timeout=60) as answer:
            served = json.loads(answer.read())["results"][0]["results"]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    assert {hit["id"]: hit["score"] for hit in served} == pytest.approx(by_id, abs=1e-5)
