"""`docembed serve`: one process that loads a model (and an index) once and answers JSON over HTTP, so that
interactive use pays the model's load once instead of on every `similarity` / `search` command.

Routes (request and response bodies are JSON objects; an error is {"error": "one line"} with status 400 for
a bad request, 404 for an unknown path or id, 405 for the wrong method, 413 for a body over MAX_BODY_BYTES or
a list over MAX_TEXTS texts):
- GET  /health      {"model", "family", "dim", "multi_vector", "scorer", "documents", "normalized",
                    "passage_temperature", "max_tokens", "metadata", "identity"}: documents null without an
                    index; a scorer (a fusion) has no embeddings and dim null; metadata is the model's
                    `metadata()`, what `docembed encode` writes beside its vectors, and identity its
                    `encoding.model_identity` (encode --reuse), so a remote client writes the same outputs
- POST /encode      {"texts": [...], "batch_size": N (optional)} -> {"model", "embeddings"}: one vector per
                    text, or for a multi-vector model a list of vectors per text (and "positions", a list of
                    token positions per text, where the model gives them), as `docembed encode` computes
                    them; float32 values, exact (JSON's shortest repr of each float32 reads back as the same
                    float32)
- POST /similarity  {"a": [...], "b": [...]} -> {"scores"}: every a against every b (Model.similarity)
- POST /search      {"queries": [...] and/or "ids": [...], "k": 10, "depth": 100 (hybrid)} -> {"results":
                    [{"query_id", "query", "results": [{"id", "score"}]}]}: the rows `docembed search`
                    writes, ids first; hits gain "text" with --corpus (`search --text-from`), and rank as
                    `search --lexical-index` ranks with --lexical-index (hybrid search)
- POST /add         {"ids": [...], "texts": [...]} -> {"added", "documents", "compacted"}: the texts
                    encoded with the served model and added as `docembed index add` adds them (on disk, all
                    or nothing; ids already in the index, repeated ids and non-finite vectors refused)
- POST /remove      {"ids": [...]} -> {"removed", "unknown", "documents"}: as `docembed index remove`

The index, the lexical index and the corpus are watched: when one changes on disk (`index add` / `remove` /
`build` by another process), the next request (at most one check a second) loads it again outside the
locks and swaps it in; a load that fails (a write in progress) keeps the old one and is tried again later.
The texts of documents added through /add are kept in memory (add them to the corpus file to keep them
across a restart).

The standard library's threading HTTP server: requests are read in parallel, the model answers one at a
time (a lock), which is what a model on one device can do anyway. It listens on 127.0.0.1 unless told
otherwise: there is no authentication, so expose it only where every client may use it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from docembed.api import Model
from docembed.encoding import encode_texts, model_identity
from docembed.errors import DocembedError, UsageError
from docembed.faiss_index import (
    BM25Index,
    VectorIndex,
    attach_texts,
    corpus_texts,
    hybrid_fusion,
    index_stamp,
    search_queries,
)
from docembed.io.runs import hit_rows
from docembed.runtime import log, progress_shown
from docembed.types import EmbeddingSet, MultiVectors

MAX_BODY_BYTES = 64 * 1024 * 1024
# An over-size body up to this much is read and dropped, so that the client (which sends it all before it
# reads) gets the 413 instead of a reset; beyond it the connection is closed unread.
MAX_DISCARD_BYTES = 2 * MAX_BODY_BYTES
# The answer grows with the texts asked for: a 7.5 MB body of 1.5 million short texts would otherwise ask
# for a 1.5 GB answer. Per list of a request; /similarity's len(a) x len(b) scores have a cap of their own.
MAX_TEXTS = 4096
MAX_SCORES = 1024 * 1024
# Connections waiting to be accepted: the standard library's 5 resets clients beyond a handful at once.
LISTEN_BACKLOG = 1024
# How often (seconds) a request may look at the files it serves for a change: a stat each, no more.
RELOAD_INTERVAL = 1.0
# Seconds a connection may wait on its client (`serve --request-timeout`): a client that sends half a request,
# or keeps an idle connection open, is cut off then instead of holding a server thread forever.
REQUEST_TIMEOUT = 60.0


class BadRequest(Exception):
    """A request the client must change: answered with its status and a one-line message."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class Watched:
    """Something loaded from `path` (an index, a corpus) and loaded again when its stamp changes, checked
    at most every `interval` seconds. The new value is loaded outside the service's locks and swapped in by
    one assignment, so a request that took the old one finishes with it. A load during which the stamp
    changed, or that fails (another process mid-write), keeps the old value and is tried again later."""

    def __init__(
        self,
        path: str | Path,
        load: Callable[[Path], Any],
        stamp: Callable[[Path], Any],
        describe: Callable[[Any], str],
        interval: float = RELOAD_INTERVAL,
    ):
        self.path, self._load, self._stamp, self._describe = Path(path), load, stamp, describe
        self.interval = interval
        self._busy = threading.Lock()
        self._failing = False
        for attempt in range(3):  # at start: a write in progress is waited out, briefly
            try:
                self.value, self.stamp = self._load_steady()
                break
            except _Moved:
                if attempt == 2:
                    raise DocembedError(f"{self.path} kept changing while it was read: try again") from None
                time.sleep(0.2)
        self._checked = time.monotonic()

    def _load_steady(self) -> tuple[Any, Any]:
        before = self._stamp(self.path)
        value = self._load(self.path)
        after = self._stamp(self.path)
        if before is None or before != after:  # read across a write: files of two versions, maybe
            raise _Moved()
        return value, after

    def refresh(self, force: bool = False) -> None:
        """Load again if the stamp changed. `force`: now (after this process wrote it), waiting for a
        reload in progress; otherwise at most once an interval, and not while another thread reloads."""
        if not force and time.monotonic() - self._checked < self.interval:
            return
        if not self._busy.acquire(blocking=force):
            return
        try:
            self._checked = time.monotonic()
            if self._stamp(self.path) == self.stamp:
                return
            try:
                value, stamp = self._load_steady()
            except Exception as error:  # noqa: BLE001 (whatever a half-written folder raises, serve on)
                if not self._failing:  # one line per failing spell, not one a second
                    moved = isinstance(error, _Moved)
                    reason = "it changed while it was read" if moved else str(error).splitlines()[0]
                    log(f"could not reload {self.path} ({reason}): serving the one loaded, trying again")
                self._failing = True
                return
            self.value, self.stamp, self._failing = value, stamp, False
            log(f"reloaded {self.path}: {self._describe(value)}")
        finally:
            self._busy.release()


