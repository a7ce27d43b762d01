"""`docembed serve` offers what the CLI offers (#47): it reloads an index another process changed, adds and
removes documents as `index add` / `index remove` do, gives hits their text (--corpus) and ranks a hybrid
search exactly as `search --lexical-index`; /health says what a remote client needs to write what `encode`
writes, and /encode's float32 values come back exact. Routes are asked in process (EmbeddingService.answer)
and over HTTP (make_server on port 0, in a thread)."""

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from cli_helpers import invoke

TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "stock markets fell sharply",
    "kittens and cats play",
    "the bank raised interest rates",
    "a puppy chased the ball in the garden",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A glove-avg index of six documents (idx) from `docembed encode`'s e.npy, a bm25 index of the same
    corpus (bm25), the corpus."""
    from docembed.faiss_index import BM25Index, VectorIndex
    from docembed.io.embeddings import load_embeddings
    from docembed.io.readers import DocumentReader

    folder = tmp_path_factory.mktemp("routes")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    encode = [sys.executable, "-m", "docembed", "-q", "encode", corpus, "-m", "glove-avg"]
    subprocess.run([*encode, "-o", folder / "e.npy"], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    VectorIndex.build(load_embeddings(str(folder / "e.npy"))).save(folder / "idx")
    BM25Index.build(DocumentReader(str(corpus))).save(folder / "bm25")
    return folder


@pytest.fixture(scope="module")
def glove():
    import docembed

    return docembed.load("glove-avg", device="cpu")


@pytest.fixture
def index(built, tmp_path):
    """A copy of the index for one test to change."""
    return shutil.copytree(built / "idx", tmp_path / "idx")


def _service(model, index=None, **options):
    from docembed.server import EmbeddingService

    return EmbeddingService(model, index, reload_interval=0, **options)


def _hits(service, query, k=6):
    rows = service.answer("POST", "/search", {"queries": [query], "k": k})["results"]
    return [hit["id"] for hit in rows[0]["results"]]


def _error(service, path, body):
    from docembed.errors import DocembedError
    from docembed.server import BadRequest

    with pytest.raises((BadRequest, DocembedError)) as caught:
        service.answer("POST", path, body)
    return str(caught.value)


# --- 2. reload: what another process changed is served at the next request ------------------------------
def test_serve_reloads_an_index_another_process_changed(capfd, glove, index, tmp_path):
    service = _service(glove, index)
    assert "d0" in _hits(service, "the cat sat on the mat")
    capfd.readouterr()
    (tmp_path / "gone.txt").write_text("d0\n")
    assert invoke(capfd, "index", "remove", index, "--ids", tmp_path / "gone.txt").code == 0
    assert "d0" not in _hits(service, "the cat sat on the mat")  # no restart
    assert f"reloaded {index}: 5 documents" in capfd.readouterr().err
    assert service.answer("GET", "/health", {})["documents"] == 5
    assert _error(service, "/search", {"ids": ["d0"]}) == "id 'd0' is not in the index"
    # an add by another process (a segment) and a rebuild are seen too
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "n0", "text": "cats and kittens on a mat"}) + "\n")
    assert invoke(capfd, "-q", "encode", more, "-m", "glove-avg", "-o", tmp_path / "more.npy").code == 0
    assert invoke(capfd, "index", "add", index, tmp_path / "more.npy").code == 0
    assert _hits(service, "cats and kittens on a mat", 1) == ["n0"]
    result = invoke(capfd, "index", "build", tmp_path / "more.npy", "-o", index, "--overwrite")
    assert result.code == 0
    assert service.answer("GET", "/health", {})["documents"] == 1


def test_a_failed_reload_keeps_the_old_index_and_retries(capfd, glove, index):
    from docembed.faiss_index import index_stamp

    service = _service(glove, index)
    good = (index / "meta.json").read_text()
    capfd.readouterr()
    (index / "meta.json").write_text("{half a write")  # a writer caught mid-way
    assert len(_hits(service, "a dog in the park")) == 6  # the old index answers
    assert len(_hits(service, "a dog in the park")) == 6
    err = capfd.readouterr().err
    assert err.count("could not reload") == 1 and "serving the one loaded" in err  # one line, not one a try
    (index / "meta.json").write_text(good)
    gone = index.parent / "gone.txt"
    gone.write_text("d1\n")
    assert invoke(capfd, "index", "remove", index, "--ids", gone).code == 0
    assert len(_hits(service, "a dog in the park")) == 5 and "reloaded" in capfd.readouterr().err
    assert service._index.stamp == index_stamp(index)


def test_a_load_that_crosses_a_write_is_not_served(tmp_path):
    """The stamp is read before and after the load: files of two versions are never swapped in."""
    from docembed.server import Watched

    target = tmp_path / "f.txt"
    target.write_text("one")
    stamp = lambda path: path.stat().st_mtime_ns if path.exists() else None  # noqa: E731
    crossing = {"now": False}

    def load(path):
        text = path.read_text()
        if crossing["now"]:  # another process writes while this one reads
            path.write_text(text + " and more")
        return text

    watched = Watched(target, load, stamp, str, interval=0)
    assert watched.value == "one"
    crossing["now"] = True
    target.write_text("two")
    watched.refresh()
    assert watched.value == "one"  # not "two": its stamp moved during the load
    crossing["now"] = False
    watched.refresh()
    assert watched.value == "two and more"


def test_reload_checks_at_most_once_an_interval(glove, index):
    from docembed.faiss_index import VectorIndex
    from docembed.server import EmbeddingService

    service = EmbeddingService(glove, index, reload_interval=3600)
    VectorIndex.remove_saved(index, ["d2"])
    assert service.answer("GET", "/health", {})["documents"] == 6  # not looked at yet
    service._index.refresh(force=True)
    assert service.answer("GET", "/health", {})["documents"] == 5


# --- 3. /add and /remove: the CLI's code path, on disk, all or nothing -------------------------------------
def test_add_and_remove_change_the_index_on_disk_as_the_cli_does(capfd, glove, built, index, tmp_path):
    from docembed.faiss_index import VectorIndex, index_stamp

    service = _service(glove, index)
    new = {"ids": ["n0", "n1"], "texts": ["cats and kittens on a mat", "interest rates and banks"]}
    answer = service.answer("POST", "/add", new)
    assert answer == {"added": 2, "documents": 8, "compacted": True}  # 2 of 8: past a tenth, one file
    assert _hits(service, "cats and kittens on a mat", 1) == ["n0"]
    # the same documents through `docembed encode` + `index add`: the same index
    cli_index = shutil.copytree(built / "idx", tmp_path / "cli_idx")
    more = tmp_path / "more.jsonl"
    more.write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(*new.values(), strict=True))
    )
    assert invoke(capfd, "-q", "encode", more, "-m", "glove-avg", "-o", tmp_path / "more.npy").code == 0
    assert invoke(capfd, "index", "add", cli_index, tmp_path / "more.npy").code == 0
    served, cli = VectorIndex.load(index), VectorIndex.load(cli_index)
    assert served.ids == cli.ids and served.changes == cli.changes
    queries = glove.encode(["a cat", "the bank"])
    assert served.search(queries, 8) == cli.search(queries, 8)
    # refusals, each leaving the folder as it was
    before = index_stamp(index)
    assert "'n0' is already in the index" in _error(service, "/add", {"ids": ["n0"], "texts": ["x"]})
    assert "'z' is repeated" in _error(service, "/add", {"ids": ["z", "z"], "texts": ["a", "b"]})
    assert "one id per text" in _error(service, "/add", {"ids": ["z"], "texts": ["a", "b"]})
    assert '"ids" must be a list of strings' in _error(service, "/add", {"ids": [1], "texts": ["a"]})
    assert index_stamp(index) == before
    # /remove as `index remove`: unknown ids counted, the rest gone from disk and from answers
    answer = service.answer("POST", "/remove", {"ids": ["n1", "d2", "nope"]})
    assert answer == {"removed": 2, "unknown": 1, "documents": 6}
    assert "d2" not in _hits(service, "stock markets fell sharply")
    assert "d2" not in VectorIndex.load(index).ids
    everything = {"ids": VectorIndex.load(index).ids}
    assert "empty index" in _error(service, "/remove", everything)


def test_add_refuses_non_finite_vectors_and_writes_nothing(glove, index, monkeypatch):
    from docembed.faiss_index import index_stamp

    service = _service(glove, index)
    before = index_stamp(index)
    encoder = service._encoder
    monkeypatch.setattr(
        encoder, "encode", lambda texts, batch_size=32: np.full((len(texts), 50), np.nan, np.float32)
    )
    assert "NaN or infinite" in _error(service, "/add", {"ids": ["n0"], "texts": ["x"]})
    assert index_stamp(index) == before and service.answer("GET", "/health", {})["documents"] == 6


def test_add_and_remove_need_an_index_folder(glove, built):
    from docembed.faiss_index import VectorIndex

    in_memory = _service(glove, VectorIndex.load(built / "idx"))
    assert "no index folder" in _error(in_memory, "/add", {"ids": ["a"], "texts": ["b"]})
    assert "no index folder" in _error(_service(glove), "/remove", {"ids": ["a"]})


# --- 3. texts in hits and hybrid search, as `docembed search` writes them ----------------------------------
def test_corpus_texts_join_the_hits_as_search_text_from(capfd, glove, built, index):
    service = _service(glove, index, corpus=built / "corpus.jsonl")
    body = {"ids": ["d3"], "queries": ["a cat on a mat"], "k": 3}
    rows = service.answer("POST", "/search", body)["results"]
    by_id = invoke(capfd, "search", index, "--id", "d3", "-k", "3", "--text-from", built / "corpus.jsonl")
    by_text = invoke(
        capfd, "search", index, "--query", "a cat on a mat", "-k", "3", "--text-from", built / "corpus.jsonl"
    )
    assert rows == [json.loads(by_id.out), json.loads(by_text.out)]
    assert rows[1]["results"][0] == {"id": "d0", "score": rows[1]["results"][0]["score"], "text": TEXTS[0]}
    # a document added through /add has its text; one added by another process has none (null)
    service.answer("POST", "/add", {"ids": ["n0"], "texts": ["cats and kittens on a mat"]})
    hit = service.answer("POST", "/search", {"queries": ["cats and kittens on a mat"], "k": 1})["results"][0]
    assert hit["results"][0]["text"] == "cats and kittens on a mat"


@pytest.mark.parametrize("query", ["the cat and the dog", "interest rates fell", "kittens in the garden"])
def test_hybrid_search_ranks_exactly_as_search_lexical_index(capfd, built, query):
    import docembed

    fusion = docembed.load("bm25+glove-avg", device="cpu")
    service = _service(fusion, built / "idx", lexical=built / "bm25", corpus=built / "corpus.jsonl")
    rows = service.answer("POST", "/search", {"queries": [query], "k": 4})["results"]
    args = ["search", built / "idx", "--lexical-index", built / "bm25", "-m", "bm25+glove-avg"]
    result = invoke(capfd, *args, "--query", query, "-k", "4", "--text-from", built / "corpus.jsonl")
    assert result.code == 0, result.err
    assert rows == [json.loads(result.out)]
    plain = _service(docembed.load("glove-avg", device="cpu"), built / "idx")
    assert plain.answer("POST", "/search", {"queries": [query], "k": 4})["results"] != rows  # it is fused
    # the two indexes stay one corpus: the vector index alone does not grow or shrink
    assert "rebuild both" in _error(service, "/add", {"ids": ["n0"], "texts": ["x"]})
    assert "rebuild both" in _error(service, "/remove", {"ids": ["d0"]})


def test_a_lance_index_beside_a_bm25_index_serves_the_rows_search_writes(capfd, built, tmp_path):
    """The default store for dense sets is Lance: its hybrid with a separate bm25 index is served as
    `search --lexical-index` ranks it, and as the faiss index's is (the same candidates, exact scores)."""
    import docembed

    lance = tmp_path / "lance"
    assert invoke(capfd, "-q", "index", "build", built / "e.npy", "-o", lance, "--store", "lance").code == 0
    fusion = docembed.load("bm25+glove-avg", device="cpu")
    query = "the cat and the dog"
    rows = {}
    for name, index in (("lance", lance), ("faiss", built / "idx")):
        service = _service(fusion, index, lexical=built / "bm25")
        rows[name] = service.answer("POST", "/search", {"queries": [query], "k": 4})["results"]
        args = ["search", index, "--lexical-index", built / "bm25", "-m", "bm25+glove-avg", "--query", query]
        result = invoke(capfd, *args, "-k", "4")
        assert result.code == 0, result.err
        assert rows[name] == [json.loads(result.out)]
    assert [h["id"] for h in rows["lance"][0]["results"]] == [h["id"] for h in rows["faiss"][0]["results"]]
    refused = _error(
        _service(fusion, lance, lexical=built / "bm25"), "/search", {"queries": ["x"], "where": "1=1"}
    )
    assert "leave out" in refused


