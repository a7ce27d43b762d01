"""Paragraph Vector (Le & Mikolov 2014) with gensim's Doc2Vec: PV-DM, PV-DBOW, and their concatenation.

Modes dm | dbow | concat; the lower-words-v1 tokenizer at training and inference; documents cut into
10,000-word pieces (gensim's limit) that share one tag; encode() deterministic in any process or call order
(seeded inference steps instead of infer_vector); saved as config.json + model.safetensors + vocab.json +
tags.json. The reasons and details are in docs/paragraph-vector.md.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from docembed.errors import CorruptModelError, UsageError
from docembed.io.outputs import directory_output
from docembed.io.readers import Document
from docembed.models.base import (
    MODEL_DIRECTORY,
    WEIGHTS_NAME,
    Encoder,
    EncoderConfig,
    read_config,
    refuse_non_finite,
)
from docembed.models.families import register
from docembed.runtime import report_batch
from docembed.text import tokenize as tokenize_words
from docembed.types import l2_normalize

MODES = ("dm", "dbow", "concat")
TOKENIZER = "lower-words-v1"
#: gensim's doc2vec_inner.MAX_DOCUMENT_LEN: words past it are dropped silently.
MAX_PIECE_TOKENS = 10_000
#: below this many texts per worker, encode() does not start processes (start-up would dominate).
MIN_TEXTS_PER_WORKER = 16
VOCAB_NAME = "vocab.json"
TAGS_NAME = "tags.json"


def tokenize(text: str) -> list[str]:
    """The `lower-words-v1` tokenizer of docembed.text (see the module docstring)."""
    return tokenize_words(text, True, TOKENIZER)


def split_pieces(tokens: list[str], size: int = MAX_PIECE_TOKENS) -> list[list[str]]:
    """Consecutive pieces of at most `size` tokens; an empty document is one empty piece."""
    if not tokens:
        return [[]]
    return [tokens[start : start + size] for start in range(0, len(tokens), size)]


@dataclass
class PVConfig(EncoderConfig):
    mode: str = "dbow"  # dm | dbow | concat
    # Per sub-model (concat returns 2 * vector_size). 300 as in Lau & Baldwin 2016; Le & Mikolov used 400.
    vector_size: int = 300
    # 10: Le & Mikolov's IMDB setting and Mesnil et al. 2015's PV-DBOW run; Lau & Baldwin 2016 report 15
    # for DBOW. Mid-range keeps DM's context local while DBOW's skip-gram word training sees about a sentence.
    window: int = 10
    negative: int = 5
    ns_exponent: float = 0.75
    dbow_words: bool = True  # DBOW also trains word vectors (skip-gram, interleaved)
    dm_mean: bool = True  # DM averages (not sums) the context vectors
    min_count: int = 2
    sample: float = 1e-4  # frequent-word subsampling; mid-way in word2vec's advised 1e-3..1e-5 range
    epochs: int = 20  # as in Mesnil et al. 2015's PV-DBOW run
    alpha: float = 0.025
    min_alpha: float = 0.0001
    infer_epochs: int | None = None  # None: as many as training
    seed: int = 0
    workers: int = 2  # training threads
    encode_workers: int = 2  # inference processes
    normalize: bool = False
    tokenizer: str = TOKENIZER

    #: fields that change how fast vectors come, not which vectors (left out of the config hash)
    RUNTIME_FIELDS = ("workers", "encode_workers")

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"pv mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.tokenizer != TOKENIZER:
            raise UsageError(f"unknown pv tokenizer {self.tokenizer!r} (this version has {TOKENIZER!r})")
        for name in ("vector_size", "window", "negative", "min_count", "epochs", "workers", "encode_workers"):
            if getattr(self, name) < 1:
                raise UsageError(f"pv {name} must be >= 1, got {getattr(self, name)}")
        if self.infer_epochs is not None and self.infer_epochs < 1:
            raise UsageError(f"pv infer_epochs must be >= 1, got {self.infer_epochs}")
        if self.sample < 0 or not 0 < self.min_alpha <= self.alpha:
            raise UsageError("pv needs sample >= 0 and 0 < min_alpha <= alpha")

    def hash(self) -> str:
        values = {k: v for k, v in self.to_dict().items() if k not in self.RUNTIME_FIELDS}
        blob = json.dumps(values, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The gensim sub-models this mode trains, in output order."""
        return ("dm", "dbow") if self.mode == "concat" else (self.mode,)


