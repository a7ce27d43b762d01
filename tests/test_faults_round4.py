"""Fault injection, round four (issue #49): new cases of each class of the probe, tried through the command
line as a user would, each of which failed before its fix. Outputs named as an input set's sidecar or put
inside an input model; fusion parts read from outside their folder; wrong answers in silence (a run or
qrels that rank or judge a document twice, parts of two precisions merged, number ids rewritten);
tracebacks and misleading errors on damaged files; `serve`: requests trickled past the timeout, ambiguous
framing, lone surrogates, a body refused before it is sent; files and folders that ignored the umask."""

import json
import os
import shutil
import socket
import threading
import time

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings
from test_faults import corpus, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)
from test_faults_round3 import umask  # noqa: F401 (sets the umask for one test)


def _encode(capfd, *args):
    return invoke(capfd, "-q", "encode", *args)


# --- 1. nothing written into an input ----------------------------------------------------------------------
@pytest.mark.parametrize("how", ["merge", "encode --reuse"])
def test_an_output_named_as_an_input_sets_sidecar_is_refused(capfd, model, tmp_path, how):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 4)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "a.npy", "--storage", "int8").code == 0
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "b.npy").code == 0
    kept = (tmp_path / "a.scales.npy").read_bytes()
    target = tmp_path / "a.scales.npy"
    if how == "merge":
        parts = [tmp_path / "a.npy", tmp_path / "b.npy"]
        result = invoke(capfd, "-q", "merge", *parts, "-o", target, "--overwrite")
    else:
        reuse = ["--reuse", tmp_path / "a.npy", "--storage", "int8"]
        result = _encode(capfd, docs, "-m", model, *reuse, "-o", target, "--overwrite")
    assert result.code == 1 and "sidecar name of the set" in one_line_error(result.err)
    assert target.read_bytes() == kept and len(load_embeddings(str(tmp_path / "a.npy"))) == 4


def test_a_new_set_named_as_a_dense_sets_sidecar_is_refused(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "x.npy").code == 0
    result = _encode(capfd, docs, "-m", model, "-o", tmp_path / "x.offsets.npy")  # read back as x's offsets
    assert result.code == 1 and "sidecar name" in one_line_error(result.err)
    assert not (tmp_path / "x.offsets.npy").exists() and not load_embeddings(str(tmp_path / "x.npy")).is_multi


def test_export_into_the_model_folder_it_reads_is_refused(capfd, tmp_path, tiny_sbert_dir):
    source = shutil.copytree(tiny_sbert_dir, tmp_path / "m")
    before = sorted(p.name for p in source.iterdir())
    result = invoke(capfd, "-q", "export", source, "-o", source / "st")
    assert result.code == 1 and "inside the input" in one_line_error(result.err)
    assert sorted(p.name for p in source.iterdir()) == before


def test_convert_long_into_the_checkpoint_folder_it_reads_is_refused(capfd, tmp_path, tiny_bert_dir):
    source = shutil.copytree(tiny_bert_dir, tmp_path / "bert")
    before = sorted(p.name for p in source.iterdir())
    args = ["-o", source / "long", "--max-length", "64", "--attention-window", "8"]
    result = invoke(capfd, "-q", "convert-long", source, *args)
    assert result.code == 1 and "inside the input" in one_line_error(result.err)
    assert sorted(p.name for p in source.iterdir()) == before


# --- 2. paths read from metadata stay in their folder ------------------------------------------------------
@pytest.fixture(scope="module")
def fusion_dir(tiny_tfidf_dir, tmp_path_factory):
    """bm25 + the tiny tf-idf, fitted and saved (its lexical part inside it, as `lexical/`)."""
    from docembed.models.fusion import FusionScorer

    fusion = FusionScorer.from_parts("bm25", tiny_tfidf_dir)
    fusion.fit([f"w{i} w{i + 1} w{i + 2}" for i in range(0, 60, 3)])
    folder = tmp_path_factory.mktemp("fusion") / "fu"
    fusion.save(folder)
    return folder