def test_hybrid_serving_is_checked_at_start(glove, built):
    import docembed
    from docembed.errors import UsageError

    with pytest.raises(UsageError, match="needs -m LEXICAL"):
        _service(glove, built / "idx", lexical=built / "bm25")
    with pytest.raises(UsageError, match="give --lexical-index"):
        _service(docembed.load("bm25+glove-avg", device="cpu"), built / "idx")
    with pytest.raises(UsageError, match="give the vector --index too"):
        _service(glove, lexical=built / "bm25")


# --- 4. /health and /encode for remote clients, over HTTP ---------------------------------------------------
@pytest.fixture
def http(glove, built):
    from docembed.server import make_server

    server = make_server(_service(glove, built / "idx"), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://{}:{}".format(*server.server_address[:2])
    server.shutdown()
    server.server_close()


def _ask(url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data), timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_health_gives_what_encode_writes(http, built, glove):
    from docembed.encoding import model_identity
    from docembed.io.embeddings import load_embeddings

    status, health = _ask(http, "/health")
    assert status == 200
    written = load_embeddings(str(built / "e.npy")).metadata
    assert health["metadata"] == glove.metadata()
    assert health["metadata"].items() <= written.items()  # encode writes these, and per-run extras
    assert health["normalized"] is False and health["passage_temperature"] == 0.0
    assert health["long_queries"] == "passages" and health["passage_group_tokens"] == 0
    assert health["max_tokens"] is None and health["scorer"] is False and health["dim"] == 50
    assert health["identity"] == model_identity(glove.encoder) == written["model_identity"]
    assert health["documents"] == 6


def test_encode_takes_a_batch_size_and_gives_float32_exactly(http, glove):
    texts = [*TEXTS, "ünïcödé text with a 😀", "", "x " * 300]
    status, answer = _ask(http, "/encode", {"texts": texts, "batch_size": 3})
    assert status == 200
    got = np.asarray(answer["embeddings"], dtype=np.float32)
    np.testing.assert_array_equal(got, glove.encode(texts, batch_size=3))  # bit for bit
    assert np.array_equal(np.asarray(answer["embeddings"], dtype=np.float64), got.astype(np.float64))
    for bad in (0, -1, "8", True, 1.5):
        status, answer = _ask(http, "/encode", {"texts": ["a"], "batch_size": bad})
        assert status == 400 and answer["error"] == "batch_size must be a positive integer"


def test_float32_values_round_trip_through_json_exactly():
    """The property /encode relies on: json.dumps of float32.tolist() reads back as the same float32 bits,
    extremes and subnormals included."""
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32),
            (rng.standard_normal(2000) * 1e-40).astype(np.float32),  # subnormal
            np.array([np.finfo(np.float32).max, np.finfo(np.float32).tiny, -0.0, 1e-45], dtype=np.float32),
        ]
    )
    back = np.asarray(json.loads(json.dumps(values.tolist())), dtype=np.float32)
    assert back.view(np.uint32).tolist() == values.view(np.uint32).tolist()


