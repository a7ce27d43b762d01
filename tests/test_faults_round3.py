"""Fault injection, round three (issue #49): nothing lost, nothing wrong in silence. `docembed serve` under
load and bad requests (a real server on 127.0.0.1, in this process); outputs follow the umask; a run with a
non-finite score is refused; paths read from metadata stay inside their folder."""

import http.client
import json
import os
import shutil
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cli_helpers import invoke
from test_faults import corpus, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)


# --- docembed serve ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def httpd(tiny_tfidf_dir):
    """The tiny tf-idf model served on a free loopback port, in a thread of this process."""
    import docembed
    from docembed.server import EmbeddingService, make_server

    server = make_server(EmbeddingService(docembed.load(tiny_tfidf_dir, device="cpu")), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _request(server, method, path, body=b"", headers=None):
    """(status, headers, body bytes) of one request on a fresh connection; bodies sent as they are."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        headers = {"Content-Length": str(len(body)), **(headers or {})}
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def _error(status_headers_body) -> str:
    """The one-line error of a JSON error answer."""
    _, headers, data = status_headers_body
    assert headers["Content-Type"].startswith("application/json")
    message = json.loads(data)["error"]
    assert message and "\n" not in message
    return message


def test_200_concurrent_requests_lose_none(httpd):
    assert httpd.request_queue_size >= 1024 and httpd.daemon_threads
    start = threading.Barrier(200)

    def health(_):
        start.wait(timeout=60)  # all connect at once: more than a backlog of 5 could hold
        try:
            return _request(httpd, "GET", "/health")[0]
        except OSError as error:  # a reset or a refused connection: a lost request
            return type(error).__name__

    with ThreadPoolExecutor(max_workers=200) as pool:
        answers = list(pool.map(health, range(200)))
    assert answers == [200] * 200, {a: answers.count(a) for a in set(answers)}


@pytest.mark.parametrize("length", ["-5", "abc", "1e3"])
def test_a_bad_content_length_is_a_json_400(httpd, length):
    answer = _request(httpd, "POST", "/encode", b'{"texts": []}', {"Content-Length": length})
    assert answer[0] == 400 and "Content-Length" in _error(answer)
    assert _request(httpd, "GET", "/health")[0] == 200


def test_json_nested_100000_deep_is_a_json_400(httpd):
    deep = b'{"texts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    answer = _request(httpd, "POST", "/encode", deep)
    assert answer[0] == 400 and "nested too deeply" in _error(answer)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_a_json_405(httpd, method):
    answer = _request(httpd, method, "/encode", b'{"texts": ["w1"]}')
    assert answer[0] == 405 and f"does not take {method}" in _error(answer)
    assert answer[1]["Allow"] == "POST"
    assert _request(httpd, method, "/nowhere")[0] == 404


def test_head_gets_a_405_without_a_body(httpd):
    status, headers, data = _request(httpd, "HEAD", "/health")
    assert status == 405 and headers["Content-Type"].startswith("application/json") and data == b""
    assert headers["Allow"] == "GET"
    assert _request(httpd, "GET", "/health")[0] == 200


def test_a_body_over_the_cap_is_a_json_413_the_client_can_read(httpd, monkeypatch):
    from docembed import server

    monkeypatch.setattr(server, "MAX_BODY_BYTES", 4096)
    big = b'{"texts": ["' + b"w1 " * 2_000_000 + b'"]}'  # 6 MB: more than the socket buffers hold
    answer = _request(httpd, "POST", "/encode", big)  # a reset or a broken pipe here fails the test
    assert answer[0] == 413 and "request body is over" in _error(answer)
    assert answer[1]["Connection"] == "close"
    assert _request(httpd, "GET", "/health")[0] == 200


@pytest.mark.parametrize(
    "path, body",
    [
        ("/encode", {"texts": ["w1"] * 4097}),
        ("/similarity", {"a": ["w1"] * 1025, "b": ["w2"] * 1024}),  # 1,049,600 scores
    ],
)
def test_too_many_texts_in_one_request_is_a_json_413(httpd, path, body):
    answer = _request(httpd, "POST", path, json.dumps(body).encode())
    assert answer[0] == 413 and "at most" in _error(answer)


def test_a_client_that_goes_away_is_one_log_line_not_a_traceback(httpd, capfd, monkeypatch):
    from docembed.runtime import settings

    monkeypatch.setattr(settings, "quiet", False)
    capfd.readouterr()
    with socket.create_connection(httpd.server_address[:2]) as client:
        client.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.2)  # the server waits for the rest of the body
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
    err = ""
    for _ in range(100):
        err += capfd.readouterr().err
        if "went away" in err or "Traceback" in err:
            break
        time.sleep(0.05)
    assert "Traceback" not in err and "Exception occurred" not in err and "error:" not in err, err
    assert len([line for line in err.splitlines() if "went away" in line]) == 1, err
    assert _request(httpd, "GET", "/health")[0] == 200


# --- outputs follow the umask ------------------------------------------------------------------------------
@pytest.fixture
def umask():
    """Sets the process umask for one test (restored after)."""
    before = os.umask(0o022)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_safetensors_outputs_follow_the_umask(capfd, model, tmp_path, umask, mask, mode):  # noqa: F811
    umask(mask)
    docs = corpus(tmp_path / "docs.jsonl", 4)
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", tmp_path / "e.safetensors").code == 0
    assert invoke(capfd, "-q", "fit", "tfidf", docs, "-o", tmp_path / "fitted").code == 0
    for written in (tmp_path / "e.safetensors", tmp_path / "fitted" / "model.safetensors"):
        assert oct(written.stat().st_mode & 0o777) == oct(mode), written


# --- evaluate --run: a non-finite score is refused --------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "q1 Q0 d2 2 nan run",
        "q1 Q0 d2 2 -inf run",
        '{"query_id": "q1", "results": [{"id": "d2", "score": NaN}]}',
        '{"source": "q1", "ranking": [{"id": "d2", "score": "Infinity"}]}',
    ],
)
def test_a_run_with_a_non_finite_score_is_refused(capfd, tmp_path, line):
    qrels, run = tmp_path / "qrels.txt", tmp_path / "run.txt"
    qrels.write_text("q1 0 d1 1\nq1 0 d2 0\n")
    run.write_text(f"q1 Q0 d1 1 0.9 run\n{line}\n")
    result = invoke(capfd, "evaluate", "--qrels", qrels, "--run", run)
    assert result.code == 1 and not result.out
    assert f"{run}:2: score" in one_line_error(result.err) and "not a finite number" in result.err


# --- paths read from metadata stay inside their folder -----------------------------------------------------
def _vectors(path, ids, seed):
    from docembed.io.embeddings import save_embeddings
    from docembed.types import EmbeddingSet

    rng = np.random.default_rng(seed)
    data = EmbeddingSet(rng.standard_normal((len(ids), 8)).astype(np.float32), list(ids), {"model": "m"})
    save_embeddings(data, str(path))
    return path


@pytest.fixture
def two_indexes(capfd, tmp_path):
    """`index` and `other.index`, side by side, each with an appended segment (added/0001)."""
    for name, prefix in (("index", "d"), ("other.index", "secret")):
        base = _vectors(tmp_path / f"{name}.npy", [f"{prefix}{i}" for i in range(40)], 1)
        assert (
            invoke(capfd, "-q", "index", "build", "--store", "faiss", base, "-o", tmp_path / name).code == 0
        )
        more = _vectors(tmp_path / f"{name}.more.npy", [f"{prefix}-added"], 2)
        assert invoke(capfd, "-q", "index", "add", tmp_path / name, more).code == 0
        assert json.loads((tmp_path / name / "meta.json").read_text())["segments"] == ["0001"]
    return tmp_path / "index", tmp_path / "other.index"


@pytest.mark.parametrize(
    "segment", ["../../other.index/added/0001", "OTHER/added/0001", "0001/../../../other.index/added/0001"]
)
def test_index_segments_outside_the_index_are_refused(capfd, tmp_path, two_indexes, segment):
    index, other = two_indexes
    meta = json.loads((index / "meta.json").read_text())
    meta["segments"] = [segment.replace("OTHER", str(other))]  # OTHER: an absolute path
    (index / "meta.json").write_text(json.dumps(meta))
    searched = invoke(capfd, "search", index, "--id", "d0", "-k", "50")
    assert searched.code == 1 and "secret" not in searched.out
    assert "meta.json" in one_line_error(searched.err) and "not a name inside" in searched.err
    added = invoke(capfd, "-q", "index", "add", index, _vectors(tmp_path / "new.npy", ["new"], 3))
    assert added.code == 1 and "not a name inside" in one_line_error(added.err)


def test_an_index_segment_linked_out_of_the_index_is_refused(capfd, two_indexes):
    index, other = two_indexes
    shutil.rmtree(index / "added" / "0001")
    (index / "added" / "0001").symlink_to(other / "added" / "0001")
    searched = invoke(capfd, "search", index, "--id", "d0", "-k", "50")
    assert searched.code == 1 and "not a name inside" in one_line_error(searched.err)


@pytest.mark.parametrize("file", ["../outside/secret.parquet", "OUTSIDE", "sub/../../outside/secret.parquet"])
def test_shard_manifest_files_outside_the_directory_are_refused(capfd, tmp_path, file):
    (tmp_path / "outside").mkdir()
    secret = _vectors(tmp_path / "outside" / "secret.parquet", ["secret"], 4)
    shards = tmp_path / "shards"
    shards.mkdir()
    _vectors(shards / "part-00000.parquet", ["d0", "d1"], 5)
    entry = {"index": 0, "file": "part-00000.parquet", "start": 0, "stop": 2, "status": "done", "rows": 2}
    (shards / "manifest.json").write_text(json.dumps({"shards": [entry]}))
    assert invoke(capfd, "-q", "index", "build", "--store", "faiss", shards, "-o", tmp_path / "ok").code == 0
    entry["file"] = str(secret) if file == "OUTSIDE" else file
    (shards / "manifest.json").write_text(json.dumps({"shards": [entry]}))
    result = invoke(capfd, "-q", "index", "build", "--store", "faiss", shards, "-o", tmp_path / "idx")
    assert result.code == 1 and not (tmp_path / "idx").exists()
    assert "manifest.json" in one_line_error(result.err) and "not a name inside" in result.err


def test_a_resumed_shard_job_reads_no_file_its_manifest_names_elsewhere(tmp_path):
    """`encode --engine ray` resuming: a 'done' shard whose manifest entry names another file is encoded
    again into its own file, never taken from there (finish() would read that file's metadata)."""
    from docembed.engines.manifest import InputSpec, Plan, prepare_output, write_manifest

    (tmp_path / "outside").mkdir()
    _vectors(tmp_path / "outside" / "secret.parquet", ["s0", "s1"], 4)
    out = tmp_path / "shards"
    out.mkdir()
    _vectors(out / "part-00000.parquet", ["d0", "d1"], 5)
    docs = corpus(tmp_path / "docs.jsonl", 2)
    job = {"rows_per_shard": 2}
    entry = {"index": 0, "file": "part-00000.parquet", "start": 0, "stop": 2, "status": "done", "rows": 2}
    plan = Plan(InputSpec(str(docs), "jsonl", "id", "text", False), 0, 2, [(0, 2)], [0], [])
    for name, kept in (("part-00000.parquet", "done"), ("../outside/secret.parquet", "pending")):
        write_manifest(out, {"job": job, "shards": [{**entry, "file": name}]})
        shard = prepare_output(out, job, plan, overwrite=False)["shards"][0]
        assert (shard["file"], shard["status"]) == ("part-00000.parquet", kept)