@pytest.mark.parametrize("where", ["../elsewhere/lex", "an absolute path", "a link", "model ../tfidf"])
def test_a_fusion_part_outside_its_folder_is_refused(capfd, tmp_path, fusion_dir, tiny_tfidf_dir, where):
    folder = shutil.copytree(fusion_dir, tmp_path / "fu")
    outside = shutil.copytree(folder / "lexical", tmp_path / "elsewhere" / "lex")
    shutil.copytree(tiny_tfidf_dir, tmp_path / "tfidf")
    payload = json.loads((folder / "config.json").read_text())
    if where == "a link":
        shutil.rmtree(folder / "lexical")
        (folder / "lexical").symlink_to(outside)
    elif where.startswith("model"):
        payload["config"]["model"] = "../tfidf"
    else:
        payload["config"]["lexical"] = str(outside) if where == "an absolute path" else where
    (folder / "config.json").write_text(json.dumps(payload))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": "w1 w2", "candidates": ["w1 w2 w3", "w40 w41"]}) + "\n")
    result = invoke(capfd, "-q", "rerank", tasks, "-m", folder)
    assert result.code == 1 and "is not inside" in one_line_error(result.err)


# --- 3. no wrong answer in silence -------------------------------------------------------------------------
def _evaluate(capfd, tmp_path, qrels: str, run: str, run_name: str = "run.txt"):
    (tmp_path / "qrels.txt").write_text(qrels)
    (tmp_path / run_name).write_text(run)
    return invoke(capfd, "-q", "evaluate", "--qrels", tmp_path / "qrels.txt", "--run", tmp_path / run_name)


def test_qrels_that_judge_a_document_twice_apart_are_refused(capfd, tmp_path):
    result = _evaluate(capfd, tmp_path, "q1 0 d1 1\nq1 0 d2 0\nq1 0 d1 0\n", "q1 Q0 d1 1 0.9 r\n")
    assert result.code == 1 and "judged 1 and 0" in one_line_error(result.err)


TWICE = [{"id": "d2", "score": 0.9}, {"id": "d1", "score": 0.5}, {"id": "d2", "score": 0.1}]


@pytest.mark.parametrize(
    "run, name",
    [
        ("q1 Q0 d2 1 0.9 r\nq1 Q0 d1 2 0.5 r\nq1 Q0 d2 3 0.1 r\n", "run.txt"),
        (json.dumps({"query_id": "q1", "results": TWICE}), "r.jsonl"),  # a `search` row
    ],
)
def test_a_run_that_ranks_a_document_twice_is_refused(capfd, tmp_path, run, name):
    result = _evaluate(capfd, tmp_path, "q1 0 d1 1\nq1 0 d2 0\n", run + "\n", name)
    assert result.code == 1 and "ranked twice" in one_line_error(result.err)


def _parts(capfd, model, tmp_path, *storages):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 4)
    parts = []
    for i, storage in enumerate(storages):
        part = tmp_path / f"p{i}.npy"
        args = ["--shard", f"{i}/{len(storages)}", "--storage", storage]
        assert _encode(capfd, docs, "-m", model, "-o", part, *args).code == 0
        parts.append(part)
    return parts


def test_merging_int8_and_float32_parts_is_refused(capfd, model, tmp_path):  # noqa: F811
    parts = _parts(capfd, model, tmp_path, "int8", "float32")
    result = invoke(capfd, "-q", "merge", *parts, "-o", tmp_path / "m.npy")
    assert result.code == 1 and "int8 vectors and" in one_line_error(result.err)
    assert not (tmp_path / "m.npy").exists()


def test_merged_int8_parts_stay_int8(capfd, model, tmp_path):  # noqa: F811
    parts = _parts(capfd, model, tmp_path, "int8", "int8")
    assert invoke(capfd, "-q", "merge", *parts, "-o", tmp_path / "m.npy").code == 0
    merged = load_embeddings(str(tmp_path / "m.npy"))
    assert merged.metadata["storage"] == "int8" and (tmp_path / "m.scales.npy").exists()
    joined = np.concatenate([load_embeddings(str(p)).data for p in parts])
    assert np.allclose(merged.data, joined, rtol=1e-6, atol=0)


def test_number_ids_come_back_as_they_were_written(capfd, model, tmp_path):  # noqa: F811
    written = ["1.50", "1e2", "1e999", "2e999", "7"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"id": {i}, "text": "w{k} w{k + 1}"}}\n' for k, i in enumerate(written)))
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e.npy").code == 0
    assert load_embeddings(str(tmp_path / "e.npy")).ids == written