def test_serve_help_names_the_new_routes(capfd):
    result = invoke(capfd, "serve", "--help")
    assert result.code == 0
    for word in ("/add", "/remove", "--lexical-index", "--corpus", "/health"):
        assert word in result.out


# --- a Lance collection: filters, hybrid, stored text, add / remove as versions, reloads -------------------
@pytest.fixture
def collection(built, tmp_path, capfd):
    """A Lance index of the same six documents, with their text and a `year` field (d{i}: 2000 + i)."""
    rows = [json.loads(line) for line in (built / "corpus.jsonl").read_text().splitlines()]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({**row, "year": 2000 + i}) + "\n" for i, row in enumerate(rows)))
    built_ok = invoke(
        capfd,
        "-q",
        "index",
        "build",
        built / "e.npy",
        "-o",
        tmp_path / "l",
        "--store",
        "lance",
        "--text-from",
        corpus,
        "--fields",
        "year",
    )
    assert built_ok.code == 0, built_ok.err
    return tmp_path / "l"


def test_a_lance_collection_is_served_as_search_searches_it(glove, collection, capfd):
    service = _service(glove, collection)
    assert service.answer("GET", "/health", {})["store"] == "lance"
    assert service.answer("GET", "/health", {})["documents"] == 6
    for body, options in (
        ({"queries": ["cats"], "k": 3}, []),
        ({"queries": ["cats"], "k": 3, "where": "year >= 2002"}, ["--where", "year >= 2002"]),
        ({"queries": ["cats"], "k": 3, "hybrid": True}, ["--hybrid"]),
        ({"ids": ["d0"], "k": 2, "where": "year < 2004"}, ["--where", "year < 2004"]),
    ):
        served = service.answer("POST", "/search", body)["results"]
        asked = ["--query", "cats"] if "queries" in body else ["--id", "d0"]
        cli = invoke(capfd, "search", collection, *asked, "-k", str(body["k"]), *options)
        expected = [json.loads(line) for line in cli.out.splitlines()]
        assert [[h["id"] for h in r["results"]] for r in served] == [
            [h["id"] for h in r["results"]] for r in expected
        ]
        for row, want in zip(served, expected, strict=True):
            np.testing.assert_allclose(
                [h["score"] for h in row["results"]], [h["score"] for h in want["results"]], atol=1e-5
            )
            assert all(h["text"] == TEXTS[int(h["id"][1:])] for h in row["results"])
    kept = service.answer("POST", "/search", {"queries": ["cats"], "where": "year > 2003"})["results"][0]
    assert sorted(h["id"] for h in kept["results"]) == ["d4", "d5"]
    assert "must be a string" in _error(service, "/search", {"queries": ["x"], "where": 5})
    assert "Lance search failed" in _error(
        service, "/search", {"queries": ["x"], "where": "no_such_field > 1"}
    )


