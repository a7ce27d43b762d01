"""Long-document tasks: what the long-document student exists for, measured on enough documents to tell
models apart. A document is long when the all-MiniLM-L6-v2 WordPiece tokenizer gives it more than 512 tokens
(special tokens included), whatever model is evaluated, so every model sees the same documents.

- `imdb-long`, `20newsgroups-long`: a linear probe trained on the train split (all lengths, a stratified
  `--limit`), accuracy x100 on the long test documents; and query-by-document retrieval among those long
  test documents (relevant = same label): MAP@100, P@10, kNN accuracy.
- `halves`: each long test document of IMDB and 20 Newsgroups is cut in two at its middle word; its first
  half queries the second halves of all of them; MRR x100 (pessimistic ties).
- `imdb-long-val`, `20newsgroups-long-val`, `halves-val`: the same tasks on long documents of the *train*
  splits, for choosing settings without looking at the test documents; the probe of a `-val` task trains on
  train documents outside its validation sample.

Each task keeps at most `LONG_LIMIT` long documents (a seeded sample), reports n and the standard error of
its primary metric, and keeps the per-document values (`per_item`) so a bench can compute the standard
error of the difference between two models on the same documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from docembed.errors import UsageError
from docembed.evaluation import metrics
from docembed.evaluation.base import Evaluator, register_task
from docembed.evaluation.probes import train_test_predictions
from docembed.evaluation.retrieval import label_retrieval, scorer_rows, similarity_rows
from docembed.evaluation.statistics import (
    LONG_DOCUMENT_TOKENS,
    minilm_lengths,
    sample_indices,
    standard_error,
)
from docembed.types import MultiVectors

LONG_LIMIT = 600
TRAIN_LIMIT = 1000  # probe training documents when no --limit is given (all lengths, stratified)


def long_rows(name: str, data_root: str | None, rng: np.random.Generator, limit: int) -> list[dict]:
    """Records of data set `name` over LONG_DOCUMENT_TOKENS tokens: a seeded sample of at most `limit`, in
    order; each keeps its position in the data set as `index`."""
    from docembed import datasets

    rows = list(datasets.records(name, data_root))
    lengths = minilm_lengths([r["text"] for r in rows])
    long = np.flatnonzero(lengths > LONG_DOCUMENT_TOKENS)
    if len(long) > limit:
        long = np.sort(rng.choice(long, size=limit, replace=False))
    return [{**rows[i], "tokens": int(lengths[i]), "index": int(i)} for i in long]


class LongDocumentClassification(Evaluator):
    """Built from the probe's training texts and labels and the evaluated `rows` ({"text", "label"}, and
    "tokens" where known): probe accuracy and same-label retrieval among the rows."""

    primary_metric = "accuracy"
    source = ""
    name = "long-document-classification"
    supports_scorers = True  # a fusion: retrieval fused, the probe on its model part's features
    split = "test"  # "train" for the -val tasks: evaluated on long train documents

    def __init__(
        self,
        train_texts: Sequence[str],
        train_labels: Sequence,
        rows: Sequence[dict],
        options=None,
        embed=None,
        fit_corpus=None,
    ):
        super().__init__(options, embed, fit_corpus)
        self.train_texts, self.train_labels = list(train_texts), list(train_labels)
        self.rows = list(rows)

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys((f"{self.source}/train", f"{self.source}/{self.split}")))

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> LongDocumentClassification:
        """At most LONG_LIMIT long documents of the split (seeded), and a probe training sample of the train
        split (`options.limit` or TRAIN_LIMIT, stratified; for -val tasks, outside the evaluated sample)."""
        from docembed import datasets
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        evaluated = long_rows(
            f"{cls.source}/{cls.split}", options.data_root, np.random.default_rng(options.seed), LONG_LIMIT
        )
        train = list(datasets.records(f"{cls.source}/train", options.data_root))
        if cls.split == "train":  # the probe never sees the validation documents
            indices = {r["index"] for r in evaluated}
            train = [r for i, r in enumerate(train) if i not in indices]
        labels = [r["label"] for r in train]
        rng = np.random.default_rng(options.seed)
        keep = sample_indices(len(train), options.limit or TRAIN_LIMIT, rng, labels)
        texts, labels = [train[i]["text"] for i in keep], [labels[i] for i in keep]
        return cls(texts, labels, evaluated, options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return list(self.train_texts)

    def fit_description(self) -> str:
        if not self.read_from_data_root:
            return "the probe's training texts"
        held_out = ", outside the validation sample" if self.split == "train" else ""
        return f"the {self.source} train split (a stratified sample, all lengths{held_out})"

    def compute(self, model) -> dict[str, Any]:
        texts = [r["text"] for r in self.rows]
        gold = np.asarray([r["label"] for r in self.rows])
        features = model
        if getattr(model, "scorer_only", False):  # a scorer has no features: a fusion's model part has
            features = getattr(model, "model", None)
            if features is None:
                raise UsageError(f"{model.name} is a scorer (no features for the probe of {self.name})")
            self.notes.append(f"probe on the features of {features.name}, the fusion's model part")
        predicted, c = train_test_predictions(
            self.embed_for_probe(features, self.train_texts),
            self.train_labels,
            self.embed_for_probe(features, texts),
            seed=self.options.seed,
        )
        correct = (predicted == gold).astype(np.float64)
        retrieval = label_retrieval(similarity_rows(self, model, texts), gold, self.rng())
        if self.read_from_data_root:
            median = int(np.median([r["tokens"] for r in self.rows])) if self.rows else 0
            self.notes.append(
                f"{len(self.rows)} {self.source} {self.split} documents over {LONG_DOCUMENT_TOKENS} MiniLM "
                f"tokens (median {median}); probe trained on {len(self.train_texts)}"
            )
        return {
            "accuracy": 100.0 * float(correct.mean()),
            "accuracy_se": 100.0 * standard_error(correct),
            "map@100": retrieval["map@100"],
            "map@100_se": retrieval["map@100_se"],
            "p@10": retrieval["p@10"],
            "knn_accuracy": retrieval["knn_accuracy"],
            "documents": len(self.rows),
            "train_docs": len(self.train_texts),
            "c": c,
            "per_item": {"accuracy": correct.tolist(), "map@100": retrieval["per_item"]},
        }


@register_task
class IMDBLong(LongDocumentClassification):
    name = "imdb-long"
    source = "imdb"
    description = "IMDB reviews over 512 tokens: probe accuracy and same-label retrieval MAP@100 x100"


@register_task
class NewsgroupsLong(LongDocumentClassification):
    name = "20newsgroups-long"
    source = "20newsgroups"
    description = "20 Newsgroups posts over 512 tokens: probe accuracy and same-group retrieval MAP@100 x100"


@register_task
class IMDBLongValidation(IMDBLong):
    name = "imdb-long-val"
    split = "train"
    description = "IMDB *train* reviews over 512 tokens (for model selection): probe accuracy, MAP@100 x100"


@register_task
class NewsgroupsLongValidation(NewsgroupsLong):
    name = "20newsgroups-long-val"
    split = "train"
    description = "20 Newsgroups *train* posts over 512 tokens (for model selection): probe accuracy, MAP@100"


class PairedRetrieval(Evaluator):
    """Query i's one right answer is candidate i, among all the candidates: MRR x100 (ties counted against
    the answer), top-1, and each query's reciprocal rank (`per_item`). Built from in-memory text, e.g. a
    paragraph's first sentence and the rest of it (bench/bench_nugget_curve.py)."""

    name = "paired-retrieval"
    primary_metric = "mrr"
    supports_scorers = True

    def __init__(
        self, queries: Sequence[str], answers: Sequence[str], options=None, embed=None, fit_corpus=None
    ):
        super().__init__(options, embed, fit_corpus)
        if len(queries) != len(answers):
            raise UsageError(f"{len(queries)} queries but {len(answers)} answers")
        self.queries, self.answers = list(queries), list(answers)

    def texts(self) -> list[str]:
        return self.queries + self.answers

    def compute(self, model) -> dict[str, Any]:
        reciprocal = _pair_reciprocal_ranks(self, model, self.queries, self.answers)
        return {
            "mrr": 100.0 * float(reciprocal.mean()),
            "mrr_se": 100.0 * standard_error(reciprocal),
            "top1": 100.0 * float((reciprocal == 1.0).mean()),
            "queries": len(self.queries),
            "per_item": {"mrr": reciprocal.tolist()},
        }