# --- 4. one line, saying what is wrong ---------------------------------------------------------------------
@pytest.fixture
def bm25_dir(capfd, tmp_path):
    docs = corpus(tmp_path / "c.jsonl", 6)
    assert invoke(capfd, "-q", "fit", "bm25", docs, "-o", tmp_path / "bm25").code == 0
    return tmp_path / "bm25"


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe{}"])
@pytest.mark.parametrize("family", ["tfidf", "bm25"])
def test_a_damaged_vocab_json_is_one_line(capfd, tmp_path, model, bm25_dir, family, content):  # noqa: F811
    folder = shutil.copytree(model if family == "tfidf" else bm25_dir, tmp_path / "m")
    (folder / "vocab.json").write_bytes(content)
    result = invoke(capfd, "-q", "similarity", "w1 w2", "w2 w3", "-m", folder)
    assert result.code == 1 and "vocab.json is corrupt" in one_line_error(result.err)


def test_a_run_that_is_not_utf8_is_one_line(capfd, tmp_path):
    (tmp_path / "run.txt").write_bytes(b"q1 Q0 d1 1 0.9 r\xff\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d1 1\n")
    result = invoke(capfd, "-q", "evaluate", "--qrels", tmp_path / "qrels.txt", "--run", tmp_path / "run.txt")
    assert result.code == 1 and "not UTF-8" in one_line_error(result.err)


def _damaged_copy(capfd, model, tmp_path):  # noqa: F811
    assert _encode(capfd, corpus(tmp_path / "docs.jsonl", 3), "-m", model, "-o", tmp_path / "b.npy").code == 0
    return tmp_path / "b.npy"


def test_a_set_of_python_objects_is_refused_without_pickle_advice(capfd, model, tmp_path):  # noqa: F811
    good = _damaged_copy(capfd, model, tmp_path)
    for sidecar in ("ids.txt", "meta.json"):
        shutil.copy(tmp_path / f"b.{sidecar}", tmp_path / f"o.{sidecar}")
    np.save(tmp_path / "o.npy", np.array([[1, 2]] * 3, dtype=object), allow_pickle=True)
    result = invoke(capfd, "-q", "merge", tmp_path / "o.npy", good, "-o", tmp_path / "m.npy")
    error = one_line_error(result.err)
    assert result.code == 1 and "Python objects" in error and "allow_pickle" not in error


def test_an_npz_without_ids_says_what_it_lacks(capfd, model, tmp_path):  # noqa: F811
    good = _damaged_copy(capfd, model, tmp_path)
    np.savez(tmp_path / "n.npz", vectors=np.zeros((3, 4), dtype=np.float32))
    result = invoke(capfd, "-q", "merge", tmp_path / "n.npz", good, "-o", tmp_path / "m.npy")
    assert result.code == 1 and "holds no 'ids'" in one_line_error(result.err)