def test_lance_add_and_remove_through_serve_are_versions_the_next_search_sees(glove, collection):
    from docembed.lance_index import LanceIndex

    service = _service(glove, collection)
    before = LanceIndex.open(collection).version
    added = service.answer("POST", "/add", {"ids": ["n1"], "texts": ["a kitten naps on a cat bed"]})
    assert added["added"] == 1 and added["documents"] == 7 and added["version"] == before + 1
    hits = service.answer("POST", "/search", {"queries": ["kitten cat bed"], "k": 2})["results"][0]["results"]
    assert "n1" in [h["id"] for h in hits]
    assert next(h["text"] for h in hits if h["id"] == "n1") == "a kitten naps on a cat bed"
    assert "already in the index" in _error(service, "/add", {"ids": ["n1"], "texts": ["again"]})
    removed = service.answer("POST", "/remove", {"ids": ["n1", "nobody"]})
    assert removed == {"removed": 1, "unknown": 1, "documents": 6}
    assert LanceIndex.open(collection).version == before + 2


def test_serve_reloads_a_lance_collection_changed_by_another_process(glove, collection, tmp_path, capfd):
    service = _service(glove, collection)
    assert service.answer("GET", "/health", {})["documents"] == 6
    (tmp_path / "gone.txt").write_text("d0\nd1\n")
    removed = invoke(capfd, "-q", "index", "remove", collection, "--ids", tmp_path / "gone.txt")
    assert removed.code == 0, removed.err
    assert service.answer("GET", "/health", {})["documents"] == 4


