"""The Evaluator interface, the task registry, and what every task shares: options, fitting corpus-statistics
baselines, embedding (cached on disk), and the result record.

A task subclasses `Evaluator`, names its `primary_metric`, lists the data sets it reads, and implements
`compute(model) -> metrics`. It is built from data in memory (texts, pairs, labels, rows: public attributes,
so a variant is a new evaluator built from other data), and `from_data_root(options)` reads its data sets
(what `get_evaluator` and `docembed evaluate` use). `Evaluator.run(model)` adds the bookkeeping: the fit
hook of baselines that need one (`requires_fit` / `fit(texts)`, called with `fit_texts()`), timing, data
checksums, and the JSON-ready result.
"""

from __future__ import annotations

import datetime as _dt
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from docembed.errors import UsageError
from docembed.types import MultiVectors, Vectors

TASKS: dict[str, type[Evaluator]] = {}
# Models an evaluator fitted itself on a task's text: the next task fits them again on its own.
_FITTED_HERE: weakref.WeakSet = weakref.WeakSet()


def register_task(cls: type[Evaluator]) -> type[Evaluator]:
    TASKS[cls.name] = cls
    return cls


@dataclass
class EvalOptions:
    """Choices shared by every task. `limit` caps the examples a task reads (queries, sentences, pairs, or
    documents per split), drawn stratified by label where there is one and always with `seed`; None = full."""

    data_root: str | None = None
    limit: int | None = None
    fast: bool = False  # SentEval: 5 outer folds and 3 inner folds instead of 10 and 10
    seed: int = 1111
    batch_size: int = 32
    cache: bool = True


