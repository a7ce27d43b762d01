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
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from docembed.encoding import Coverage, capped
from docembed.errors import DocembedError
from docembed.io.readers import Document, batched
from docembed.models.base import EncodeSettings
from docembed.runtime import progress_bar, raise_if_interrupted
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
    if workers == 1:
        results = (encode_piece(model, piece, batch_size, count) for piece in pieces())
        parts = _collect(results, model.name, total, coverage)
    else:
        if (
            spec.settings.backend or spec.settings.precision
        ):  # export the converted model once, here, before the workers
            model.encode([""], batch_size=1)  # look for it in the cache (each would export it otherwise)
        parts = _collect(_in_workers(spec, workers, pieces(), batch_size, count), model.name, total, coverage)
    if not ids:
        if allow_empty:  # an empty shard: the parent's model gives the width
            from docembed.encoding import encode_documents

            return encode_documents(model, [], allow_empty=True, coverage=coverage)
        raise DocembedError("no documents to encode: the input is empty")
    metadata = model.metadata()
    if coverage is not None:
        metadata["coverage"] = coverage.to_metadata()
    return EmbeddingSet(concat_vectors(parts), ids, metadata)


def _collect(results, name: str, total: int | None, coverage: Coverage | None) -> list[Vectors]:
    parts: list[Vectors] = []
    with progress_bar(f"encode [{name}]", total=total) as bar:
        for vectors, counts in results:
            raise_if_interrupted()
            if coverage is not None:
                coverage.add(counts)
            parts.append(vectors)
            bar.advance(len(vectors))
    return parts


def _in_workers(spec: WorkerModel, workers: int, pieces: Iterator[list[str]], batch_size: int, count: bool):
    """The results of `encode_piece` over `pieces`, in order, from `workers` processes; at most
    PIECES_AHEAD pieces per worker are read ahead of the one the parent waits for."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    executor = ProcessPoolExecutor(
        workers, mp_context=_context(), initializer=_start_worker, initargs=(spec,)
    )
    pending: deque = deque()
    try:
        for piece in pieces:
            pending.append(executor.submit(_encode_in_worker, piece, batch_size, count))
            if len(pending) >= workers * PIECES_AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise DocembedError("an encode worker process stopped (its error is above; out of memory?)") from None
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


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


def _start_worker(spec: WorkerModel) -> None:
    global _worker_model
    import signal

    from docembed.runtime import settings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    settings.device, settings.seed, settings.quiet, settings.progress = spec.device, spec.seed, True, False
    _worker_model = spec.load()


def _encode_in_worker(texts: list[str], batch_size: int, count: bool):
    return encode_piece(_worker_model, texts, batch_size, count)
