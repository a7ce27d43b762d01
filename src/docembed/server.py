"""`docembed serve`: one process that loads a model (and an index) once and answers JSON over HTTP, so that
interactive use pays the model's load once instead of on every `similarity` / `search` command.

Routes (request and response bodies are JSON objects; an error is {"error": "one line"} with status 400 for
a bad request, 404 for an unknown path or id, 405 for the wrong method, 413 for a body over MAX_BODY_BYTES or
a list over MAX_TEXTS texts):
- GET  /health      {"model", "family", "dim", "multi_vector", "scorer", "documents", "normalized",
                    "passage_temperature", "long_queries", "passage_group_tokens", "max_tokens",
                    "metadata", "identity"}:
                    documents null without an index; a scorer (a fusion) has no embeddings and dim null;
                    metadata is the model's `metadata()`, what `docembed encode` writes beside its
                    vectors, and identity its `encoding.model_identity` (encode --reuse), so a remote
                    client writes the same outputs
- POST /encode      {"texts": [...], "batch_size": N (optional)} -> {"model", "embeddings"}: one vector per
                    text, or for a multi-vector model a list of vectors per text (and "positions", a list of
                    token positions per text, where the model gives them), as `docembed encode` computes
                    them; float32 values, exact (JSON's shortest repr of each float32 reads back as the same
                    float32)
- POST /similarity  {"a": [...], "b": [...]} -> {"scores"}: every a against every b (Model.similarity)
- POST /search      {"queries": [...] and/or "ids": [...], "k": 10, "depth": 100 (hybrid)} -> {"results":
                    [{"query_id", "query", "results": [{"id", "score"}]}]}: the rows `docembed search`
                    writes, ids first; hits gain "text" with --corpus (`search --text-from`), and rank as
                    `search --lexical-index` ranks with --lexical-index (hybrid search). A Lance index
                    (`index build --store lance`) also takes "where" (an SQL filter on its fields) and
                    "hybrid": true (vector + full-text search of its stored text), and its hits carry
                    the text it stores. "passages": true gives each hit "passage" and "passage_text", its
                    best passage as `search --passages` finds it (an index of passages, with the texts)
- POST /add         {"ids": [...], "texts": [...]} -> {"added", "documents", "compacted" | "version"}: the
                    texts encoded with the served model and added as `docembed index add` adds them (on disk,
                    all or nothing; ids already in the index, repeated ids and non-finite vectors refused; a
                    Lance index stores the texts too, one commit: a new version)
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

import io
import json
import math
import socket
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
from docembed.lance_index import LanceIndex, open_index
from docembed.lance_index import index_stamp as vector_index_stamp
from docembed.passages import add_passages, check_passage_model, cuts_passages, refuse_index_without_passages
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
# Seconds a request may take to arrive, request line, headers and body together (`serve --request-timeout`):
# a client that sends half a request, trickles it a byte at a time or keeps an idle connection open is cut
# off then instead of holding a server thread forever. Each write to a client waits at most as long.
REQUEST_TIMEOUT = 60.0
# A client sent a body over the cap: this long (at most) to read and drop it, so it reads its 413.
DISCARD_TIMEOUT = 10.0


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
        rows = lambda found: f"{len(found)} documents"  # noqa: E731
        self._index = _watch(index, open_index, vector_index_stamp, rows, reload_interval)
        self._lexical = _watch(lexical, BM25Index.load, index_stamp, documents, reload_interval)
        # checked at start, not at the first search: a server that cannot search says so at once
        if isinstance(self._index.value, LanceIndex) and lexical is None and model.family == "fusion":
            model.encoder.require_lexical("hybrid search")
            self._fusion = model.encoder  # a Lance index's own hybrid search: its vector and full-text hits
        else:
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
            ("POST", "/spans"): self.spans,
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
            "documents": len(index) if index is not None else None,
            "store": None if index is None else "lance" if isinstance(index, LanceIndex) else "faiss",
            "normalized": bool(getattr(encoder, "normalized", False)),
            "passage_temperature": float(getattr(encoder, "passage_temperature", 0.0) or 0.0),
            "long_queries": str(getattr(encoder, "long_queries", "passages")),
            "passage_group_tokens": int(getattr(encoder, "passage_group_tokens", 0)),
            "max_tokens": self.model.max_tokens,
            "metadata": self.model.metadata(),
            "scorer": bool(scorer),
            "passages": cuts_passages(encoder),  # /spans answers: `--passages` of a --server command
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

    def spans(self, body: dict) -> dict:
        """Per text, the [start, end] character offsets of each passage its vectors pool, in their order:
        what a command run with --server needs for `--passages` (the model's tokenizer is here)."""
        texts = _texts(body, "texts")
        if not cuts_passages(self.model.encoder):
            raise BadRequest(f"{self.model.name}'s vectors are not passages: it has no spans")
        return {
            "spans": [np.asarray(s, dtype=np.int64).tolist() for s in self.model.encoder.passage_spans(texts)]
        }

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
        where, hybrid = _lance_options(body, index)
        passages = self._passages_option(body, index)
        missing = next((doc_id for doc_id in ids if doc_id not in index), None)
        if missing is not None:
            raise BadRequest(f"id {missing!r} is not in the index", HTTPStatus.NOT_FOUND)
        lance = isinstance(index, LanceIndex)
        if lance and lexical is not None and (where or hybrid):  # the bm25 hits: neither filtered nor its own
            raise BadRequest('--lexical-index fuses a separate bm25 index: leave out "where" and "hybrid"')
        liked = (index.more_like(ids, k, where) if lance else index.more_like(ids, k)) if ids else []
        rows = [
            {"query_id": doc_id, "results": hit_rows(hits)} for doc_id, hits in zip(ids, liked, strict=True)
        ]
        query_vectors = [index.stored(doc_id) for doc_id in ids] if passages else []
        if queries:
            vectors = self._encode_documents(queries)
            if lance and self._fusion is not None and lexical is None:  # the fusion over both kinds of hits,
                # "hybrid" or not, as `search -m LEXICAL+MODEL` ranks them
                found = index.fused_search(queries, vectors, self._fusion, k, where, depth)
            elif lance and hybrid:
                found = index.hybrid_search(queries, vectors, k, where, depth)
            elif lance and lexical is None:
                found = index.search(vectors, k, where)
            else:  # faiss, or Lance beside a bm25 --lexical-index: the fused search `search` runs
                found = search_queries(index, queries, vectors, k, lexical, self._fusion, depth)
            rows += [
                {"query_id": str(i), "query": text, "results": hit_rows(hits)}
                for i, (text, hits) in enumerate(zip(queries, found, strict=True))
            ]
            if passages:
                query_vectors += [vectors.select([i]) for i in range(len(queries))]
        if self._corpus.value is not None:
            attach_texts(rows, ChainMap(self._added_texts, self._corpus.value))
        elif lance and index.has_text:  # the texts the table stores, as `search` shows them
            attach_texts(rows, index.texts_of([hit["id"] for row in rows for hit in row["results"]]))
        if passages:  # as `search --passages`: each hit's best passage, found in its text
            add_passages(rows, query_vectors, index, self._encoder)
        return {"results": rows}

    def _passages_option(self, body: dict, index) -> bool:
        """A /search's "passages": true, checked as `search --passages` checks it: an index of passages, a
        model that cuts them, and the hits' text (--corpus, or a Lance index storing it)."""
        passages = body.get("passages", False)
        if not isinstance(passages, bool):
            raise BadRequest('"passages" must be true or false')
        if not passages:
            return False
        try:
            refuse_index_without_passages(index, "the index", '"passages"')
            check_passage_model(self._encoder, '"passages"')
        except UsageError as error:
            raise BadRequest(str(error)) from None
        if self._corpus.value is None and not (isinstance(index, LanceIndex) and index.has_text):
            raise BadRequest(
                '"passages" finds each passage in its document\'s text: start the server with --corpus '
                "CORPUS, or serve a Lance index built with --text-from"
            )
        return True

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
            answer = {"added": len(ids)}
            if isinstance(self.index, LanceIndex):  # one commit, with the texts where the table stores them
                table = LanceIndex.open(folder)
                answer["version"] = table.add(
                    embeddings, dict(zip(ids, texts, strict=True)) if table.has_text else None
                )
            else:
                answer["compacted"] = VectorIndex.append_saved(folder, embeddings)
            if self._corpus.value is not None:
                self._added_texts.update(zip(ids, texts, strict=True))
            self._index.refresh(force=True)  # the client's next search sees what it added
        return {**answer, "documents": len(self.index)}

    def remove(self, body: dict) -> dict:
        folder = self._writable_index()
        ids = _texts(body, "ids")
        if not ids:
            raise BadRequest('give "ids": the documents to remove')
        with self._write_lock:
            if isinstance(self.index, LanceIndex):
                removed, left, _ = LanceIndex.open(folder).remove(ids)
            else:
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


def _lance_options(body: dict, index) -> tuple[str | None, bool]:
    """A /search's "where" (an SQL filter) and "hybrid" (vector + full text): for a Lance index only."""
    where, hybrid = body.get("where"), body.get("hybrid", False)
    if where is not None and not isinstance(where, str):
        raise BadRequest('"where" must be a string: an SQL filter such as "year >= 2020"')
    if not isinstance(hybrid, bool):
        raise BadRequest('"hybrid" must be true or false')
    if (where or hybrid) and not isinstance(index, LanceIndex):
        raise BadRequest('"where" and "hybrid" need a Lance index (`docembed index build --store lance`)')
    if hybrid and not index.has_text:
        raise BadRequest('"hybrid" needs the documents\' text in the index: build it with --text-from CORPUS')
    return where or None, hybrid


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
    # JSON's \ud800 escape alone is valid JSON and no text: it cannot be tokenised, stored or written back
    # in an answer (a /search echoes its queries), so it is the request's fault, said at once
    broken = next((i for i, text in enumerate(value) if not _is_unicode(text)), None)
    if broken is not None:
        raise BadRequest(f'"{key}" item {broken} holds a lone surrogate escape (\\ud800-\\udfff): not text')
    return value


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _DeadlineReader(io.RawIOBase):
    """A connection's reads against one deadline per request: each read waits only for what is left of
    it, so a client that trickles a byte every few seconds cannot stretch a request past the timeout (a
    socket's own timeout is per read, and every byte restarts it)."""

    def __init__(self, connection: socket.socket, write_timeout: float):
        self._connection, self._write_timeout = connection, write_timeout
        self.deadline = math.inf

    def restart(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._connection.settimeout(left)
        try:
            return self._connection.recv_into(buffer)
        finally:  # writes keep the per-write timeout
            self._connection.settimeout(self._write_timeout)


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
    (`server.server_address` says which). Call `serve_forever()` on it. A request (request line, headers
    and body) must arrive within `request_timeout` seconds of the server waiting for it, however it
    trickles in: a request line cut short closes the connection, late headers or a late body get a 408
    first. Each write to a client waits at most `request_timeout` seconds."""
    if not request_timeout > 0:
        raise UsageError(f"the request timeout must be a positive number of seconds, not {request_timeout}")

    class Handler(BaseHTTPRequestHandler):
        server_version = "docembed"
        protocol_version = "HTTP/1.1"
        # the socket timeout of every connection (socketserver sets it): writes keep it, reads go by the
        # request's deadline (_DeadlineReader); the standard library closes a connection whose request line
        # times out, parse_request answers late headers and _body a late body
        timeout = request_timeout

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # the socket's own reader, replaced by one that keeps the deadline
            self._reader = _DeadlineReader(self.connection, request_timeout)
            self.rfile = io.BufferedReader(self._reader)

        def handle_one_request(self) -> None:
            self._reader.restart(request_timeout)  # from the wait for its request line to its last byte
            self._body_not_invited = False
            super().handle_one_request()

        def handle_expect_100(self) -> bool:
            # "Expect: 100-continue" asks before sending the body: a body that will be refused (over the
            # cap, a length that is no number) is not invited; the 413 or 400 comes without it
            try:
                invited = self._content_length() <= MAX_BODY_BYTES
            except BadRequest:
                invited = False
            if not invited:
                self._body_not_invited = True
                return True
            return super().handle_expect_100()

        def parse_request(self) -> bool:
            try:
                return super().parse_request()
            except TimeoutError:  # the request line came, the headers did not, in time
                late = f"the request headers did not arrive within {request_timeout:g} s"
                self.send_error(HTTPStatus.REQUEST_TIMEOUT, late)
                return False

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
            try:
                data = (json.dumps(answer, ensure_ascii=False) + "\n").encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, had one got through: JSON's \u escape holds it
                data = (json.dumps(answer) + "\n").encode("ascii")
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
            if self.headers.get("Transfer-Encoding") is not None:  # chunked: not read, so not a next request
                self.close_connection = True
                raise BadRequest(
                    "a body sent with Transfer-Encoding is not read: send it with a Content-Length",
                    HTTPStatus.LENGTH_REQUIRED,
                )
            lengths = {v.strip() for v in self.headers.get_all("Content-Length") or ()}
            # two framings of one body: whichever one were read, the rest would be taken for a next request
            if len(lengths) > 1:
                self.close_connection = True
                raise BadRequest("the request has Content-Length headers that disagree")
            value = lengths.pop() if lengths else "0"
            if not (value.isascii() and value.isdigit()):  # negative, or not a number: where does it end?
                self.close_connection = True
                raise BadRequest(f"Content-Length must be a number of bytes, not {value[:40]!r}")
            return int(value)

        def _discard_unread(self) -> None:
            """Read and drop an over-size body (up to MAX_DISCARD_BYTES), so the client reads its 413."""
            if not 0 < self._unread <= MAX_DISCARD_BYTES or self._body_not_invited:
                return
            self._reader.restart(min(DISCARD_TIMEOUT, request_timeout))  # nor does a stalled client
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