@dataclass
class EvalResult:
    task: str
    model: str
    primary_metric: str
    score: float
    metrics: dict[str, Any]
    config: dict[str, Any]
    data: dict[str, str]  # data set name -> sha256 of its file
    seconds: float
    date: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Evaluator(ABC):
    """One evaluation task. Subclasses set `name`, `primary_metric`, `datasets`, and implement compute()."""

    name: ClassVar[str] = ""
    primary_metric: ClassVar[str] = ""
    description: ClassVar[str] = ""
    datasets: ClassVar[tuple[str, ...]] = ()
    # Whether a scorer-only model (bm25: score(query, candidates), no embeddings) can run this task.
    supports_scorers: ClassVar[bool] = False

    def __init__(
        self,
        options: EvalOptions | None = None,
        embed: Callable[[Any, list[str]], Vectors] | None = None,
        fit_corpus: Sequence[str] | Callable[[], list[str]] | None = None,
    ):
        """A task built from its data (each subclass takes its own: texts, labels, pairs, rows). `embed`
        replaces how texts become vectors (default: `model.encode` through the embedding cache);
        `fit_corpus` is the text a corpus-statistics baseline is fitted on (a list, or a function reading it
        when needed; default: the task's own texts)."""
        self.options = options or EvalOptions()
        self.notes: list[str] = []
        self.embed_function = embed
        self.fit_corpus = fit_corpus
        # Set by from_data_root: the result then records the checksums of the data sets read.
        self.read_from_data_root = False

    @classmethod
    def from_data_root(cls, options: EvalOptions | None = None, **kwargs) -> Evaluator:
        """The task on its data sets under `options.data_root`, subsampled to `options.limit` (seeded)."""
        raise NotImplementedError

    def _from_root(self) -> Evaluator:
        self.read_from_data_root = True
        return self

    # --- what a task provides ---------------------------------------------------------------------------
    def fit_texts(self) -> list[str]:
        """Unlabelled text a corpus-statistics baseline (tfidf, bm25) is fitted on before this task."""
        if callable(self.fit_corpus):
            self.fit_corpus = self.fit_corpus()  # read once, when a model first needs it
        return list(self.fit_corpus) if self.fit_corpus is not None else self.texts()

    def texts(self) -> list[str]:
        """Every text the task embeds (without labels): the default fitting corpus."""
        raise NotImplementedError

    @abstractmethod
    def compute(self, model) -> dict[str, Any]:
        """All metrics of `model` on this task; must include `primary_metric`."""

    # --- shared behaviour -------------------------------------------------------------------------------
    def run(self, model) -> EvalResult:
        from docembed import datasets
        from docembed.runtime import log

        if getattr(model, "scorer_only", False) and not self.supports_scorers:
            raise UsageError(
                f"{model.name} is a scorer (no embeddings) and cannot run {self.name}: "
                "it supports reranking tasks (paraphrase-identification) only"
            )
        self.notes = []
        started = time.perf_counter()
        # A baseline built unfitted (`--model tfidf`) is fitted for every task on that task's own text; one
        # fitted before the evaluation (a saved model) is used as it is.
        if getattr(model, "requires_fit", False) or model in _FITTED_HERE:
            texts = self.fit_texts()
            log(f"fitting {model.name} on {len(texts)} training texts of {self.name}")
            model.fit(texts)
            _FITTED_HERE.add(model)
            self.notes.append(f"{model.family} fitted on {len(texts)} texts: {self.fit_description()}")
        metrics = self.compute(model)
        seconds = time.perf_counter() - started
        names = self.datasets if self.read_from_data_root else ()
        checksums = {name: datasets.checksum(name, self.options.data_root) for name in names}
        task_config = asdict(self.options)
        task_config.pop("data_root")
        return EvalResult(
            task=self.name,
            model=model.name,
            primary_metric=self.primary_metric,
            score=float(metrics[self.primary_metric]),
            metrics=metrics,
            config={
                "model": {"family": model.family, "source": model.source, **model.config.to_dict()},
                "task": task_config,
            },
            data=checksums,
            seconds=round(seconds, 3),
            date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            notes=list(self.notes),
        )

    def fit_description(self) -> str:
        return "the task's training split"

    # --- helpers for tasks ------------------------------------------------------------------------------
    def embed(self, model, texts: Sequence[str]) -> Vectors:
        if self.embed_function is not None:
            return self.embed_function(model, list(texts))
        return cached_encode(model, texts, self.options.batch_size, use_cache=self.options.cache)

    def embed_for_probe(self, model, texts: Sequence[str]):
        """Features for a linear probe: sparse tf-idf rows, dense vectors, or mean-pooled multi-vectors."""
        if model.supports("sparse"):
            return model.encode_sparse(list(texts))
        vectors = self.embed(model, texts)
        if isinstance(vectors, MultiVectors):
            note = "multi-vector embeddings mean-pooled into one vector per text for the probe"
            if note not in self.notes:
                self.notes.append(note)
            return mean_pool(vectors)
        return vectors

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.options.seed)


def mean_pool(vectors: MultiVectors) -> np.ndarray:
    """One vector per document: the mean of its vectors (zeros for a document without any)."""
    out = np.zeros((len(vectors), vectors.dim), dtype=np.float32)
    counts = vectors.counts
    nonempty = np.flatnonzero(counts > 0)
    if len(nonempty):
        sums = np.add.reduceat(vectors.vectors, vectors.offsets[:-1][nonempty], axis=0)
        out[nonempty] = sums / counts[nonempty, None]
    return out


# --- the embedding cache ------------------------------------------------------------------------------------
def cache_dir() -> Path:
    from docembed.runtime import models_home

    return models_home() / "cache" / "embeddings"


def cached_encode(model, texts: Sequence[str], batch_size: int = 32, use_cache: bool = True) -> Vectors:
    """model.encode(texts), each text computed once per model and kept under the models home."""
    from docembed.encoding import EmbeddingCache, encode_texts

    texts = list(texts)
    if not use_cache:
        return encode_texts(model, texts, batch_size, total=len(texts), label=f"embed [{model.name}]")
    return EmbeddingCache(cache_dir()).vectors(model, texts, batch_size)
