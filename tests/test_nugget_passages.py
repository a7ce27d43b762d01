"""NUGGET scored by passages (#45, `nugget-passages`): a document's nuggets grouped by the window that read
them, each window scored by mean-MaxSim and the windows pooled as passages are (`passage_temperature`); the
same scores in the Python API, encode's metadata and a faiss index; a Lance collection refuses them."""

import json

import numpy as np
import pytest

import docembed
from cli_helpers import encode_and_index, invoke
from docembed.models.registry import BUILTIN
from docembed.scoring import maxsim_one_to_many, maxsim_pairs, score_matrix, window_groups
from docembed.types import MultiVectors

QUERY = "the cat sat on the mat"
# several of the tiny NUGGET's 62-token windows each, one of them about the query
DOCS = [
    "stocks fell sharply today " * 20 + "the cat sat on the mat " + "rates rose again " * 20,
    "a dog ran in the park " * 30,
    "the cat and the mat and the cat " * 25,
]


def unit(*rows):
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_vectors_are_grouped_by_the_window_of_their_position_and_windows_pool_as_passages():
    # document 0: positions 1 and 3 in window 0 (text tokens 0-3 with 4 a window), 5 and 8 in window 1;
    # document 1: one vector, in window 2; document 2: none
    vectors = unit([1, 0], [0, 1], [1, 1], [1, -1], [-1, 0])
    docs = MultiVectors(vectors, np.array([0, 4, 5, 5]), np.array([1, 3, 5, 8, 12]))
    windows, owner = window_groups(docs, 4)
    assert windows.offsets.tolist() == [0, 2, 4, 5] and owner.tolist() == [0, 0, 1]

    query = unit([1, 0], [1, 1])
    # window 0: the query's vectors find [1,0] (1) and [0,1] or [1,0] (0.707); window 1: [1,1] gives 0.707
    # and 1, [1,-1] gives 0.707 and 0
    first, second = (1 + 2**-0.5) / 2, (2**-0.5 + 1) / 2
    best = maxsim_one_to_many(query, docs, 0.0, "passages", 4)
    np.testing.assert_allclose(best, [max(first, second), (-1 + -(2**-0.5)) / 2, -1.0], atol=1e-6)
    smooth = maxsim_one_to_many(query, docs, 0.1, "passages", 4)
    expected = 0.1 * np.log(np.mean(np.exp(np.array([first, second]) / 0.1)))
    np.testing.assert_allclose(smooth[0], expected, atol=1e-6)
    assert smooth[0] <= best[0] and smooth[1] == pytest.approx(best[1])  # one window: its own score
    # all of a document's vectors together (no windows) is plain mean-MaxSim, the best over both windows
    assert maxsim_one_to_many(query, docs)[0] == pytest.approx(1.0, abs=1e-6)

    # pairs and matrices score each document as one-to-many does
    queries = MultiVectors.from_list([query, query, query])
    np.testing.assert_allclose(
        maxsim_pairs(queries, docs, temperature=0.1, group_tokens=4), smooth, atol=1e-6
    )
    np.testing.assert_allclose(score_matrix(queries, docs, 0.1, "passages", 4)[0], smooth, atol=1e-6)
    # vectors of a document out of window order (not what encode gives) are grouped all the same
    shuffled = MultiVectors(vectors[[3, 0, 2, 1, 4]], docs.offsets, docs.positions[[3, 0, 2, 1, 4]])
    np.testing.assert_allclose(maxsim_one_to_many(query, shuffled, 0.1, "passages", 4), smooth, atol=1e-6)
    with pytest.raises(ValueError, match="positions"):
        maxsim_one_to_many(query, MultiVectors(vectors, docs.offsets), 0.0, "passages", 4)


@pytest.fixture(scope="module")
def nugget_dir(tmp_path_factory, minilm_tokenizer):
    from tiny_models import tiny_nugget

    directory = tmp_path_factory.mktemp("nugget") / "model"
    tiny_nugget(minilm_tokenizer, max_length=64).save(directory)
    return directory


