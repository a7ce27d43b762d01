"""Encoding in several local processes (`encode --workers N`) for the families that run one model in one
process (torch, ONNX Runtime, OpenVINO): one thread per process is what scales on a many-core CPU, where
one process with many intra-op threads does not.

The texts are cut into pieces of a fixed size (a few batches, whatever N is); each worker loads the model
once, the way the parent did (`WorkerModel`: the model's name or path and the options given, replayed:
a loaded model, an OpenVINO one above all, does not travel between processes), and encodes whole pieces;
the parent writes them back in input order. N = 1 runs the same pieces in this process, so every N gives
the same bytes. Paragraph Vector has its own per-text pool (`set_workers`); Ray is for many machines.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from docembed.encoding import Coverage, capped
from docembed.errors import DocembedError
from docembed.io.readers import Document, batched
from docembed.models.base import EncodeSettings
from docembed.runtime import batches_reported_to, progress_bar, raise_if_interrupted, reported_share
from docembed.types import EmbeddingSet, Vectors, concat_vectors

# Texts per piece = batches per piece x batch size: enough for a family that sorts a call's texts by length
# to pad little, small enough that N workers get even shares of a few hundred texts.
BATCHES_PER_PIECE = 4
# Pieces in flight per worker: the workers never wait for the parent, and memory holds a few pieces of text.
PIECES_AHEAD = 2


@dataclass(frozen=True)
class WorkerModel:
    """How a worker process builds the model the parent uses: `encode`'s model argument and options."""

    model: str
    threads: int = 1
    device: str = "cpu"
    seed: int = 0
    settings: EncodeSettings = EncodeSettings()

    def load(self):
        import torch

        from docembed.models.registry import load_model
        from docembed.runtime import seed_everything

        # before the model is built: an ONNX Runtime / OpenVINO runner takes torch's thread count then
        torch.set_num_threads(self.threads)
        seed_everything(self.seed)
        return self.settings.apply(load_model(self.model, device=self.device))


def piece_size(batch_size: int) -> int:
    return max(1, batch_size) * BATCHES_PER_PIECE


def encode_piece(
    model, texts: Sequence[str], batch_size: int, count: bool
) -> tuple[Vectors, list[int] | None]:
    """One piece as the one-process encode loop treats a chunk: token counts (for the coverage note), the
    character cap, `model.encode`."""
    counts = (model.token_counts(texts) or []) if count else None
    return model.encode(capped(model, texts), batch_size=batch_size), counts


def encode_documents_in_processes(
    spec: WorkerModel,
    model,
    documents: Iterable[Document],
    workers: int,
    batch_size: int = 32,
    total: int | None = None,
    coverage: Coverage | None = None,
    allow_empty: bool = False,
) -> EmbeddingSet:
    """`encoding.encode_documents` with `workers` processes, each building `spec` once; `model` is the one
    the parent built from `spec` (its metadata, and the encoder when `workers` is 1)."""
    ids: list[str] = []

    def pieces() -> Iterator[list[str]]:
        for piece in batched(documents, piece_size(batch_size)):
            ids.extend(document.id for document in piece)
            yield [document.text for document in piece]

    count = coverage is not None
    if workers > 1 and (spec.settings.backend or spec.settings.precision):
        # export the converted model once, here, before the workers (each would export it otherwise)
        model.encode([""], batch_size=1)  # finds it in the cache, or makes it
    with progress_bar(f"encode [{model.name}]", total=total, unit="documents") as bar:
        progress = PieceProgress(bar)
        if workers == 1:
            results = _in_this_process(model, pieces(), batch_size, count, progress)
        else:
            results = _in_workers(spec, workers, pieces(), batch_size, count, progress)
        parts = _collect(results, coverage)
    if not ids:
        if allow_empty:  # an empty shard: the parent's model gives the width
            from docembed.encoding import encode_documents

            return encode_documents(model, [], allow_empty=True, coverage=coverage)
        raise DocembedError("no documents to encode: the input is empty")
    metadata = model.metadata()
    if coverage is not None:
        metadata["coverage"] = coverage.to_metadata()
    return EmbeddingSet(concat_vectors(parts), ids, metadata)


def _collect(results, coverage: Coverage | None) -> list[Vectors]:
    parts: list[Vectors] = []
    for vectors, counts in results:
        raise_if_interrupted()
        if coverage is not None:
            coverage.add(counts)
        parts.append(vectors)
    return parts


