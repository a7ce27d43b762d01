"""`--server URL` / DOCEMBED_SERVER (#47): a command uses a running `docembed serve` as its model and writes
what it writes with the model loaded in-process, byte for byte; a wrong server fails in one line."""

import json
import signal

import numpy as np
import pytest

from cli_helpers import invoke, start_server

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stock markets fell sharply", "", "kittens"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("remote")
    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    server, url = start_server("-m", "glove-avg")
    yield url, folder
    server.send_signal(signal.SIGINT)
    server.wait(timeout=30)


def test_encode_through_the_server_writes_the_same_bytes(capfd, served):
    url, folder = served
    local, remote = folder / "local.jsonl", folder / "remote.jsonl"
    assert invoke(capfd, "-q", "encode", folder / "docs.jsonl", "-m", "glove-avg", "-o", local).code == 0
    result = invoke(
        capfd, "-q", "--server", url, "encode", folder / "docs.jsonl", "-m", "glove-avg", "-o", remote
    )
    assert result.code == 0, result.err
    assert remote.read_bytes() == local.read_bytes()  # vectors, ids and the metadata line alike


def test_the_environment_variable_and_npy_outputs(capfd, served, monkeypatch):
    url, folder = served
    local, remote = folder / "local.npy", folder / "remote.npy"
    assert invoke(capfd, "-q", "encode", folder / "docs.jsonl", "-m", "glove-avg", "-o", local).code == 0
    monkeypatch.setenv("DOCEMBED_SERVER", url)
    assert invoke(capfd, "-q", "encode", folder / "docs.jsonl", "-m", "glove-avg", "-o", remote).code == 0
    np.testing.assert_array_equal(np.load(remote), np.load(local))
    from docembed import load_embeddings

    assert load_embeddings(str(remote)).metadata == load_embeddings(str(local)).metadata
    # --reuse of a locally written output is the same model: the identity matches
    again = invoke(capfd, "encode", folder / "docs.jsonl", "-m", "glove-avg", "--reuse", local, "-o", local)
    assert again.code == 0 and "encoded 0 new or changed" in again.err


def test_similarity_and_search_give_the_same_answers(capfd, served):
    url, folder = served
    local = invoke(capfd, "similarity", "a cat", "a kitten", "-m", "glove-avg")
    remote = invoke(capfd, "--server", url, "similarity", "a cat", "a kitten", "-m", "glove-avg")
    assert remote.code == 0 and remote.out == local.out
    assert (
        invoke(capfd, "-q", "encode", folder / "docs.jsonl", "-m", "glove-avg", "-o", folder / "e.npy").code
        == 0
    )
    assert invoke(capfd, "-q", "index", "build", folder / "e.npy", "-o", folder / "e.index").code == 0
    plain = invoke(capfd, "search", folder / "e.index", "--query", "cats", "-k", "3")
    served_search = invoke(capfd, "--server", url, "search", folder / "e.index", "--query", "cats", "-k", "3")
    assert served_search.code == 0 and served_search.out == plain.out


def test_a_server_with_another_model_is_refused_in_one_line(capfd, served):
    url, folder = served
    result = invoke(capfd, "--server", url, "similarity", "a", "b", "-m", "sbert")
    assert result.code == 2
    assert "serves 'glove-avg', not 'sbert'" in result.err and len(result.err.strip().splitlines()) == 1


def test_no_server_there_is_one_line(capfd, served):
    from cli_helpers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = invoke(capfd, "--server", url, "similarity", "a", "b", "-m", "glove-avg")
    assert result.code == 1 and "cannot reach a docembed server" in result.err
    bad = invoke(capfd, "--server", "localhost:8765", "similarity", "a", "b")
    assert bad.code == 2 and "http:// URL" in bad.err


def test_what_would_change_the_served_model_is_refused(capfd, served):
    url, folder = served
    docs = folder / "docs.jsonl"
    for extra in (["--fit"], ["--workers", "2"], ["--long", "windows"], ["--long-queries", "whole"]):
        result = invoke(
            capfd, "--server", url, "encode", docs, "-m", "glove-avg", "-o", folder / "x.npy", *extra
        )
        assert result.code == 2 and "leave out --server" in result.err, extra


def test_the_remote_model_scores_passages_as_the_served_one_does():
    from docembed.remote import RemoteEncoder

    health = {"model": "sbert-windows", "family": "sbert", "dim": 384, "multi_vector": True, "metadata": {}}
    remote = RemoteEncoder(
        "http://127.0.0.1:1", {**health, "passage_temperature": 0.03, "long_queries": "whole"}
    )
    assert (remote.passage_temperature, remote.long_queries) == (0.03, "whole")
    older = RemoteEncoder("http://127.0.0.1:1", health)  # a server from before the settings: the defaults
    assert (older.passage_temperature, older.long_queries, older.passage_group_tokens) == (0.0, "passages", 0)
    windows = RemoteEncoder("http://127.0.0.1:1", {**health, "passage_group_tokens": 254})  # nugget-passages
    assert windows.passage_group_tokens == 254