def test_a_nugget_scored_by_windows_in_the_api_and_a_saved_model(nugget_dir, tmp_path):
    plain = docembed.load(str(nugget_dir), device="cpu")
    assert plain.encoder.passage_group_tokens == 0 and "passage_group_tokens" not in plain.encoder.metadata()
    model = docembed.load(str(nugget_dir), device="cpu", passage_temperature=0.05)
    assert model.encoder.passage_group_tokens == 62  # 64 tokens less [CLS] and [SEP]
    assert model.encoder.config_hash() != plain.encoder.config_hash()  # index add keeps them apart
    meta = model.encoder.metadata()
    assert meta["passage_group_tokens"] == 62 and meta["passage_temperature"] == 0.05

    vectors = model.encode([QUERY, *DOCS])
    assert vectors.positions is not None and (vectors.select([1]).positions.max() - 1) // 62 >= 2
    expected = maxsim_one_to_many(vectors[0], vectors.select([1, 2, 3]), 0.05, "passages", 62)
    scores = model.similarity([QUERY], DOCS)[0]
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    assert not np.allclose(scores, plain.similarity([QUERY], DOCS)[0])
    # one window (a short text) scores as plain mean-MaxSim whatever the pooling
    assert model.similarity([QUERY], ["the cat"])[0, 0] == pytest.approx(
        plain.similarity([QUERY], ["the cat"])[0, 0], abs=1e-6
    )

    model.save(tmp_path / "saved")  # the setting is part of the saved model
    again = docembed.load(str(tmp_path / "saved"), device="cpu")
    assert again.encoder.passage_group_tokens == 62 and again.encoder.passage_temperature == 0.05
    np.testing.assert_allclose(again.similarity([QUERY], DOCS)[0], scores, rtol=1e-5)


def test_outputs_that_keep_no_positions_refuse_it_before_any_work(capfd, tmp_path, nugget_dir, monkeypatch):
    """A Lance collection written by the Ray engine keeps no token positions: refused before Ray starts,
    for the built-in and for a saved model scored by windows alike (plain nugget is not refused)."""
    from docembed.engines import ray_engine
    from docembed.models.registry import resolve_model

    def never(*args, **kwargs):
        raise AssertionError("the Ray engine started")

    monkeypatch.setattr(ray_engine, "encode_with_ray", never)

    saved = tmp_path / "windows"
    docembed.load(str(nugget_dir), device="cpu", passage_temperature=0.05).save(saved)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "d0", "text": DOCS[0]}) + "\n")
    for model in ("nugget-passages", saved):
        refused = invoke(capfd, "encode", corpus, "-m", model, "--engine", "ray", "-o", tmp_path / "x.lance")
        assert refused.code == 2 and "token positions" in refused.err, refused.err
        assert not (tmp_path / "x.lance").exists()
    assert not resolve_model("nugget").scores_by_token_windows()
    assert not resolve_model(str(nugget_dir)).scores_by_token_windows()


def test_encode_records_the_windows_and_a_faiss_index_searches_with_them(capfd, tmp_path, nugget_dir):
    encode_and_index(capfd, tmp_path, nugget_dir, DOCS, "--passage-temperature", "0.05")
    out = tmp_path / "docs.npz"
    meta = json.loads((tmp_path / "docs.index" / "meta.json").read_text())
    assert meta["passage_group_tokens"] == 62 and meta["passage_temperature"] == 0.05
    found = invoke(capfd, "search", tmp_path / "docs.index", "--query", QUERY, "-k", "3", "-m", nugget_dir)
    assert found.code == 0, found.err
    hits = {h["id"]: h["score"] for h in json.loads(found.out)["results"]}
    model = docembed.load(str(nugget_dir), device="cpu", passage_temperature=0.05)
    expected = model.similarity([QUERY], DOCS)[0]
    assert [hits[f"d{i}"] for i in range(3)] == pytest.approx([float(s) for s in expected], abs=1e-5)

    # the positions survive an added segment, its compaction and a removal
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "d3", "text": DOCS[0][::-1] + " the cat sat on the mat"}) + "\n")
    added = tmp_path / "more.npz"
    options = ("-m", nugget_dir, "-o", added, "--passage-temperature", "0.05")
    assert invoke(capfd, "encode", more, *options).code == 0
    texts = [*DOCS, DOCS[0][::-1] + " the cat sat on the mat"]
    (tmp_path / "gone.txt").write_text("d1\n")
    for step in (("add", added), ("compact",), ("remove", "--ids", tmp_path / "gone.txt")):
        assert invoke(capfd, "index", step[0], tmp_path / "docs.index", *step[1:]).code == 0, step
        found = invoke(
            capfd, "search", tmp_path / "docs.index", "--query", QUERY, "-k", "4", "-m", nugget_dir
        )
        hits = {h["id"]: h["score"] for h in json.loads(found.out)["results"]}
        expected = dict(zip([f"d{i}" for i in range(4)], model.similarity([QUERY], texts)[0], strict=True))
        assert hits == pytest.approx({i: float(expected[i]) for i in hits}, abs=1e-5), step
        assert len(hits) == (3 if step[0] == "remove" else 4)

    pytest.importorskip("lancedb")
    refused = invoke(capfd, "index", "build", out, "--store", "lance", "-o", tmp_path / "docs.lance")
    assert refused.code != 0 and "token positions" in refused.err and "Traceback" not in refused.err