def test_filters_and_hybrid_are_refused_for_a_faiss_index(glove, index):
    service = _service(glove, index)
    assert "Lance" in _error(service, "/search", {"queries": ["x"], "where": "year > 1"})
    assert "Lance" in _error(service, "/search", {"queries": ["x"], "hybrid": True})


def test_a_fusion_server_ranks_lance_hybrid_search_as_search_does(collection, capfd):
    import docembed

    service = _service(docembed.load("bm25+glove-avg", device="cpu"), collection)
    cli = invoke(capfd, "search", collection, "--query", "cats on a mat", "-k", "4", "-m", "bm25+glove-avg")
    expected = json.loads(cli.out)["results"]
    for hybrid in (True, False):  # a fusion's server fuses every search, as `search -m` does
        body = {"queries": ["cats on a mat"], "k": 4, "hybrid": hybrid}
        served = service.answer("POST", "/search", body)["results"][0]["results"]
        assert [h["id"] for h in served] == [h["id"] for h in expected]
        np.testing.assert_allclose([h["score"] for h in served], [h["score"] for h in expected], atol=1e-5)


def test_spans_are_for_a_model_whose_vectors_are_passages(glove, index):
    service = _service(glove, index)
    assert service.answer("GET", "/health", {})["passages"] is False
    assert "not passages" in _error(service, "/spans", {"texts": ["a cat"]})
