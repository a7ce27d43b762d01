"""`search --passages` (#46): each hit of an index of passages names the passage the query matched best,
[start, end] in its text and that text, the same span `rerank --passages` gives for the same query and
document, from a faiss index (--text-from) and a Lance one (its stored text), with --id, --where and
--hybrid; refused in one line, before any model loads, where there are no passages or no text; and
serve's /search with "passages": true answers the rows the CLI writes."""

import json

import pytest

from cli_helpers import invoke

QUERY = "the cat sat on the mat"
VOCABULARY = (
    "stocks fell rates rose bank market trade river mountain rain town night dog park ball garden music "
    "song film actor paper school teacher train station bread cheese winter summer ship sea island road"
)


def _text(seed: int, words: int = 90) -> str:
    """Varied text (no two windows alike, so a best passage is no near tie), the same on every run."""
    import random

    pick, vocabulary = random.Random(seed), VOCABULARY.split()
    return " ".join(pick.choice(vocabulary) for _ in range(words))


# several of the tiny model's windows each, one part of the first about the query
DOCS = [_text(0, 40) + " " + QUERY + " " + _text(1, 40), _text(2), _text(3), _text(4)]
IDS = [f"d{i}" for i in range(len(DOCS))]


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    """The tiny sbert model with the windows output (model/), its vectors of DOCS (docs.npz), a faiss
    index of them (docs.index), a Lance one with their text and a `year` field (docs.lance), the corpus."""
    from docembed.cli import main
    from tiny_models import save_tiny_sbert

    folder = tmp_path_factory.mktemp("search_passages")
    save_tiny_sbert(tiny_bert_dir, folder / "model", output="windows")
    corpus = folder / "docs.jsonl"
    rows = [{"id": i, "text": t, "year": 2000 + n} for n, (i, t) in enumerate(zip(IDS, DOCS, strict=True))]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for args in (
        ["encode", corpus, "-m", folder / "model", "-o", folder / "docs.npz"],
        ["index", "build", folder / "docs.npz", "-o", folder / "docs.index"],
        ["index", "build", folder / "docs.npz", "-o", folder / "docs.lance", "--store", "lance"]
        + ["--text-from", corpus, "--fields", "year"],
    ):
        _run(main, "-q", *args)
    return folder


def _run(main, *args):
    import sys

    old, sys.argv = sys.argv, ["docembed", *map(str, args)]
    try:
        main()
    except SystemExit as done:
        assert not done.code, args
    finally:
        sys.argv = old


def _search(capfd, index, *options):
    found = invoke(capfd, "search", index, *options, "--passages")
    assert found.code == 0, found.err
    return [json.loads(line) for line in found.out.splitlines()]


def _reranked(capfd, built, source=None):
    """{id: passage} of `rerank --passages` of every document: for QUERY (a text row), or for the
    document `source` (an id row, its candidates the other ids)."""
    tasks = built / "tasks.jsonl"
    if source is None:
        row, docs = {"query": QUERY, "candidates": DOCS}, []
    else:
        row = {"source": source, "candidates": [i for i in IDS if i != source]}
        docs = ["--docs", built / "docs.jsonl"]
    tasks.write_text(json.dumps(row) + "\n")
    ranked = invoke(capfd, "rerank", tasks, *docs, "-m", built / "model", "--passages")
    assert ranked.code == 0, ranked.err
    ranking = json.loads(ranked.out)["ranking"]
    return {entry.get("id") or IDS[DOCS.index(entry["text"])]: entry["passage"] for entry in ranking}


def _check_hits(hits, expected):
    """Each hit's passage is rerank's, and its passage_text the corpus slice."""
    assert hits
    for hit in hits:
        start, end = hit["passage"]
        assert hit["passage"] == expected[hit["id"]], hit["id"]
        assert hit["passage_text"] == DOCS[IDS.index(hit["id"])][start:end] != ""


@pytest.mark.parametrize("store", ["faiss", "lance"])
def test_search_names_the_passage_rerank_names(capfd, built, store):
    index = built / ("docs.index" if store == "faiss" else "docs.lance")
    text = ["--text-from", built / "docs.jsonl"] if store == "faiss" else []
    rows = _search(capfd, index, "--query", QUERY, "-k", "4", *text)
    expected = _reranked(capfd, built)
    _check_hits(rows[0]["results"], expected)
    # windows follow one another, so a span that is not the first window shows the best one was picked
    assert any(hit["passage"][0] > 0 for hit in rows[0]["results"])
    liked = _search(capfd, index, "--id", "d0", "-k", "3", *text)  # more like d0: d0's passages the query
    _check_hits(liked[0]["results"], _reranked(capfd, built, "d0"))


