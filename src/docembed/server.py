"""`docembed serve`: one process that loads a model (and an index) once and answers JSON over HTTP, so that
interactive use pays the model's load once instead of on every `similarity` / `search` command.

Routes (request and response bodies are JSON objects; an error is {"error": "one line"} with status 400 for
a bad request, 404 for an unknown path or id, 405 for the wrong method):
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
        scores = self.model.similarity(_texts(body, "a"), _texts(body, "b"))
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
    return value


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

        def _respond(self, method: str) -> None:
            try:
                answer, status = service.answer(method, self.path, self._body(method)), HTTPStatus.OK
            except BadRequest as error:
                answer, status = {"error": str(error)}, error.status
            except DocembedError as error:  # what the CLI reports in one line: the request's fault
                answer, status = {"error": str(error).splitlines()[0]}, HTTPStatus.BAD_REQUEST
            except Exception as error:  # a bug: the client gets its one line, the log the rest
                log(f"error: {method} {self.path}: {type(error).__name__}: {error}")
                answer, status = {"error": f"internal error: {type(error).__name__}"}, HTTPStatus(500)
            data = (json.dumps(answer, ensure_ascii=False) + "\n").encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self, method: str) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise BadRequest(f"the request body is over {MAX_BODY_BYTES // 2**20} MiB")
            raw = self.rfile.read(length) if length else b""
            if method == "GET":
                return {}
            try:
                body = json.loads(raw or b"{}")
            except (UnicodeDecodeError, ValueError) as error:
                raise BadRequest(f"the request body is not JSON: {error}") from None
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            return body

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the standard library's name)
            log(f"{self.address_string()} {format % args}")

    return ThreadingHTTPServer((host, port), Handler)