def _new_doc2vec(config: PVConfig, kind: str):
    from gensim.models.doc2vec import Doc2Vec

    return Doc2Vec(
        dm=int(kind == "dm"),
        dm_mean=int(config.dm_mean),
        dbow_words=int(config.dbow_words),
        vector_size=config.vector_size,
        window=config.window,
        negative=config.negative,
        hs=0,
        ns_exponent=config.ns_exponent,
        min_count=config.min_count,
        sample=config.sample,
        epochs=config.epochs,
        alpha=config.alpha,
        min_alpha=config.min_alpha,
        seed=config.seed,
        workers=config.workers,
    )


class TaggedCorpus:
    """Re-iterable gensim corpus over a document stream: each document becomes TaggedDocuments tagged with
    its position (an int), one per piece of at most MAX_PIECE_TOKENS tokens. Nothing is held in memory but
    the ids, collected on the first pass."""

    def __init__(self, documents: Iterable[Document] | Iterable[str], on_document: Callable | None = None):
        self.documents = documents
        self.on_document = on_document
        self.ids: list[str] | None = None
        self.long_documents = 0
        self.words_read = 0  # tokens yielded so far, all passes (for words/s while training)

    def __iter__(self) -> Iterator:
        from gensim.models.doc2vec import TaggedDocument

        first_pass = self.ids is None
        ids: list[str] = []
        long_documents = 0
        for index, doc in enumerate(self.documents):
            doc_id, text = (str(index), doc) if isinstance(doc, str) else (doc.id, doc.text)
            pieces = split_pieces(tokenize(text))
            long_documents += len(pieces) > 1
            if first_pass:
                ids.append(doc_id)
            for piece in pieces:
                self.words_read += len(piece)
                yield TaggedDocument(piece, [index])
            if self.on_document is not None:
                self.on_document()
        if first_pass:
            self.ids, self.long_documents = ids, long_documents