def test_filtered_and_hybrid_hits_have_their_passages(capfd, built, tmp_path):
    expected = _reranked(capfd, built)
    kept = _search(capfd, built / "docs.lance", "--query", QUERY, "--where", "year >= 2001", "-k", "4")
    assert sorted(hit["id"] for hit in kept[0]["results"]) == ["d1", "d2", "d3"]
    _check_hits(kept[0]["results"], expected)
    hybrid = _search(capfd, built / "docs.lance", "--query", QUERY, "--hybrid", "-k", "4")
    _check_hits(hybrid[0]["results"], expected)
    bm25 = tmp_path / "docs.bm25"  # a faiss index fused with a bm25 one (--lexical-index)
    assert invoke(capfd, "index", "build", built / "docs.jsonl", "--type", "bm25", "-o", bm25).code == 0
    fused = _search(
        capfd,
        built / "docs.index",
        *("--query", QUERY, "--lexical-index", bm25, "-m", f"bm25+{built / 'model'}", "-k", "4"),
        *("--text-from", built / "docs.jsonl"),
    )
    _check_hits(fused[0]["results"], expected)


def test_without_passages_or_text_it_is_refused_in_one_line_before_a_model_loads(
    capfd, built, tiny_sbert_dir, tmp_path, monkeypatch
):
    from docembed.cli import common

    dense = tmp_path / "dense.index"
    assert (
        invoke(capfd, "encode", built / "docs.jsonl", "-m", tiny_sbert_dir, "-o", tmp_path / "d.npy").code
        == 0
    )
    assert invoke(capfd, "index", "build", tmp_path / "d.npy", "-o", dense).code == 0
    bare = tmp_path / "bare.lance"  # passages, but no text stored
    assert invoke(capfd, "index", "build", built / "docs.npz", "-o", bare, "--store", "lance").code == 0

    def no_model(spec):
        raise AssertionError(f"{spec} loaded")

    monkeypatch.setattr(common, "load", no_model)
    corpus = ["--text-from", built / "docs.jsonl"]
    for args, says in (
        ([dense, "--query", QUERY, *corpus], "one vector per document"),
        ([built / "docs.index", "--query", QUERY], "give --text-from CORPUS"),  # faiss: no text
        ([built / "docs.index", "--id", "d0"], "give --text-from CORPUS"),
        ([bare, "--query", QUERY], "built without --text-from"),
        ([built / "docs.index", "--query", QUERY, *corpus, "--output-format", "trec"], "TREC run"),
    ):
        refused = invoke(capfd, "search", *args, "--passages")
        assert refused.code != 0 and says in refused.err, refused.err
        assert len(refused.err.strip().splitlines()) == 1 and refused.out == ""


def test_a_mismatched_corpus_is_refused_not_misplaced(capfd, built, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": i, "text": "short"}) + "\n" for i in IDS))
    refused = invoke(
        capfd, "search", built / "docs.index", "--query", QUERY, "--text-from", other, "--passages"
    )
    assert refused.code != 0 and "passage(s)" in refused.err and "the index holds" in refused.err


@pytest.mark.parametrize("store", ["faiss", "lance"])
def test_serve_answers_the_rows_search_writes(capfd, built, store):
    import docembed
    from docembed.server import BadRequest, EmbeddingService

    model = docembed.load(str(built / "model"), device="cpu")
    index = built / ("docs.index" if store == "faiss" else "docs.lance")
    corpus = built / "docs.jsonl" if store == "faiss" else None
    service = EmbeddingService(model, index, reload_interval=0, corpus=corpus)
    body = {"ids": ["d0"], "queries": [QUERY], "k": 3, "passages": True}
    served = service.answer("POST", "/search", body)["results"]
    text = ["--text-from", corpus] if corpus else []
    cli = _search(capfd, index, "--id", "d0", "--query", QUERY, "-k", "3", *text)
    assert [[h["id"] for h in r["results"]] for r in served] == [[h["id"] for h in r["results"]] for r in cli]
    for row, want in zip(served, cli, strict=True):
        for hit, expected in zip(row["results"], want["results"], strict=True):
            assert hit["score"] == pytest.approx(expected["score"], abs=1e-5)
            assert {**hit, "score": 0} == {**expected, "score": 0}
    assert all(
        "passage" not in h
        for h in service.answer("POST", "/search", {**body, "passages": False})["results"][1]["results"]
    )
    with pytest.raises(BadRequest, match="true or false"):
        service.answer("POST", "/search", {**body, "passages": "yes"})
    if store == "faiss":  # no corpus, no text: refused
        bare = EmbeddingService(model, index, reload_interval=0)
        with pytest.raises(BadRequest, match="--corpus"):
            bare.answer("POST", "/search", body)