def test_the_built_in_reads_the_shipped_nugget_by_windows():
    entry = BUILTIN["nugget-passages"]
    assert entry.family == "nugget" and entry.weights == "nugget" and entry.shipped
    assert entry.settings == {"passage_temperature": 0.03}  # chosen on the long-document val tasks
    from docembed.models import zoo

    if not zoo.shipped("nugget"):
        pytest.skip("the nugget is not exported in this checkout")
    encoder = docembed.load("nugget-passages", device="cpu").encoder
    meta = encoder.metadata()
    assert meta["model"] == "nugget-passages" and "model_source" not in meta
    assert (encoder.passage_group_tokens, encoder.passage_temperature) == (254, 0.03)  # 256-token windows


def test_the_passage_a_query_matched_is_the_best_window(capfd, tmp_path, nugget_dir):
    """The window of highest mean-MaxSim, as a character span: the same in the API, rerank and search."""
    model = docembed.load(str(nugget_dir), device="cpu", passage_temperature=0.05)
    vectors = model.encode([QUERY, DOCS[0]])
    windows, _ = window_groups(vectors.select([1]), 62)
    best = int(np.argmax(maxsim_one_to_many(vectors[0], windows)))
    spans = model.encoder.passage_spans([DOCS[0]])[0]
    assert len(spans) == len(windows) >= 3 and spans[0][0] == 0 and spans[-1][1] == len(DOCS[0].rstrip())
    found = model.best_passages(QUERY, DOCS)
    assert (found[0]["start"], found[0]["end"]) == tuple(int(x) for x in spans[best])
    assert found[0]["text"] == DOCS[0][spans[best][0] : spans[best][1]]

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": QUERY, "candidates": DOCS}) + "\n")
    saved = tmp_path / "windows"
    model.save(saved)
    ranked = invoke(capfd, "rerank", tasks, "-m", saved, "--passages")
    assert ranked.code == 0, ranked.err
    by_text = {row["text"]: row["passage"] for row in json.loads(ranked.out)["ranking"]}
    assert [by_text[d] for d in DOCS] == [[f["start"], f["end"]] for f in found]

    index = encode_and_index(capfd, tmp_path, saved, DOCS)
    options = ("--query", QUERY, "-k", "3", "--text-from", tmp_path / "docs.jsonl", "--passages")
    searched = invoke(capfd, "search", index, *options)
    assert searched.code == 0, searched.err
    hits = {hit["id"]: hit["passage"] for hit in json.loads(searched.out)["results"]}
    assert [hits[f"d{i}"] for i in range(3)] == [[f["start"], f["end"]] for f in found]

    # all of a document's nuggets together (plain nugget) have no passages to name
    refused = invoke(capfd, "rerank", tasks, "-m", nugget_dir, "--passages")
    assert refused.code != 0 and "passages" in refused.err and "Traceback" not in refused.err


def test_a_window_index_past_the_texts_last_span_is_its_last_and_no_passage_is_none():
    """best_passages may count a full last window's [SEP] as one window more than the text has spans."""
    from docembed.scoring import passage_span

    spans = np.array([[0, 10], [10, 17]])
    assert passage_span(spans, 0) == [0, 10]
    assert passage_span(spans, 1) == [10, 17]
    assert passage_span(spans, 2) == [10, 17]
    assert passage_span(spans, -1) is None
    assert all(type(x) is int for x in passage_span(spans, 1))  # JSON-ready, not numpy integers