@register_task
class Halves(PairedRetrieval):
    """Each of `documents` is cut in two at its middle word; its first half queries the second halves of
    all of them: MRR x100, ties counted against the right half."""

    name = "halves"
    description = "first half -> second half of long IMDB and 20NG test documents: MRR x100"
    datasets = ("imdb/test", "20newsgroups/test")

    def __init__(self, documents: Sequence[str], options=None, embed=None, fit_corpus=None):
        self.documents = list(documents)
        halves = [_halves(text) for text in self.documents]
        super().__init__([a for a, _ in halves], [b for _, b in halves], options, embed, fit_corpus)

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> Halves:
        """At most LONG_LIMIT / 2 long documents of each data set (seeded; `options.limit` in all, when
        smaller); baselines fit on samples of the IMDB and 20 Newsgroups train splits."""
        from docembed import datasets
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        rng = np.random.default_rng(options.seed)
        per_set = LONG_LIMIT // 2
        if options.limit:  # `--limit` / `--eval-limit N`: N documents in all, as every task takes N examples
            per_set = max(1, min(per_set, options.limit // len(cls.datasets)))
        rows = []
        for name in cls.datasets:
            rows += long_rows(name, options.data_root, rng, per_set)

        def train_samples() -> list[str]:
            texts = []
            for name in ("imdb/train", "20newsgroups/train"):
                train = list(datasets.records(name, options.data_root))
                sample_rng = np.random.default_rng(options.seed)
                keep = sample_indices(len(train), options.limit or TRAIN_LIMIT // 2, sample_rng)
                texts += [train[i]["text"] for i in keep]
            return texts

        kwargs.setdefault("fit_corpus", train_samples)
        return cls([r["text"] for r in rows], options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return list(self.documents)

    def fit_description(self) -> str:
        if not self.read_from_data_root:
            return "the documents themselves"
        return "samples of the IMDB and 20 Newsgroups train splits"

    def compute(self, model) -> dict[str, Any]:
        result = super().compute(model)
        if self.read_from_data_root:
            self.notes.append(
                f"{len(self.documents)} {self.datasets[0].split('/')[1]} documents over "
                f"{LONG_DOCUMENT_TOKENS} MiniLM tokens, cut at the middle word"
            )
        del result["queries"]
        return result | {"documents": len(self.documents)}


def _halves(text: str) -> tuple[str, str]:
    words = text.split()
    middle = len(words) // 2
    return " ".join(words[:middle]), " ".join(words[middle:])


@register_task
class HalvesValidation(Halves):
    name = "halves-val"
    description = "first half -> second half of long IMDB and 20NG *train* documents (model selection): MRR"
    # Corpus-fitted models fit on samples of these splits, so some halves may be in their fit: in-sample.
    datasets = ("imdb/train", "20newsgroups/train")


def _pair_reciprocal_ranks(task: Evaluator, model, queries: list[str], candidates: list[str]) -> np.ndarray:
    """Reciprocal rank of candidate i for query i among all candidates (ties counted against it)."""
    from docembed.scoring import cosine_matrix, maxsim_one_to_many, passage_scoring

    if getattr(model, "scorer_only", False):
        rows = scorer_rows(task, model, queries, candidates)
    elif model.supports("sparse"):
        model_q, model_c = model.encode_sparse(queries), model.encode_sparse(candidates)
        scores = np.asarray((model_q @ model_c.T).todense(), dtype=np.float64)
        rows = list(scores)
    else:
        q, c = task.embed(model, queries), task.embed(model, candidates)
        if isinstance(q, MultiVectors):
            rows = [maxsim_one_to_many(q[i], c, *passage_scoring(model)) for i in range(len(q))]
        else:
            rows = list(cosine_matrix(q, c))
    return metrics.reciprocal_ranks(
        [np.asarray(r, dtype=np.float64) for r in rows], list(range(len(queries)))
    )
