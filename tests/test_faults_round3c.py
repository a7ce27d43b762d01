"""Fault injection, round three, the rest (issue #49): one huge document is streamed through bounded memory
with the vectors of the unstreamed path; a second writer of the same output fails at once while the first
holds it; evaluate -o keeps existing results without --overwrite; non-finite weights are refused at load for
the families that keep them in numpy (and sbert, whose weights sentence-transformers loads); `serve` cuts off
a client that sends half a request."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from functools import partial

import numpy as np
import pytest

from cli_helpers import DOCEMBED, invoke
from docembed.io.embeddings import load_embeddings
from test_faults import corpus, leftovers, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")


# --- 1: one huge document costs a block's memory, and gives the vectors it gave -----------------------
SENTENCES = [
    "Dr. Smith met the committee on Tuesday, e.g. to review the budget.",
    'He said: "The pumps are failing." Nobody was surprised!',
    "(Costs rose quickly.) Two pumps, at 3.14 million each, don't come cheap?!",
    "Naïve café owners in Tōkyō — and ΣΑΣ — wasn't the U.S.A. involved...",
    "\n\n",
]


def _long_text(chars: int) -> str:
    picks = np.random.default_rng(0).integers(len(SENTENCES), size=chars // 20 + 1)
    return " ".join(SENTENCES[i] for i in picks)[:chars]


@pytest.fixture
def streamed(monkeypatch):
    """Call `encode` twice: as it is (the texts read whole) and with every text over 2,000 characters read
    in blocks of 700 (many cuts): the two results, for the comparison."""
    from docembed import tensors

    def both(encode):
        whole = encode()
        monkeypatch.setattr(tensors, "STREAM_CHARS", 2_000)
        monkeypatch.setattr(tensors, "BLOCK_CHARS", 700)
        try:
            return whole, encode()
        finally:
            monkeypatch.setattr(tensors, "STREAM_CHARS", 1_000_000)
            monkeypatch.setattr(tensors, "BLOCK_CHARS", 100_000)

    return both


TEXTS = ["a short text.", _long_text(30_000), "", "another short one"]


def _same(a, b, exact=False):
    """Dense arrays or MultiVectors: the same shape and positions, values equal (or within 1e-6)."""
    if hasattr(a, "offsets"):
        assert np.array_equal(a.offsets, b.offsets)
        assert (a.positions is None) == (b.positions is None)
        assert a.positions is None or np.array_equal(a.positions, b.positions)
        a, b = a.vectors, b.vectors
    assert a.shape == b.shape and (np.array_equal(a, b) if exact else np.abs(a - b).max() <= 1e-6)


def test_blocks_and_streamed_windows_are_the_whole_texts():
    from docembed.tensors import streamed_token_windows, text_blocks, token_windows

    rng = np.random.default_rng(0)
    for _ in range(500):
        n, width = int(rng.integers(0, 60)), int(rng.integers(1, 9))
        overlap = int(rng.integers(0, width))
        cuts = sorted(rng.choice(n + 1, size=min(n + 1, 4), replace=False).tolist())
        pieces = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
        expected = [(s, list(w)) for s, w in token_windows(list(range(n)), width, overlap)]
        assert list(streamed_token_windows(pieces, width, overlap)) == expected
    text = _long_text(5_000)
    blocks = list(text_blocks(text, 300))
    assert "".join(blocks) == text and all(len(b) <= 300 and b[:1] in " \n" for b in blocks[1:])


def test_long_texts_are_split_into_the_same_sentences_and_words(monkeypatch):
    from docembed import tensors
    from docembed.text import iter_sentences, split_sentences, term_counts, tokenize

    text = _long_text(40_000)
    whole = (split_sentences(text), Counter(tokenize(text, True, "simple-v1")))
    monkeypatch.setattr(tensors, "STREAM_CHARS", 1_000)
    for size in (40, 333, 5_000):  # blocks shorter than a sentence too: the carried sentence grows
        monkeypatch.setattr(tensors, "BLOCK_CHARS", size)
        assert (list(iter_sentences(text)), term_counts(text)) == whole


def test_sbert_streams_a_long_text_to_the_same_vectors(streamed, tiny_sbert_dir):
    from docembed.models.registry import load_model

    for output, overlap in (("chunks", 0), ("windows", 3)):
        encoder = load_model(str(tiny_sbert_dir))
        encoder.config.output, encoder.config.window_overlap = output, overlap
        _same(*streamed(partial(encoder.encode, TEXTS, batch_size=8)))
        _same(*streamed(partial(encoder.encode, TEXTS[1:2], batch_size=8)), exact=True)  # the same batches


def test_static_streams_a_long_text_to_the_same_vectors(streamed, minilm_tokenizer):
    from docembed.models.static import StaticConfig, StaticEncoder

    encoder = StaticEncoder(StaticConfig(vocab_size=len(minilm_tokenizer), dim=8), tokenizer=minilm_tokenizer)
    encoder.set_table(np.random.default_rng(0).normal(size=(len(minilm_tokenizer), 8)).astype(np.float32))
    _same(*streamed(partial(encoder.encode, TEXTS)), exact=True)


def test_the_word_models_stream_a_long_text_to_the_same_vectors_and_scores(streamed):
    from docembed.faiss_index import BM25Index
    from docembed.io.readers import Document
    from docembed.models.baselines import (
        BM25Config,
        BM25Scorer,
        GloveAverageEncoder,
        GloveConfig,
        TfidfConfig,
        TfidfEncoder,
    )
    from docembed.text import tokenize

    words = sorted(set(tokenize(TEXTS[1], True, "simple-v1")))
    vectors = np.random.default_rng(0).normal(size=(len(words), 6)).astype(np.float32)
    glove = GloveAverageEncoder(GloveConfig(), _tables=(words, vectors))
    _same(*streamed(lambda: glove.encode(TEXTS)), exact=True)
    for ngrams in (1, 3):  # n-grams that span a cut are counted too
        tfidf = TfidfEncoder(TfidfConfig(ngram_max=ngrams, svd_dim=0)).fit(SENTENCES)
        _same(*streamed(partial(tfidf.encode, TEXTS)), exact=True)
    bm25 = BM25Scorer(BM25Config(analyzer="english")).fit(SENTENCES)
    queries = ["pumps failing", "committee budget"]
    _same(*streamed(lambda: bm25.score_matrix(queries, TEXTS)), exact=True)
    fitted = streamed(lambda: BM25Scorer(BM25Config()).fit(TEXTS).doc_freq)
    assert fitted[0] == fitted[1]
    documents = [Document(str(i), text) for i, text in enumerate(TEXTS)]
    hits = streamed(lambda: BM25Index.build(documents).search_texts(queries, k=4))
    assert hits[0] == hits[1]


def test_quickthoughts_streams_a_long_text_to_the_same_vectors(streamed):
    import torch

    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder
    from docembed.text import PAD, UNK, Vocabulary, tokenize

    vocabulary = Vocabulary([PAD, UNK, *sorted(set(tokenize(TEXTS[1])))])
    for output in ("mean", "sentences"):
        torch.manual_seed(0)
        config = QuickThoughtsConfig(len(vocabulary), embedding_dim=6, hidden_size=4, output=output)
        encoder = QuickThoughtsEncoder(config, vocabulary=vocabulary)
        _same(*streamed(partial(encoder.encode, TEXTS)))  # other sentences share the GRU's batches
        _same(*streamed(partial(encoder.encode, TEXTS[1:2])), exact=True)


@pytest.mark.slow  # two minutes on one CPU thread: `make test-all`
def test_nugget_and_the_student_stream_a_long_text_to_the_same_vectors(
    streamed, minilm_tokenizer, tiny_bert_dir
):
    from docembed.models.student import convert_long
    from tiny_models import tiny_nugget

    nugget = tiny_nugget(minilm_tokenizer, long_documents="windows")
    nugget.model.eval()
    _same(*streamed(partial(nugget.encode, TEXTS, batch_size=8)))  # its batches go shortest first: not
    _same(*streamed(partial(nugget.encode, TEXTS[1:2], batch_size=8)))  # the streamed ones, so not exact
    student = convert_long(str(tiny_bert_dir), max_length=48, attention_window=8)
    for mode in ("windows", "late-chunks"):
        student.set_long_documents(mode)
        _same(*streamed(partial(student.encode, TEXTS, batch_size=4)))
        _same(*streamed(partial(student.encode, TEXTS[1:2], batch_size=4)), exact=True)


def _peak_mb(*args) -> float:
    """Peak resident memory (MB) of `docembed -q encode ARGS` in a fresh process, read from wait4."""
    proc = subprocess.Popen([DOCEMBED, "-q", "encode", *map(str, args)], env=ENV, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read()
    return usage.ru_maxrss / 1024


@pytest.mark.parametrize("family", ["static", "glove-avg"])
def test_a_4_mb_document_costs_little_more_memory_than_a_page(tmp_path, family):
    page, huge = tmp_path / "page.jsonl", tmp_path / "huge.jsonl"
    page.write_text(json.dumps({"id": "p", "text": _long_text(3_000)}) + "\n")
    huge.write_text(json.dumps({"id": "h", "text": _long_text(4_000_000)}) + "\n")
    _peak_mb(page, "-m", family, "-o", tmp_path / "first.npy")  # fills the home's caches (GloVe's words)
    base = _peak_mb(page, "-m", family, "-o", tmp_path / "page.npy")
    # reading the line costs a few copies of it (bytes, str, the JSON value: ~16 MB); read whole, the text
    # cost 250 MB (glove-avg) and 600 MB (static) more
    peak = _peak_mb(huge, "-m", family, "-o", tmp_path / "huge.npy")
    assert peak - base < 80, f"{family}: {peak:.0f} MB for 4 MB of text, {base:.0f} MB for a page"


# --- 2: one writer per output, from the check on ------------------------------------------------------------
# `docembed encode`, whose encoding waits (after the output was checked) until the file GO exists; it writes
# STARTED when it gets there. So a test knows the first writer is mid-work and decides when it goes on.
HELD_ENCODE = textwrap.dedent(
    """
    import os, pathlib, sys, time
    import docembed.encoding as encoding

    started, go = pathlib.Path(os.environ["STARTED"]), pathlib.Path(os.environ["GO"])
    original = encoding.encode_documents

    def held(*args, **kwargs):
        started.write_text(str(os.getpid()))
        deadline = time.time() + 60
        while not go.exists() and time.time() < deadline:
            time.sleep(0.05)
        return original(*args, **kwargs)

    encoding.encode_documents = held
    from docembed.cli import main

    sys.argv = ["docembed", *sys.argv[1:]]
    main()
    """
)


def _held_encode(tmp_path, *args):
    env = dict(ENV, STARTED=str(tmp_path / "started"), GO=str(tmp_path / "go"))
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_ENCODE, "-q", "encode", *map(str, args)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    return proc


def _encode_process(*args):
    return subprocess.run(
        [DOCEMBED, "-q", "encode", *map(str, args)], capture_output=True, text=True, env=ENV, timeout=120
    )


def test_a_second_writer_of_the_same_output_fails_at_once_while_the_first_holds_it(model, tmp_path):  # noqa: F811
    a, b = corpus(tmp_path / "a.jsonl", 20, "a"), corpus(tmp_path / "b.jsonl", 20, "b")
    out = tmp_path / "same.npy"
    first = _held_encode(tmp_path, a, "-m", model, "-o", out, "--overwrite")
    try:
        second = _encode_process(b, "-m", model, "-o", out, "--overwrite")
        assert second.returncode == 1
        message = one_line_error(second.stderr)
        assert "another docembed is writing" in message and "same.npy" in message
        assert f"pid {first.pid}" in message
    finally:
        (tmp_path / "go").write_text("")
        assert first.wait(timeout=120) == 0, first.stderr.read()
    written = load_embeddings(str(out))
    assert len(written) == 20 and all(i.startswith("a") for i in written.ids)
    assert leftovers(tmp_path) == []
    # once the first is done, the next writer goes ahead
    assert _encode_process(b, "-m", model, "-o", out, "--overwrite").returncode == 0
    assert all(i.startswith("b") for i in load_embeddings(str(out)).ids) and leftovers(tmp_path) == []


def test_a_killed_writer_leaves_no_lock_that_holds_anyone_back(model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 5)
    out = tmp_path / "x.npy"
    first = _held_encode(tmp_path, docs, "-m", model, "-o", out)
    assert (tmp_path / ".x.npy.lock").read_text() == str(first.pid)  # held from the check, before the work
    first.send_signal(signal.SIGKILL)
    first.wait()
    result = _encode_process(docs, "-m", model, "-o", out)
    assert result.returncode == 0, result.stderr
    assert len(load_embeddings(str(out))) == 5 and leftovers(tmp_path) == []


def test_a_failed_command_releases_its_claim_and_leaves_no_lock(capfd, model, tmp_path):  # noqa: F811
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = invoke(capfd, "-q", "encode", empty, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 1 and "empty" in one_line_error(result.err)
    assert leftovers(tmp_path) == []
    # and the same process may write it next (the claim is gone, not held by a forgotten descriptor)
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", tmp_path / "x.npy").code == 0
    assert leftovers(tmp_path) == []


def test_an_unheld_lock_file_is_no_user_file_and_is_swept(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    out = tmp_path / "x.npy"
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", out).code == 0
    (tmp_path / ".x.npy.lock").write_text("999999999")  # an older docembed's, or a reused pid: not held
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", out, "--overwrite").code == 0
    assert leftovers(tmp_path) == [] and len(load_embeddings(str(out))) == 3


# --- 3: evaluate -o keeps the result files already there ----------------------------------------------------
def test_evaluate_into_a_folder_with_results_needs_overwrite(capfd, tmp_path):
    out = tmp_path / "results"
    args = ["-q", "evaluate", "stsb", "-m", "glove-avg", "--limit", "20", "-o", out]
    assert invoke(capfd, *args).code == 0
    before = (out / "stsb__glove-avg.json").read_bytes()
    result = invoke(capfd, *args)
    assert result.code == 1 and "--overwrite" in one_line_error(result.err)
    assert (out / "stsb__glove-avg.json").read_bytes() == before
    assert invoke(capfd, *args, "--overwrite").code == 0


# --- 4: non-finite weights are refused at load, for every family --------------------------------------------
def _nan_safetensors(path, keys=None):
    """Overwrite the floating arrays of a safetensors file (those in `keys`, or all) with NaN."""
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(path))
    for key, array in arrays.items():
        if np.issubdtype(array.dtype, np.floating) and (keys is None or key in keys):
            arrays[key] = np.full_like(array, np.nan)
    save_file(arrays, str(path))


def _refused(capfd, tmp_path, folder, named="model.safetensors"):
    docs = corpus(tmp_path / "docs.jsonl", 3)
    result = invoke(capfd, "-q", "encode", docs, "-m", folder, "-o", tmp_path / "e.npy")
    message = one_line_error(result.err)
    assert result.code == 1 and "not finite" in message and named in message, message
    assert not (tmp_path / "e.npy").exists()


def test_tfidf_with_nan_idf_is_refused_at_load(capfd, model, tmp_path):  # noqa: F811
    folder = tmp_path / "m"
    shutil.copytree(model, folder)
    _nan_safetensors(folder / "model.safetensors")
    _refused(capfd, tmp_path, folder)


def test_glove_avg_with_nan_vectors_is_refused_at_load(capfd, tmp_path):
    from docembed.models.baselines import GloveAverageEncoder, GloveConfig

    words = [f"w{i}" for i in range(64)]
    matrix = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    folder = tmp_path / "m"
    GloveAverageEncoder(GloveConfig(), _tables=(words, matrix)).save(folder)
    _nan_safetensors(folder / "model.safetensors")
    _refused(capfd, tmp_path, folder)


def test_word_vectors_with_nan_are_refused_when_read(tmp_path):
    from docembed.errors import DocembedError
    from docembed.models.word_vectors import read_word_vectors

    path = tmp_path / "vectors.txt"
    path.write_text("good 0.1 0.2\nbad nan 0.3\n")
    with pytest.raises(DocembedError, match="'bad' is not finite"):
        read_word_vectors(path)


def test_bm25_with_a_nan_average_length_is_refused_at_load(tmp_path):
    from docembed.errors import CorruptModelError
    from docembed.models.baselines import BM25Config, BM25Scorer

    folder = tmp_path / "m"
    BM25Scorer(BM25Config(), name="bm25").fit(["w1 w2 w3", "w2 w4"]).save(folder)
    vocab = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(json.dumps({**vocab, "avg_len": float("nan")}))
    with pytest.raises(CorruptModelError, match="avg_len"):
        BM25Scorer.load(folder)


def test_static_with_a_nan_table_is_refused_at_load(capfd, tmp_path, minilm_tokenizer):
    from docembed.models.static import StaticConfig, StaticEncoder

    config = StaticConfig(vocab_size=len(minilm_tokenizer), dim=4)
    folder = tmp_path / "m"
    StaticEncoder(config, tokenizer=minilm_tokenizer).save(folder)
    _nan_safetensors(folder / "model.safetensors")
    _refused(capfd, tmp_path, folder)


def test_paragraph_vector_with_nan_weights_is_refused_at_load(capfd, tmp_path):
    from docembed.models.paragraph_vector import PVConfig, train_paragraph_vectors

    texts = [" ".join(f"w{(i * 7 + k) % 64}" for k in range(12)) for i in range(40)]
    config = PVConfig(mode="dbow", vector_size=8, epochs=2, min_count=1, workers=1, encode_workers=1)
    encoder, _ = train_paragraph_vectors(texts, config)
    folder = tmp_path / "m"
    encoder.save(folder)
    _nan_safetensors(folder / "model.safetensors", keys={"dbow.word_vectors"})
    _refused(capfd, tmp_path, folder)


def test_quickthoughts_with_nan_word_vectors_is_refused_at_load(capfd, tmp_path):
    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder
    from docembed.text import PAD, UNK, Vocabulary

    vocabulary = Vocabulary([PAD, UNK, *(f"w{i}" for i in range(64))])
    config = QuickThoughtsConfig(vocab_size=len(vocabulary), embedding_dim=6, hidden_size=4)
    folder = tmp_path / "m"
    QuickThoughtsEncoder(config, vocabulary=vocabulary).save(folder)
    _nan_safetensors(folder / "model.safetensors", keys={"embedding.weight"})
    _refused(capfd, tmp_path, folder)


def test_sbert_with_nan_weights_is_refused_at_load(capfd, tmp_path, tiny_sbert_dir):
    folder = tmp_path / "m"
    shutil.copytree(tiny_sbert_dir, folder)
    weights = folder / "sentence_transformer" / "model.safetensors"
    from safetensors.numpy import load_file

    first = next(k for k, v in load_file(str(weights)).items() if np.issubdtype(v.dtype, np.floating))
    _nan_safetensors(weights, keys={first})
    _refused(capfd, tmp_path, folder)


# --- 5: serve cuts off a client that sends half a request ---------------------------------------------------
@pytest.fixture
def impatient_server(model):  # noqa: F811
    import docembed
    from docembed.server import EmbeddingService, make_server

    service = EmbeddingService(docembed.load(model, device="cpu"))
    server = make_server(service, "127.0.0.1", 0, request_timeout=0.5)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _read_all(sock, limit=10.0) -> bytes:
    """Everything the server sends until it closes the connection (a hang fails the test)."""
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(
    "half",
    [
        b"POST /enc",  # half a request line
        b"",  # a connection that never sends anything
    ],
)
def test_a_request_cut_short_is_closed_after_the_timeout(impatient_server, half):
    with socket.create_connection(impatient_server.server_address[:2]) as sock:
        sock.sendall(half)
        started = time.monotonic()
        assert _read_all(sock) == b""  # closed, not held: no request to answer
        assert time.monotonic() - started < 5


def test_headers_cut_short_get_a_408_and_the_connection_closes(impatient_server):
    with socket.create_connection(impatient_server.server_address[:2]) as sock:
        sock.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Le")  # a request line, half the headers
        started = time.monotonic()
        answer = _read_all(sock)
        assert time.monotonic() - started < 5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
    assert "headers did not arrive within 0.5 s" in json.loads(body)["error"]


def test_each_request_of_a_connection_has_its_own_deadline(impatient_server):
    import http.client

    connection = http.client.HTTPConnection(*impatient_server.server_address[:2], timeout=10)
    try:
        sockets = set()
        for _ in range(3):  # 0.3 s apart: the connection outlives one timeout, no request takes one
            time.sleep(0.3)
            connection.request("GET", "/health")
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            sockets.add(id(connection.sock))
        assert len(sockets) == 1  # one connection kept alive, not reopened
    finally:
        connection.close()


def test_a_body_cut_short_gets_a_408_and_the_connection_closes(impatient_server):
    with socket.create_connection(impatient_server.server_address[:2]) as sock:
        sock.sendall(b'POST /encode HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"texts": [')
        started = time.monotonic()
        answer = _read_all(sock)
        assert time.monotonic() - started < 5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
    assert "did not arrive within 0.5 s" in json.loads(body)["error"]


def test_the_server_still_answers_after_clients_were_cut_off(impatient_server):
    stalled = [socket.create_connection(impatient_server.server_address[:2]) for _ in range(4)]
    try:
        for sock in stalled:
            sock.sendall(b"GET /hea")
        time.sleep(1.0)  # past the timeout: their threads are free again
        with socket.create_connection(impatient_server.server_address[:2]) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _read_all(sock).startswith(b"HTTP/1.1 200")
    finally:
        for sock in stalled:
            sock.close()


def test_serve_refuses_a_timeout_that_is_not_positive(capfd, model):  # noqa: F811
    result = invoke(capfd, "serve", "-m", model, "--request-timeout", "0")
    assert result.code == 2 and "request-timeout" in result.err
