"""`docembed serve`: one process that loads a model (and an index) once and answers JSON over HTTP, so that
interactive use pays the model's load once instead of on every `similarity` / `search` command.

Routes (request and response bodies are JSON objects; an error is {"error": "one line"} with status 400 for
a bad request, 404 for an unknown path or id, 405 for the wrong method, 413 for a body over MAX_BODY_BYTES or
a list over MAX_TEXTS texts):
- GET  /health      {"model", "family", "dim", "multi_vector", "documents"} (documents: null without index)
- POST /encode      {"texts": [...]} -> {"model", "embeddings"}: one vector per text, or for a multi-vector
                    model a list of vectors per text, as `docembed encode` computes them
- POST /similarity  {"a": [...], "b": [...]} -> {"scores"}: every a against every b (Model.similarity)
- POST /search      {"queries": [...] and/or "ids": [...], "k": 10} -> {"results": [{"query_id", "query",
                    "results": [{"id", "score"}]}]}: the rows `docembed search` writes, ids first

The standard library's threading HTTP server: requests are read in parallel, the model answers one at a
time (a lock), which is what a model on one device can do anyway. It listens on 127.0.0.1 unless told
otherwise: there is no authentication, so expose it only where every client may use it.
"""

from __future__ import annotations

import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from docembed.api import Model
from docembed.errors import DocembedError
from docembed.faiss_index import VectorIndex
from docembed.io.runs import hit_rows
from docembed.runtime import log
from docembed.types import MultiVectors

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


class BadRequest(Exception):
    """A request the client must change: answered with its status and a one-line message."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


class EmbeddingService:
    """The routes, over one loaded model and an optional vector index (built with the same model)."""

    def __init__(self, model: Model, index: VectorIndex | None = None, batch_size: int = 32):
        self.model, self.index, self.batch_size = model, index, batch_size
        self._ids = set(index.ids) if index is not None else set()
        self._lock = threading.Lock()
        self.routes = {
            ("GET", "/health"): self.health,
            ("POST", "/encode"): self.encode,
            ("POST", "/similarity"): self.similarity,
            ("POST", "/search"): self.search,
        }

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
        with self._lock:
            return route(body)

    def health(self, body: dict) -> dict:
        return {
            "model": self.model.name,
            "family": self.model.family,
            "dim": self.model.dim,
            "multi_vector": self.model.is_multi_vector,
            "documents": len(self.index.ids) if self.index is not None else None,
        }

    def encode(self, body: dict) -> dict:
        vectors = self.model.encode(_texts(body, "texts"), self.batch_size, show_progress_bar=False)
        if isinstance(vectors, MultiVectors):  # a list of vectors per text
            return {"model": self.model.name, "embeddings": [v.tolist() for v in vectors.to_list()]}
        return {"model": self.model.name, "embeddings": vectors.tolist()}

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
        if self.index is None:
            raise BadRequest("this server has no index: start it with --index INDEX")
        k = body.get("k", 10)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise BadRequest("k must be a positive integer")
        ids = _texts(body, "ids", required=False)
        queries = _texts(body, "queries", required=False)
        if not ids and not queries:
            raise BadRequest('give "queries" (texts) and/or "ids" (documents of the index)')
        missing = next((doc_id for doc_id in ids if doc_id not in self._ids), None)
        if missing is not None:
            raise BadRequest(f"id {missing!r} is not in the index", HTTPStatus.NOT_FOUND)
        rows = [
            {"query_id": doc_id, "results": hit_rows(hits)}
            for doc_id, hits in zip(ids, self.index.more_like(ids, k) if ids else [], strict=True)
        ]
        if queries:
            found = self.index.search(self.model.encode(queries, self.batch_size, show_progress_bar=False), k)
            rows += [
                {"query_id": str(i), "query": text, "results": hit_rows(hits)}
                for i, (text, hits) in enumerate(zip(queries, found, strict=True))
            ]
        return {"results": rows}


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


def make_server(service: EmbeddingService, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    """An HTTP server bound to (host, port) that answers with `service`; port 0 picks a free port
    (`server.server_address` says which). Call `serve_forever()` on it."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "docembed"
        protocol_version = "HTTP/1.1"

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
            raw = self.rfile.read(length) if length else b""
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
            self.connection.settimeout(10)  # a client that stops sending does not hold the thread
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
