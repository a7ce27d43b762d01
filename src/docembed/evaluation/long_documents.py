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

from typing import Any

import numpy as np

from docembed.evaluation import metrics
from docembed.evaluation.base import Evaluator, register_task
from docembed.evaluation.probes import train_test_predictions
from docembed.evaluation.retrieval import label_retrieval, similarity_rows
from docembed.types import MultiVectors

LONG_TOKENS = 512
LONG_LIMIT = 600
TRAIN_LIMIT = 1000  # probe training documents when no --limit is given (all lengths, stratified)


def minilm_lengths(texts: list[str]) -> np.ndarray:
    """WordPiece token counts with all-MiniLM-L6-v2's tokenizer (special tokens included)."""
    from transformers import AutoTokenizer

    from docembed.models.offline import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    tokenizer.model_max_length = 10**9  # counting, not encoding: no "longer than the maximum" warning
    lengths = []
    for start in range(0, len(texts), 512):
        encoded = tokenizer(texts[start : start + 512], add_special_tokens=True, truncation=False)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
    return np.asarray(lengths, dtype=np.int64)


def long_rows(name: str, data_root: str | None, rng: np.random.Generator, limit: int) -> list[dict]:
    """Records of data set `name` over LONG_TOKENS tokens: a seeded sample of at most `limit`, in order;
    each keeps its position in the data set as `index`."""
    from docembed import datasets

    rows = list(datasets.records(name, data_root))
    lengths = minilm_lengths([r["text"] for r in rows])
    long = np.flatnonzero(lengths > LONG_TOKENS)
    if len(long) > limit:
        long = np.sort(rng.choice(long, size=limit, replace=False))
    return [{**rows[i], "tokens": int(lengths[i]), "index": int(i)} for i in long]


def standard_error(values: np.ndarray) -> float:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


class LongDocumentClassification(Evaluator):
    primary_metric = "accuracy"
    source = ""
    split = "test"  # "train" for the -val tasks: evaluated on long train documents

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys((f"{self.source}/train", f"{self.source}/{self.split}")))

    def fit_texts(self) -> list[str]:
        return self._train()[0]

    def fit_description(self) -> str:
        held_out = ", outside the validation sample" if self.split == "train" else ""
        return f"the {self.source} train split (a stratified sample, all lengths{held_out})"

    def _evaluated(self) -> list[dict]:
        # Kept: the probe's split (for -val tasks) and compute() both need it, and it tokenizes a whole split.
        if getattr(self, "_evaluated_rows", None) is None:
            self._evaluated_rows = long_rows(
                f"{self.source}/{self.split}", self.options.data_root, self.rng(), LONG_LIMIT
            )
        return self._evaluated_rows

    def _train(self) -> tuple[list[str], list]:
        from docembed import datasets
        from docembed.evaluation.tasks import _subset

        rows = list(datasets.records(f"{self.source}/train", self.options.data_root))
        if self.split == "train":  # the probe never sees the validation documents
            evaluated = {r["index"] for r in self._evaluated()}
            rows = [r for i, r in enumerate(rows) if i not in evaluated]
        labels = [r["label"] for r in rows]
        keep = _subset(len(rows), self.options.limit or TRAIN_LIMIT, self.rng(), labels)
        return [rows[i]["text"] for i in keep], [labels[i] for i in keep]

    def compute(self, model) -> dict[str, Any]:
        train_texts, train_labels = self._train()
        test = self._evaluated()
        texts = [r["text"] for r in test]
        gold = np.asarray([r["label"] for r in test])
        predicted, c = train_test_predictions(
            self.embed_for_probe(model, train_texts),
            train_labels,
            self.embed_for_probe(model, texts),
            seed=self.options.seed,
        )
        correct = (predicted == gold).astype(np.float64)
        retrieval = label_retrieval(similarity_rows(self, model, texts), gold, self.rng())
        self.notes.append(
            f"{len(test)} {self.source} {self.split} documents over {LONG_TOKENS} MiniLM tokens "
            f"(median {int(np.median([r['tokens'] for r in test]))}); probe trained on {len(train_texts)}"
        )
        return {
            "accuracy": 100.0 * float(correct.mean()),
            "accuracy_se": 100.0 * standard_error(correct),
            "map@100": retrieval["map@100"],
            "map@100_se": retrieval["map@100_se"],
            "p@10": retrieval["p@10"],
            "knn_accuracy": retrieval["knn_accuracy"],
            "documents": len(test),
            "train_docs": len(train_texts),
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


@register_task
class Halves(Evaluator):
    name = "halves"
    primary_metric = "mrr"
    description = "first half -> second half of long IMDB and 20NG test documents: MRR x100"
    datasets = ("imdb/test", "20newsgroups/test")

    def fit_texts(self) -> list[str]:
        from docembed import datasets
        from docembed.evaluation.tasks import _subset

        texts = []
        for name in ("imdb/train", "20newsgroups/train"):
            rows = list(datasets.records(name, self.options.data_root))
            keep = _subset(len(rows), self.options.limit or TRAIN_LIMIT // 2, self.rng())
            texts += [rows[i]["text"] for i in keep]
        return texts

    def fit_description(self) -> str:
        return "samples of the IMDB and 20 Newsgroups train splits"

    def compute(self, model) -> dict[str, Any]:
        rng = self.rng()
        rows = []
        for name in self.datasets:
            rows += long_rows(name, self.options.data_root, rng, LONG_LIMIT // 2)
        firsts, seconds = [], []
        for row in rows:
            words = row["text"].split()
            middle = len(words) // 2
            firsts.append(" ".join(words[:middle]))
            seconds.append(" ".join(words[middle:]))
        reciprocal = _pair_reciprocal_ranks(self, model, firsts, seconds)
        self.notes.append(
            f"{len(rows)} {self.datasets[0].split('/')[1]} documents over {LONG_TOKENS} MiniLM tokens, "
            "cut at the middle word"
        )
        return {
            "mrr": 100.0 * float(reciprocal.mean()),
            "mrr_se": 100.0 * standard_error(reciprocal),
            "top1": 100.0 * float((reciprocal == 1.0).mean()),
            "documents": len(rows),
            "per_item": {"mrr": reciprocal.tolist()},
        }


@register_task
class HalvesValidation(Halves):
    name = "halves-val"
    description = "first half -> second half of long IMDB and 20NG *train* documents (model selection): MRR"
    # Corpus-fitted models fit on samples of these splits, so some halves may be in their fit: in-sample.
    datasets = ("imdb/train", "20newsgroups/train")


def _pair_reciprocal_ranks(task: Evaluator, model, queries: list[str], candidates: list[str]) -> np.ndarray:
    """Reciprocal rank of candidate i for query i among all candidates (ties counted against it)."""
    from docembed.scoring import cosine_matrix, maxsim_one_to_many

    if model.supports("sparse"):
        model_q, model_c = model.encode_sparse(queries), model.encode_sparse(candidates)
        scores = np.asarray((model_q @ model_c.T).todense(), dtype=np.float64)
        rows = list(scores)
    else:
        q, c = task.embed(model, queries), task.embed(model, candidates)
        if isinstance(q, MultiVectors):
            rows = [maxsim_one_to_many(q[i], c) for i in range(len(q))]
        else:
            rows = list(cosine_matrix(q, c))
    return metrics.reciprocal_ranks(
        [np.asarray(r, dtype=np.float64) for r in rows], list(range(len(queries)))
    )
