"""`docembed serve` (#32): a real server in its own process, asked over HTTP; its answers are compared with
what the same commands write (encode, similarity, search) and with the Python API."""

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from cli_helpers import invoke, start_server

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stock markets fell sharply", "kittens and cats"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A glove-avg index of four documents and a server over it, on a free port."""
    folder = tmp_path_factory.mktemp("serve")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    docembed = [sys.executable, "-m", "docembed"]
    subprocess.run([*docembed, "-q", "encode", corpus, "-m", "glove-avg", "-o", folder / "e.npy"], check=True)
    subprocess.run([*docembed, "-q", "index", "build", folder / "e.npy", "-o", folder / "idx"], check=True)
    server, url = start_server("--index", folder / "idx", env=dict(os.environ, OMP_NUM_THREADS="1"))
    yield url, folder
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=30) == 130  # Ctrl-C stops it, with the CLI's status for an interrupt


def _ask(url, path, body=None, method=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, method=method or ("POST" if data else "GET"))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_health_says_what_is_served(served):
    url, _ = served
    status, body = _ask(url, "/health")
    assert status == 200
    expected = {"model": "glove-avg", "family": "glove-avg", "dim": 50, "multi_vector": False, "documents": 4}
    assert {key: body[key] for key in expected} == expected
    # what a remote client needs to write what `encode` writes (#47): the model's settings and metadata
    assert body["normalized"] is False and body["passage_temperature"] == 0.0 and body["max_tokens"] is None
    assert body["metadata"]["model"] == "glove-avg" and body["metadata"]["config_hash"]


def test_encode_and_similarity_equal_the_python_api(served):
    import docembed

    url, _ = served
    model = docembed.load("glove-avg", device="cpu")
    status, body = _ask(url, "/encode", {"texts": TEXTS[:2]})
    assert status == 200 and body["model"] == "glove-avg"
    np.testing.assert_allclose(np.array(body["embeddings"]), model.encode(TEXTS[:2]), rtol=0, atol=1e-6)
    status, body = _ask(url, "/similarity", {"a": TEXTS[:1], "b": TEXTS})
    assert status == 200
    np.testing.assert_allclose(body["scores"], model.similarity(TEXTS[:1], TEXTS), atol=1e-6)
    assert np.shape(body["scores"]) == (1, 4) and body["scores"][0][0] == pytest.approx(1.0)


def test_search_answers_what_the_search_command_writes(served, capfd):
    url, folder = served
    query = "a cat on a mat"
    status, body = _ask(url, "/search", {"ids": ["d3"], "queries": [query], "k": 3})
    assert status == 200
    by_id = invoke(capfd, "search", folder / "idx", "--id", "d3", "-k", "3")
    by_text = invoke(capfd, "search", folder / "idx", "--query", query, "-k", "3")
    assert body["results"] == [json.loads(by_id.out), json.loads(by_text.out)]
    assert body["results"][1]["results"][0]["id"] == "d0"


def test_requests_answered_in_parallel_stay_separate(served):
    url, _ = served
    answers = {}

    def ask(i):
        answers[i] = _ask(url, "/encode", {"texts": [TEXTS[i % 4]] * (i + 1)})[1]["embeddings"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, vectors in answers.items():
        assert len(vectors) == i + 1 and vectors[0] == answers[i % 4][0]


@pytest.mark.parametrize(
    "path, body, method, status, message",
    [
        ("/encode", b"{not json", None, 400, "not JSON"),
        ("/encode", {"texts": "one string"}, None, 400, '"texts" must be a list of strings'),
        ("/encode", [1, 2], None, 400, "must be a JSON object"),
        ("/search", {"ids": ["nope"]}, None, 404, "'nope' is not in the index"),
        ("/search", {"queries": ["x"], "k": 0}, None, 400, "k must be a positive integer"),
        ("/search", {}, None, 400, 'give "queries"'),
        ("/nowhere", None, None, 404, "no route /nowhere"),
        ("/encode", None, "GET", 405, "does not take GET"),
    ],
)
def test_bad_requests_get_a_status_and_one_line(served, path, body, method, status, message):
    url, _ = served
    got, answer = _ask(url, path, body, method)
    assert got == status and message in answer["error"] and "\n" not in answer["error"]
    assert _ask(url, "/health")[0] == 200  # and the server keeps serving


def test_serve_refuses_what_it_cannot_serve(capfd, tmp_path):
    assert "give --model" in invoke(capfd, "serve").err
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "x y"}\n')
    invoke(capfd, "index", "build", corpus, "--type", "bm25", "-o", tmp_path / "bm25")
    assert "vector index" in invoke(capfd, "serve", "--index", tmp_path / "bm25").err
    import socket

    with socket.socket() as taken:  # a port another server holds: one line, before the model loads
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = invoke(capfd, "serve", "-m", "no-such-model", "--port", port)
        assert result.code == 2 and "cannot listen on 127.0.0.1:" in result.err


def test_a_multi_vector_model_is_served_as_vectors_per_text(tiny_sbert_tokens_dir):
    """In process (the routes without the socket): a multi-vector model's /encode gives each text its list
    of vectors, and /search scores with mean-MaxSim as the index does."""
    import docembed
    from docembed.faiss_index import VectorIndex
    from docembed.server import EmbeddingService

    model = docembed.load(tiny_sbert_tokens_dir, device="cpu")
    stored = model.encode(TEXTS)
    index = VectorIndex.build(docembed.EmbeddingSet(stored, [f"d{i}" for i in range(4)], model.metadata()))
    service = EmbeddingService(model, index)
    vectors = service.answer("POST", "/encode", {"texts": TEXTS[:2]})["embeddings"]
    for mine, theirs in zip(vectors, stored.to_list()[:2], strict=True):
        np.testing.assert_allclose(np.array(mine), theirs, atol=1e-6)
    found = service.answer("POST", "/search", {"queries": [TEXTS[2]], "k": 2})["results"][0]
    assert found["results"][0] == {"id": "d2", "score": pytest.approx(1.0, abs=1e-5)}
    assert service.answer("GET", "/health", {})["multi_vector"] is True