class PieceProgress:
    """The texts encoded so far: whole pieces, plus the share of each piece in progress that its model
    has reported batch by batch (`runtime.report_batch`), in this process or in a worker."""

    def __init__(self, bar):
        self.bar = bar
        self.whole = 0
        self.partial: dict[int, int] = {}

    def report(self, piece: int, size: int, done: float, total: float) -> None:
        share = reported_share(size, done, total)
        if share > self.partial.get(piece, 0):
            self.partial[piece] = share
            self._show()

    def finished(self, piece: int, size: int) -> None:
        self.partial.pop(piece, None)
        self.whole += size
        self._show()

    def _show(self) -> None:
        self.bar.set_completed(self.whole + sum(self.partial.values()))


def _in_this_process(
    model, pieces: Iterator[list[str]], batch_size: int, count: bool, progress: PieceProgress
):
    for index, piece in enumerate(pieces):

        def batch_done(done, total, index=index, size=len(piece)):
            raise_if_interrupted()
            progress.report(index, size, done, total)

        with batches_reported_to(batch_done):
            result = encode_piece(model, piece, batch_size, count)
        progress.finished(index, len(piece))
        yield result


# How often the parent looks at the workers' batch reports while it waits for a piece (seconds).
POLL_INTERVAL = 0.2


def _in_workers(
    spec: WorkerModel,
    workers: int,
    pieces: Iterator[list[str]],
    batch_size: int,
    count: bool,
    progress: PieceProgress,
):
    """The results of `encode_piece` over `pieces`, in order, from `workers` processes; at most
    PIECES_AHEAD pieces per worker are read ahead of the one the parent waits for. Each worker sends the
    batches its model reports through a queue, so that progress moves before a whole piece is done."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    context = _context()
    # A SimpleQueue: a worker writes its reports before its result, so the parent sees them in order.
    reports = context.SimpleQueue()
    executor = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(spec, reports)
    )
    pending: deque = deque()
    sizes: dict[int, int] = {}

    def drain() -> None:
        while not reports.empty():
            index, done, total = reports.get()
            if index in sizes:  # not a late report of a piece already counted whole
                progress.report(index, sizes[index], done, total)

    def result_of(index: int, future):
        while True:
            try:
                result = future.result(timeout=POLL_INTERVAL)
            except TimeoutError:
                raise_if_interrupted()
                drain()
                continue
            drain()
            progress.finished(index, sizes.pop(index))
            return result

    try:
        for index, piece in enumerate(pieces):
            sizes[index] = len(piece)
            pending.append((index, executor.submit(_encode_in_worker, index, piece, batch_size, count)))
            if len(pending) >= workers * PIECES_AHEAD:
                yield result_of(*pending.popleft())
        while pending:
            yield result_of(*pending.popleft())
    except BrokenProcessPool:
        raise DocembedError("an encode worker process stopped (its error is above; out of memory?)") from None
    finally:
        _shut_down(executor, reports)


def _shut_down(executor, reports) -> None:
    """Stop the workers, reading their reports meanwhile: after an error nothing else reads them, and a
    worker blocked on a full pipe of reports would never finish its piece."""
    stopping = threading.Event()

    def discard() -> None:
        while not stopping.is_set():
            if reports.empty():
                stopping.wait(0.05)
            else:
                reports.get()

    reader = threading.Thread(target=discard, daemon=True)
    reader.start()
    try:
        executor.shutdown(wait=True, cancel_futures=True)
    finally:
        stopping.set()
        reader.join()
        reports.close()


def _context():
    """forkserver where there is one: its server imports torch once and forks each worker from that clean
    state (forking this process is not safe once torch's OpenMP pool has run); spawn elsewhere."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "docembed.parallel"])
    return context


# --- in the worker process -----------------------------------------------------------------------------
_worker_model = None
_reports = None


def _start_worker(spec: WorkerModel, reports=None) -> None:
    global _worker_model, _reports
    import signal

    from docembed.runtime import settings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    settings.device, settings.seed, settings.quiet, settings.progress = spec.device, spec.seed, True, False
    _reports = reports
    _worker_model = spec.load()


def _encode_in_worker(index: int, texts: list[str], batch_size: int, count: bool):
    def batch_done(done, total):
        if _reports is not None:
            _reports.put((index, done, total))

    with batches_reported_to(batch_done):
        return encode_piece(_worker_model, texts, batch_size, count)