@dataclass
class TrainStats:
    kind: str
    documents: int
    pieces: int
    vocab_size: int
    epochs: int
    seconds: float  # wall clock
    cpu_seconds: float  # this process, all threads: with a busy machine, words per CPU-second is steadier
    raw_words: int  # tokens read in all epochs, out-of-vocabulary and subsampled ones included

    @property
    def words_per_s(self) -> float:
        return self.raw_words / max(self.seconds, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        per_cpu_s = self.raw_words / max(self.cpu_seconds, 1e-9)
        return {
            **dataclasses.asdict(self),
            "words_per_s": round(self.words_per_s, 1),
            "words_per_cpu_s": round(per_cpu_s, 1),
        }


def train_paragraph_vectors(
    documents: Iterable[Document] | Iterable[str], config: PVConfig
) -> tuple[ParagraphVectorEncoder, list[TrainStats]]:
    """Train the sub-models of `config.mode` on a re-iterable document stream (read 1 + epochs times per
    sub-model; concat scans the vocabulary once and shares it)."""
    from gensim.models.callbacks import CallbackAny2Vec

    from docembed.runtime import log, progress_bar

    corpus = TaggedCorpus(documents)
    models: dict[str, Any] = {}
    stats: list[TrainStats] = []
    for kind in config.kinds:
        model = _new_doc2vec(config, kind)
        if not models:
            started = time.perf_counter()
            with progress_bar("pv vocabulary scan") as bar:
                corpus.on_document = bar.advance
                model.build_vocab(corpus)
                corpus.on_document = None
            if not corpus.ids:
                raise UsageError("the training corpus is empty")
            if len(model.wv) == 0:
                raise UsageError(f"no word occurs at least min_count={config.min_count} times in the corpus")
            log(
                f"pv vocabulary: {len(model.wv)} words (min_count {config.min_count}), {len(corpus.ids)}"
                f" docs in {model.corpus_count} pieces ({corpus.long_documents} docs over {MAX_PIECE_TOKENS}"
                f" tokens split), {time.perf_counter() - started:.1f}s"
            )
        else:  # same corpus, same vocabulary: share it instead of scanning again
            model.reset_from(next(iter(models.values())))

        class _EpochProgress(CallbackAny2Vec):
            def __init__(self, bar):
                self.bar, self.started, self.words_before = bar, time.perf_counter(), corpus.words_read

            def on_epoch_end(self, trained):
                self.bar.advance()
                elapsed = time.perf_counter() - self.started
                self.bar.update(words_per_s=(corpus.words_read - self.words_before) / max(elapsed, 1e-9))

        started, cpu_started, words_before = time.perf_counter(), time.process_time(), corpus.words_read
        with progress_bar(f"train pv-{kind}", total=config.epochs) as bar:
            model.train(
                corpus,
                total_examples=model.corpus_count,
                epochs=config.epochs,
                callbacks=[_EpochProgress(bar)],
            )
        model.callbacks = ()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        raw_words = corpus.words_read - words_before
        stats.append(
            TrainStats(
                kind,
                len(corpus.ids),
                model.corpus_count,
                len(model.wv),
                config.epochs,
                seconds,
                cpu_seconds,
                raw_words,
            )
        )
        log(
            f"trained pv-{kind}: {config.epochs} epochs in {seconds:.1f}s,"
            f" {stats[-1].words_per_s:,.0f} words/s"
        )
        models[kind] = model
    encoder = ParagraphVectorEncoder(config, models=models, tags=list(corpus.ids))
    return encoder, stats


def fit_pv(
    corpus: Iterable[Document] | Iterable[str],
    config: PVConfig | None = None,
    output: str | Path | None = None,
) -> ParagraphVectorEncoder:
    """Fit Paragraph Vectors on `corpus` (re-iterable: texts, or Documents whose ids become the tags) with
    `config` (default: `docembed train-pv`'s), and with `output` save the model there with its
    train_log.jsonl (words/s per sub-model). What `train-pv`, `encode --fit` and the distillation's PV
    teacher run."""
    from docembed.runtime import log

    config = config or PVConfig()
    started = time.perf_counter()
    encoder, stats = train_paragraph_vectors(corpus, config)
    if getattr(corpus, "skipped", 0):  # a DocumentReader with --skip-invalid counts what it left out
        log(f"skipped {corpus.skipped} invalid line(s) of {corpus.name} in each pass")
    if output is not None:  # all or nothing: a staging folder swapped in whole (io/outputs.py)
        with directory_output(output, MODEL_DIRECTORY, overwrite=True) as folder:
            encoder.save(folder)
            with open(folder / "train_log.jsonl", "w", encoding="utf-8") as handle:
                for entry in stats:
                    handle.write(json.dumps(entry.to_dict()) + "\n")
    where = f" -> {output}" if output is not None else ""
    log(
        f"trained pv-{config.mode} (dim {encoder.dim}) on {len(encoder.tags)} documents in "
        f"{time.perf_counter() - started:.1f}s{where}"
    )
    return encoder


@register
class ParagraphVectorEncoder(Encoder):
    family = "pv"
    config_class = PVConfig
    capabilities = frozenset({"workers"})

    def __init__(self, config: PVConfig, name: str | None = None, models: dict | None = None, tags=None):
        super().__init__(config, name)
        if models is None:
            raise UsageError("a pv model must be trained first: docembed train-pv CORPUS -o DIR")
        self.models = models
        self.tags: list[str] = list(tags or [])
        self.workers = config.encode_workers
        self._directory: Path | None = None

    # --- encoding -------------------------------------------------------------------------------------
    @property
    def normalized(self) -> bool:
        return self.config.normalize

    @property
    def dim(self) -> int:
        return self.config.vector_size * len(self.config.kinds)

    def set_workers(self, workers: int) -> None:
        """Number of processes encode() uses (runtime only; the vectors do not depend on it)."""
        if workers < 1:
            raise UsageError(f"encode workers must be >= 1, got {workers}")
        self.workers = workers

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        texts = list(texts)
        workers = min(self.workers, os.cpu_count() or 1, len(texts) // MIN_TEXTS_PER_WORKER)
        if workers > 1:
            rows = self._encode_parallel(texts, workers)
        else:
            rows = self._encode_serial(texts, batch_size)
        return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)

    def _encode_serial(self, texts: list[str], batch_size: int) -> list[np.ndarray]:
        rows = []
        for text in texts:
            rows.append(self.encode_one(text))
            if len(rows) % batch_size == 0:  # each text is inferred alone: report every batch_size of them
                report_batch(len(rows), len(texts))
        return rows

    def encode_one(self, text: str) -> np.ndarray:
        tokens = tokenize(text)
        pieces = split_pieces(tokens)
        joined = " ".join(tokens)
        parts = [self._infer(kind, pieces, joined) for kind in self.config.kinds]
        if self.config.normalize:
            parts = [l2_normalize(part) for part in parts]
        vector = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return (l2_normalize(vector) if self.config.normalize else vector).astype(np.float32, copy=False)

    def _infer(self, kind: str, pieces: list[list[str]], joined: str) -> np.ndarray:
        """gensim's infer_vector loop over all pieces with one shared document vector, seeded per text."""
        from gensim.models.doc2vec_inner import train_document_dbow, train_document_dm

        model = self.models[kind]
        size = model.dv.vector_size
        digest = hashlib.blake2b(
            f"{self.config.seed}\x00{kind}\x00{joined}".encode(), digest_size=16, person=b"docembed-pv"
        ).digest()
        start = np.random.Generator(np.random.SFC64(int.from_bytes(digest[:8], "little")))
        doc_vector = ((start.random(size) - 0.5) / size).astype(np.float32).reshape(1, size)
        # The C routines draw their negative-sampling/subsampling seed and window shrinkage from model.random.
        model.random = np.random.RandomState(np.frombuffer(digest[8:], dtype=np.uint32))
        lockf = np.ones(1, dtype=np.float32)
        work = np.zeros(model.layer1_size, dtype=np.float32)
        neu1 = np.zeros(model.layer1_size, dtype=np.float32)
        epochs = self.config.infer_epochs or self.config.epochs
        alpha, min_alpha = self.config.alpha, self.config.min_alpha
        alpha_delta = (alpha - min_alpha) / max(epochs - 1, 1)
        frozen = {
            "learn_words": False,
            "learn_hidden": False,
            "doctag_vectors": doc_vector,
            "doctags_lockf": lockf,
        }
        for _ in range(epochs):
            for piece in pieces:
                if kind == "dbow":
                    train_document_dbow(model, piece, [0], alpha, work, **frozen)
                else:
                    train_document_dm(model, piece, [0], alpha, work, neu1, **frozen)
            alpha -= alpha_delta
        return doc_vector[0]

    def _encode_parallel(self, texts: list[str], workers: int) -> list[np.ndarray]:
        # Never fork this process: once torch or onnxruntime have started their thread pools, a forked child
        # can wait forever on a lock a vanished thread held. Workers load the model from its saved folder.
        context = multiprocessing.get_context(_start_method())
        chunksize = max(1, len(texts) // (workers * 8))
        initargs = (str(self._saved_dir()),)
        with context.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            rows = []
            for row in pool.imap(_encode_in_worker, texts, chunksize=chunksize):
                rows.append(row)
                report_batch(len(rows), len(texts))
            return rows

    def _saved_dir(self) -> Path:
        if self._directory is None:
            self._directory = _remove_later(Path(tempfile.mkdtemp(prefix="docembed-pv-")))
            self.save(self._directory)
        return self._directory

    def training_vectors(self) -> tuple[list[str], np.ndarray]:
        """The training documents' ids and their vectors as learned in training (same layout as encode)."""
        parts = [self.models[kind].dv.vectors for kind in self.config.kinds]
        if self.config.normalize:
            parts = [l2_normalize(part) for part in parts]
        vectors = np.concatenate(parts, axis=1)
        if self.config.normalize:
            vectors = l2_normalize(vectors)
        return list(self.tags), vectors.astype(np.float32, copy=True)

    # --- the saved directory -------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        from safetensors.numpy import save_file

        directory = Path(directory)
        first = self.models[self.config.kinds[0]]
        words = list(first.wv.index_to_key)
        for kind in self.config.kinds[1:]:
            if list(self.models[kind].wv.index_to_key) != words:
                raise CorruptModelError(
                    "pv sub-models have different vocabularies; cannot save them together"
                )
        counts = [int(first.wv.get_vecattr(i, "count")) for i in range(len(words))]
        arrays = {}
        for kind in self.config.kinds:
            model = self.models[kind]
            arrays[f"{kind}.word_vectors"] = np.ascontiguousarray(model.wv.vectors, dtype=np.float32)
            arrays[f"{kind}.output_weights"] = np.ascontiguousarray(model.syn1neg, dtype=np.float32)
            arrays[f"{kind}.doc_vectors"] = np.ascontiguousarray(model.dv.vectors, dtype=np.float32)
        import gensim

        self.write_config(
            directory,
            sub_models=list(self.config.kinds),
            vocab_size=len(words),
            documents=len(self.tags),
            gensim_version=gensim.__version__,
        )
        save_file(arrays, str(directory / WEIGHTS_NAME))
        _write_json(directory / VOCAB_NAME, {"words": words, "counts": counts})
        _write_json(directory / TAGS_NAME, self.tags)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> ParagraphVectorEncoder:
        from safetensors.numpy import load_file

        directory = Path(directory)
        config = PVConfig.from_dict(read_config(directory)["config"])
        vocab = _read_json(directory / VOCAB_NAME)
        tags = _read_json(directory / TAGS_NAME)
        try:
            words, counts = list(vocab["words"]), [int(c) for c in vocab["counts"]]
        except (KeyError, TypeError, ValueError):
            raise CorruptModelError(
                f"{directory / VOCAB_NAME}: expected {{'words': [...], 'counts': [...]}}"
            ) from None
        if len(words) != len(counts) or len(set(words)) != len(words) or not isinstance(tags, list):
            raise CorruptModelError(f"{directory}: vocab.json or tags.json is inconsistent")
        path = directory / WEIGHTS_NAME
        if not path.exists():
            raise CorruptModelError(f"{directory}: {WEIGHTS_NAME} is missing")
        try:
            arrays = load_file(str(path))
        except Exception as error:  # safetensors raises its own types for truncated headers/data
            raise CorruptModelError(f"{path} is corrupt or truncated: {error}") from None
        refuse_non_finite(arrays, path)  # inference from NaN weights gives NaN vectors in silence
        models: dict = {}
        for kind in config.kinds:
            models[kind] = _rebuild(config, kind, words, counts, len(tags), arrays, path, share=models)
        encoder = cls(config, models=models, tags=[str(t) for t in tags])
        encoder._directory = directory
        return encoder


def _rebuild(config: PVConfig, kind: str, words, counts, n_docs: int, arrays: dict, path: Path, share: dict):
    """A Doc2Vec ready for inference: vocabulary, subsampling thresholds and the negative-sampling table
    recomputed from the saved counts exactly as training computed them (or shared with a sub-model already
    rebuilt, as training shared them), then the trained arrays."""
    model = _new_doc2vec(config, kind)
    if share:
        model.reset_from(next(iter(share.values())))
    else:
        model.dv.index_to_key = list(range(n_docs))  # int tags 0..n-1, as TaggedCorpus assigned them
        model.sorted_vocab = 0  # keep the saved index order (already sorted by descending count)
        model.build_vocab_from_freq(dict(zip(words, counts, strict=True)), corpus_count=n_docs)
        model.sorted_vocab = 1
        if list(model.wv.index_to_key) != list(words):
            raise CorruptModelError(f"{path}: vocabulary counts fall below min_count={config.min_count}")
    expected = {
        "word_vectors": (len(words), config.vector_size),
        "output_weights": (len(words), model.layer1_size),
        "doc_vectors": (n_docs, config.vector_size),
    }
    for name, shape in expected.items():
        array = arrays.get(f"{kind}.{name}")
        if array is None or array.shape != shape:
            got = None if array is None else array.shape
            raise CorruptModelError(f"{path}: {kind}.{name} should have shape {shape}, has {got}")
    model.wv.vectors = np.ascontiguousarray(arrays[f"{kind}.word_vectors"], dtype=np.float32)
    model.syn1neg = np.ascontiguousarray(arrays[f"{kind}.output_weights"], dtype=np.float32)
    model.dv.vectors = np.ascontiguousarray(arrays[f"{kind}.doc_vectors"], dtype=np.float32)
    model.wv.norms = model.dv.norms = None
    return model


# --- worker processes ---------------------------------------------------------------------------------
_worker_encoder: ParagraphVectorEncoder | None = None


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _remove_later(directory: Path) -> Path:
    atexit.register(shutil.rmtree, directory, True)
    return directory


def _init_worker(directory: str) -> None:
    global _worker_encoder
    import signal

    # The pool ends its workers with SIGTERM, which must stay silent; Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_encoder = ParagraphVectorEncoder.load(directory)
    _worker_encoder.workers = 1


def _encode_in_worker(text: str) -> np.ndarray:
    return _worker_encoder.encode_one(text)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path):
    if not path.exists():
        raise CorruptModelError(f"{path.parent}: {path.name} is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptModelError(f"{path} is corrupt: {error}") from None