# --- 5. serve: the request timeout is a deadline for the whole request; framing and text checked ----------
@pytest.fixture(scope="module")
def served(tiny_tfidf_dir):
    """The tiny tf-idf model and an index of six documents, served with a 1-second request timeout."""
    import docembed
    from docembed.faiss_index import VectorIndex
    from docembed.server import EmbeddingService, make_server
    from docembed.types import EmbeddingSet

    tfidf = docembed.load(tiny_tfidf_dir, device="cpu")
    vectors = tfidf.encode([f"w{i} w{i + 1} w{i + 2}" for i in range(6)])
    index = VectorIndex.build(EmbeddingSet(vectors, [f"d{i}" for i in range(6)], tfidf.encoder.metadata()))
    server = make_server(EmbeddingService(tfidf, index), "127.0.0.1", 0, request_timeout=1.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _read_until_closed(sock, limit: float = 5.0) -> bytes:
    sock.settimeout(limit)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:  # reset: nothing more to read
        pass
    return answer


def _trickle(server, opening: bytes, drip: bytes, every: float = 0.2, limit: float = 6.0):
    """Send `opening`, then `drip` one byte every `every` seconds (each well within the timeout) until the
    server answers or closes, or `limit` seconds pass: (what it sent back, seconds until then)."""
    with socket.create_connection(server.server_address[:2]) as sock:
        started = time.monotonic()
        sock.sendall(opening)
        sock.settimeout(every)
        for byte in drip:
            try:
                sock.recv(1, socket.MSG_PEEK)
                break  # answered, or closed
            except TimeoutError:  # still waiting for the rest: one more byte
                pass
            except OSError:  # reset
                break
            if time.monotonic() - started > limit:
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
        took = time.monotonic() - started
        return _read_until_closed(sock), took


def _exchange(server, request: bytes) -> bytes:
    """Everything the server sends back for `request` (its connection closed by the server)."""
    with socket.create_connection(server.server_address[:2]) as sock:
        sock.sendall(request)
        return _read_until_closed(sock)


def _json_answer(answer: bytes) -> tuple[bytes, str]:
    """(status line, the one-line error) of a JSON error answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    message = json.loads(body)["error"]
    assert message and "\n" not in message
    return head.split(b"\r\n")[0], message


def test_a_request_line_trickled_a_byte_at_a_time_is_cut_off_at_the_deadline(served):
    answer, took = _trickle(served, b"GET /", b"x" * 100)
    assert answer == b"" and took < 3, (answer, took)  # no request to answer: closed


def test_headers_trickled_a_byte_at_a_time_get_a_408_at_the_deadline(served):
    answer, took = _trickle(served, b"POST /encode HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a" * 100)
    status, message = _json_answer(answer)
    assert status.startswith(b"HTTP/1.1 408") and took < 3, (answer, took)
    assert "did not arrive within 1 s" in message


def test_a_body_trickled_a_byte_at_a_time_gets_a_408_at_the_deadline(served):
    opening = b'POST /encode HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{"texts": ["'
    answer, took = _trickle(served, opening, b"w" * 200)
    status, message = _json_answer(answer)
    assert status.startswith(b"HTTP/1.1 408") and b"Connection: close" in answer and took < 3, (answer, took)
    assert "did not arrive within 1 s" in message


def test_content_lengths_that_disagree_are_a_400(served):
    head = b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\nContent-Length: 50\r\n\r\n"
    status, message = _json_answer(_exchange(served, head + b'{"texts": []}'))
    assert status.startswith(b"HTTP/1.1 400") and "disagree" in message


def test_a_chunked_body_gets_one_411_not_a_request_made_of_its_chunks(served):
    head = b"POST /encode HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = _exchange(served, head + b'13\r\n{"texts": ["w1 w2"]}\r\n0\r\n\r\n')
    status, message = _json_answer(answer)
    assert status.startswith(b"HTTP/1.1 411") and "Content-Length" in message
    assert answer.count(b"HTTP/1.1 ") == 1  # the chunks were not read as a second request


def test_a_query_with_a_lone_surrogate_is_a_400_not_a_dropped_connection(served):
    body = b'{"queries": ["w1 \\ud800"], "k": 2}'
    head = b"POST /search HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
    status, message = _json_answer(_exchange(served, head % len(body) + body))
    assert status.startswith(b"HTTP/1.1 400") and "lone surrogate" in message


def test_a_body_over_the_cap_is_refused_before_it_is_sent(served):
    head = b"POST /encode HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    started = time.monotonic()
    answer = _exchange(served, head + b"Content-Length: 999999999999\r\n\r\n")  # and waits for a 100
    assert answer.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 3, answer[:80]


# --- 6. what is written follows the umask ------------------------------------------------------------------
TRAINERS = {
    "train-setenc": ["--buckets", "64", "--word-dim", "8", "--heads", "2", "--dim", "8", "--hidden", "8"],
    "train-quickthoughts": ["--hidden", "8", "--min-count", "1"],
}


@pytest.mark.parametrize("command", sorted(TRAINERS))
def test_a_trained_models_weights_follow_the_umask(capfd, tmp_path, umask, command):  # noqa: F811
    umask(0o027)
    docs = tmp_path / "docs.jsonl"
    sentences = ["the cat sat on the mat.", "a dog ran in the park.", "stocks fell.", "kittens play."]
    rows = [{"id": f"d{i}", "text": " ".join(sentences[(i + k) % 4] for k in range(3))} for i in range(8)]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [*TRAINERS[command], "-b", "4", "--max-steps", "1"]
    assert invoke(capfd, "-q", command, docs, "-o", tmp_path / "m", *args).code == 0
    assert os.stat(tmp_path / "m" / "model.safetensors").st_mode & 0o777 == 0o640


def test_an_inference_export_folder_follows_the_umask(tmp_path, umask):  # noqa: F811
    from docembed.models.inference_backends import _export_atomically

    umask(0o022)

    def export(folder):
        (folder / "model.onnx").write_bytes(b"onnx")
        return {}

    _export_atomically(tmp_path / "inference" / "onnx-fp32-x", export)
    assert os.stat(tmp_path / "inference" / "onnx-fp32-x").st_mode & 0o777 == 0o755