class _Moved(Exception):
    """The stamp changed while a watched file was read."""


class _Fixed:
    """A value given in memory (the Python API, tests): served as it is, never reloaded."""

    def __init__(self, value: Any):
        self.value, self.path = value, None

    def refresh(self, force: bool = False) -> None:
        pass


def _watch(value, load, stamp, describe, interval):
    if value is None or not isinstance(value, (str, Path)):
        return _Fixed(value)
    return Watched(value, load, stamp, describe, interval)


class EmbeddingService:
    """The routes, over one loaded model and an optional vector index (built with the same model).

    `index` / `lexical`: a folder (watched and reloaded when it changes; /add and /remove write to the
    index's) or an index in memory (served as it is). `lexical`: a bm25 index for hybrid search, with a
    fusion model (`-m bm25+MODEL` or a fitted fusion folder). `corpus`: a file (watched) or a mapping,
    id -> text, whose texts join the hits."""

    def __init__(
        self,
        model: Model,
        index: VectorIndex | str | Path | None = None,
        batch_size: int = 32,
        *,
        lexical: BM25Index | str | Path | None = None,
        corpus: Mapping[str, str] | str | Path | None = None,
        id_field: str = "id",
        text_field: str = "text",
        depth: int = 100,
        reload_interval: float = RELOAD_INTERVAL,
    ):
        self.model, self.batch_size, self.depth = model, batch_size, depth
        if lexical is not None and index is None:
            raise UsageError("--lexical-index is for hybrid search: give the vector --index too")
        documents = lambda found: f"{len(found.ids)} documents"  # noqa: E731
        self._index = _watch(index, VectorIndex.load, index_stamp, documents, reload_interval)
        self._lexical = _watch(lexical, BM25Index.load, index_stamp, documents, reload_interval)
        # checked at start, not at the first search: a server that cannot search says so at once
        self._fusion = hybrid_fusion(model.encoder, self._lexical.value) if index is not None else None
        # what encodes queries and added documents: the index's model (a fusion's model part)
        self._encoder = self._fusion.model if self._fusion is not None else model.encoder

        def read_corpus(path: Path) -> dict[str, str]:
            return corpus_texts(path, None, id_field, text_field)

        texts = lambda found: f"{len(found)} texts"  # noqa: E731
        self._corpus = _watch(corpus, read_corpus, _file_stamp, texts, reload_interval)
        self._added_texts: dict[str, str] = {}  # of documents added through /add (in memory only)
        # the model as loaded (its files' sizes and times now, not after a retraining into its folder)
        self._identity = model_identity(model.encoder)
        self._lock = threading.Lock()  # the model: one request at a time
        self._write_lock = threading.Lock()  # /add and /remove of this process: one at a time
        self.routes = {
            ("GET", "/health"): self.health,
            ("POST", "/encode"): self.encode,
            ("POST", "/similarity"): self.similarity,
            ("POST", "/search"): self.search,
            ("POST", "/add"): self.add,
            ("POST", "/remove"): self.remove,
        }
        self._own_locking = {self.add, self.remove}  # the model lock only while they encode

    @property
    def index(self) -> VectorIndex | None:
        """The vector index served now (another one after a reload)."""
        return self._index.value

    def allowed(self, path: str) -> list[str]:
        """The methods `path` takes (a 405's Allow header)."""
        return [method for method, known in self.routes if known == path]

    def answer(self, method: str, path: str, body: dict) -> dict:
        route = self.routes.get((method, path))
        if route is None:
            if any(known == path for _, known in self.routes):
                raise BadRequest(f"{path} does not take {method}", HTTPStatus.METHOD_NOT_ALLOWED)
            known = ", ".join(p for _, p in self.routes)
            raise BadRequest(f"no route {path} (routes: {known})", HTTPStatus.NOT_FOUND)
        for watched in (self._index, self._lexical, self._corpus):
            watched.refresh()
        if route in self._own_locking:
            return route(body)
        with self._lock:
            return route(body)

    def health(self, body: dict) -> dict:
        encoder, index = self.model.encoder, self.index
        scorer = getattr(encoder, "scorer_only", False)  # a fusion: scores, no embeddings, no dim
        return {
            "model": self.model.name,
            "family": self.model.family,
            "dim": None if scorer else self.model.dim,
            "multi_vector": self.model.is_multi_vector,
            "documents": len(index.ids) if index is not None else None,
            "normalized": bool(getattr(encoder, "normalized", False)),
            "passage_temperature": float(getattr(encoder, "passage_temperature", 0.0) or 0.0),
            "max_tokens": self.model.max_tokens,
            "metadata": self.model.metadata(),
            "scorer": bool(scorer),
            "identity": self._identity,
        }

    def encode(self, body: dict) -> dict:
        batch_size = _positive_int(body, "batch_size", self.batch_size)
        vectors = self.model.encode(_texts(body, "texts"), batch_size, show_progress_bar=False)
        # float32 as `encode` writes them: tolist() gives each as the double equal to it, which JSON
        # writes in its shortest exact form, so a client reading it back as float32 gets the same bits
        if isinstance(vectors, MultiVectors):  # a list of vectors per text
            per_text = [np.asarray(v, dtype=np.float32).tolist() for v in vectors.to_list()]
            answer = {"model": self.model.name, "embeddings": per_text}
            if vectors.positions is not None:  # NUGGET's token positions, which `encode` outputs keep
                bounds = vectors.offsets
                answer["positions"] = [
                    vectors.positions[bounds[i] : bounds[i + 1]].tolist() for i in range(len(vectors))
                ]
            return answer
        return {"model": self.model.name, "embeddings": np.asarray(vectors, dtype=np.float32).tolist()}

    def similarity(self, body: dict) -> dict:
        a, b = _texts(body, "a"), _texts(body, "b")
        if len(a) * len(b) > MAX_SCORES:
            raise BadRequest(
                f"{len(a)} x {len(b)} scores asked: at most {MAX_SCORES} per request",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        scores = self.model.similarity(a, b)
        return {"scores": np.round(np.asarray(scores, dtype=np.float64), 6).tolist()}

    def search(self, body: dict) -> dict:
        index, lexical = self.index, self._lexical.value  # this request's versions, whatever reloads
        if index is None:
            raise BadRequest("this server has no index: start it with --index INDEX")
        k = _positive_int(body, "k", 10)
        depth = _positive_int(body, "depth", self.depth)
        ids = _texts(body, "ids", required=False)
        queries = _texts(body, "queries", required=False)
        if not ids and not queries:
            raise BadRequest('give "queries" (texts) and/or "ids" (documents of the index)')
        missing = next((doc_id for doc_id in ids if doc_id not in index), None)
        if missing is not None:
            raise BadRequest(f"id {missing!r} is not in the index", HTTPStatus.NOT_FOUND)
        rows = [
            {"query_id": doc_id, "results": hit_rows(hits)}
            for doc_id, hits in zip(ids, index.more_like(ids, k) if ids else [], strict=True)
        ]
        if queries:
            vectors = self._encode_documents(queries)
            found = search_queries(index, queries, vectors, k, lexical, self._fusion, depth)
            rows += [
                {"query_id": str(i), "query": text, "results": hit_rows(hits)}
                for i, (text, hits) in enumerate(zip(queries, found, strict=True))
            ]
        if self._corpus.value is not None:
            attach_texts(rows, ChainMap(self._added_texts, self._corpus.value))
        return {"results": rows}

    def add(self, body: dict) -> dict:
        folder = self._writable_index()
        ids, texts = _texts(body, "ids"), _texts(body, "texts")
        if len(ids) != len(texts):
            raise BadRequest(f'"ids" holds {len(ids)} ids and "texts" {len(texts)} texts: one id per text')
        if not ids:
            raise BadRequest('give "ids" and "texts": the documents to add')
        with self._lock:
            vectors = self._encode_documents(texts)
        embeddings = EmbeddingSet(vectors, list(ids), self._encoder.metadata())
        with self._write_lock:  # `index add`'s own code: the same checks, the same files
            compacted = VectorIndex.append_saved(folder, embeddings)
            if self._corpus.value is not None:
                self._added_texts.update(zip(ids, texts, strict=True))
            self._index.refresh(force=True)  # the client's next search sees what it added
        return {"added": len(ids), "documents": len(self.index.ids), "compacted": compacted}

    def remove(self, body: dict) -> dict:
        folder = self._writable_index()
        ids = _texts(body, "ids")
        if not ids:
            raise BadRequest('give "ids": the documents to remove')
        with self._write_lock:
            removed, left = VectorIndex.remove_saved(folder, ids)
            if removed:
                for doc_id in ids:
                    self._added_texts.pop(doc_id, None)
                self._index.refresh(force=True)
        return {"removed": removed, "unknown": len(set(ids)) - removed, "documents": left}

    def _writable_index(self) -> Path:
        if self._index.path is None:
            raise BadRequest("this server has no index folder to change: start it with --index INDEX")
        if self._fusion is not None:
            raise BadRequest(
                "this server fuses a bm25 index, whose idf comes from its whole corpus: a document added to "
                "or removed from the vector index alone would leave the two apart; rebuild both instead"
            )
        return self._index.path

    def _encode_documents(self, texts: list[str]):
        """Vectors of `texts` by the index's model, as `search` and `encode` compute them."""
        with progress_shown(False):
            return encode_texts(self._encoder, texts, batch_size=self.batch_size)


def _positive_int(body: dict, key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{key} must be a positive integer")
    return value


def _texts(body: dict, key: str, required: bool = True) -> list[str]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BadRequest(f'"{key}" must be a list of strings')
    if len(value) > MAX_TEXTS:
        raise BadRequest(
            f'"{key}" holds {len(value)} texts: at most {MAX_TEXTS} per request',
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    return value


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True  # a client that never finishes its request does not keep the process alive

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):  # the client went away (broken pipe, reset): not a bug
            log(f"{client_address[0]} went away: {type(error).__name__}")
            return
        super().handle_error(request, client_address)


def make_server(
    service: EmbeddingService,
    host: str = "127.0.0.1",
    port: int = 8765,
    request_timeout: float = REQUEST_TIMEOUT,
) -> ThreadingHTTPServer:
    """An HTTP server bound to (host, port) that answers with `service`; port 0 picks a free port
    (`server.server_address` says which). Call `serve_forever()` on it. Each read from or write to a
    client waits at most `request_timeout` seconds: a request line or headers cut short close the
    connection, a body cut short gets a 408 first."""
    if not request_timeout > 0:
        raise UsageError(f"the request timeout must be a positive number of seconds, not {request_timeout}")

    class Handler(BaseHTTPRequestHandler):
        server_version = "docembed"
        protocol_version = "HTTP/1.1"
        # the socket timeout of every connection (socketserver sets it); the standard library closes a
        # connection whose request line or headers time out, _body answers a body that does
        timeout = request_timeout

        def do_GET(self):  # noqa: N802 (the standard library's names)
            self._respond("GET")

        def do_POST(self):  # noqa: N802
            self._respond("POST")

        # every other method: a JSON 405 (or 404), not the base class's HTML 501
        def do_HEAD(self):  # noqa: N802
            self._respond("HEAD")

        def do_PUT(self):  # noqa: N802
            self._respond("PUT")

        def do_DELETE(self):  # noqa: N802
            self._respond("DELETE")

        def do_PATCH(self):  # noqa: N802
            self._respond("PATCH")

        def do_OPTIONS(self):  # noqa: N802
            self._respond("OPTIONS")

        def _respond(self, method: str) -> None:
            self._unread = 0  # bytes of an over-size body left on the socket
            try:
                answer, status = service.answer(method, self.path, self._body(method)), HTTPStatus.OK
            except BadRequest as error:
                answer, status = {"error": str(error)}, error.status
            except DocembedError as error:  # what the CLI reports in one line: the request's fault
                answer, status = {"error": str(error).splitlines()[0]}, HTTPStatus.BAD_REQUEST
            except ConnectionError:  # the client went away mid-request: nobody to answer (_Server logs it)
                raise
            except Exception as error:  # a bug: the client gets its one line, the log the rest
                log(f"error: {method} {self.path}: {type(error).__name__}: {error}")
                answer, status = {"error": f"internal error: {type(error).__name__}"}, HTTPStatus(500)
            headers = {}
            if status == HTTPStatus.METHOD_NOT_ALLOWED:
                headers["Allow"] = ", ".join(service.allowed(self.path))
            self._send(status, answer, headers)
            self._discard_unread()

        def _send(self, status: HTTPStatus, answer: dict, headers: dict | None = None) -> None:
            data = (json.dumps(answer, ensure_ascii=False) + "\n").encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:  # the rest of the socket cannot be read as requests
                self.send_header("Connection", "close")
            self.end_headers()
            if getattr(self, "command", None) != "HEAD":
                self.wfile.write(data)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            # the base class's errors (a bad request line, too many headers, an unknown method) in JSON
            self.log_error("code %d, message %s", code, message)
            self.close_connection = True
            self._send(HTTPStatus(code), {"error": message or HTTPStatus(code).phrase})

        def _body(self, method: str) -> dict:
            length = self._content_length()
            if length > MAX_BODY_BYTES:
                self._unread, self.close_connection = length, True
                raise BadRequest(
                    f"the request body is over {MAX_BODY_BYTES // 2**20} MiB",
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                )
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                self.close_connection = True  # the rest of the body may still come: not a next request
                late = f"the request body did not arrive within {request_timeout:g} s"
                raise BadRequest(late, HTTPStatus.REQUEST_TIMEOUT) from None
            if method != "POST":
                return {}
            try:
                body = json.loads(raw or b"{}")
            except (UnicodeDecodeError, ValueError) as error:
                raise BadRequest(f"the request body is not JSON: {error}") from None
            except RecursionError:
                raise BadRequest("the request body is nested too deeply") from None
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            return body

        def _content_length(self) -> int:
            value = (self.headers.get("Content-Length") or "0").strip()
            if not (value.isascii() and value.isdigit()):  # negative, or not a number: where does it end?
                self.close_connection = True
                raise BadRequest(f"Content-Length must be a number of bytes, not {value[:40]!r}")
            return int(value)

        def _discard_unread(self) -> None:
            """Read and drop an over-size body (up to MAX_DISCARD_BYTES), so the client reads its 413."""
            if not 0 < self._unread <= MAX_DISCARD_BYTES:
                return
            self.connection.settimeout(min(10, request_timeout))  # a stalled client does not hold the thread
            try:
                while self._unread > 0:
                    chunk = self.rfile.read(min(self._unread, 1 << 20))
                    if not chunk:
                        break
                    self._unread -= len(chunk)
            except OSError:  # gone or stalled: the connection closes anyway
                pass

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the standard library's name)
            log(f"{self.address_string()} {format % args}")

    return _Server((host, port), Handler)
