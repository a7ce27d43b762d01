"""The evaluation tasks, one class each, registered by name (see `TASKS` and `GROUPS` in __init__)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from docembed.errors import DocembedError
from docembed.evaluation import metrics
from docembed.evaluation.base import Evaluator, register_task
from docembed.evaluation.probes import senteval_cv_accuracy, train_test_predictions
from docembed.evaluation.retrieval import label_retrieval, similarity_rows
from docembed.types import MultiVectors, Vectors

LONG_DOCUMENT_TOKENS = 512


def _subset(
    n: int, limit: int | None, rng: np.random.Generator, labels: Sequence | None = None
) -> np.ndarray:
    """Indices of a seeded subset of size `limit` (stratified by `labels` when given), in data order."""
    if limit is None or limit >= n:
        return np.arange(n)
    if labels is None or limit < len(set(labels)):
        return np.sort(rng.choice(n, size=limit, replace=False))
    from sklearn.model_selection import train_test_split

    seed = int(rng.integers(2**31 - 1))
    chosen, _ = train_test_split(
        np.arange(n), train_size=limit, stratify=np.asarray(labels), random_state=seed
    )
    return np.sort(chosen)


def _rows(vectors: Vectors, indices: Sequence[int]) -> Vectors:
    if isinstance(vectors, MultiVectors):
        return vectors.select(list(indices))
    return vectors[np.asarray(indices, dtype=np.int64)]


def _sparse_rowwise_dot(left, right) -> np.ndarray:
    return np.asarray(left.multiply(right).sum(axis=1)).ravel()


# --- paraphrase identification ------------------------------------------------------------------------------
@register_task
class ParaphraseIdentification(Evaluator):
    """NUGGET's document-level paraphrase identification: rank 20 candidates for each source document.
    MRR x100 with the candidates shuffled (fixed seed) and ties counted against the gold; `per_item` keeps
    each query's reciprocal rank."""

    name = "paraphrase-identification"
    primary_metric = "mrr"
    description = "PI dev (NUGGET paper): MRR x100 over 20 candidates, pessimistic ties"
    split = "dev"
    supports_scorers = True

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (
            f"paraphrase_identification/{self.split}/docs",
            f"paraphrase_identification/{self.split}/task",
        )

    def _load(self) -> tuple[dict[str, str], list[dict]]:
        from docembed import datasets

        root = self.options.data_root
        docs = {d.id: d.text for d in datasets.documents(self.datasets[0], root)}
        queries = list(datasets.records(self.datasets[1], root))
        for query in queries:
            missing = [i for i in [query["source"], *query["candidates"]] if i not in docs]
            if missing:
                raise DocembedError(f"{self.datasets[1]}: unknown document id(s) {missing[:3]}")
        return docs, queries

    def fit_texts(self) -> list[str]:
        docs, _ = self._load()
        return list(docs.values())

    def fit_description(self) -> str:
        return f"every document of the {self.split} split (the unlabelled pool the candidates come from)"

    def compute(self, model) -> dict[str, Any]:
        docs, queries = self._load()
        rng = self.rng()
        queries = [queries[i] for i in _subset(len(queries), self.options.limit, rng)]
        score_lists, golds = [], []
        # Shuffle first: the gold stands first in ~98% of the given lists, so list order must carry no signal.
        shuffled = []
        for query in queries:
            order = rng.permutation(len(query["candidates"]))
            candidates = [query["candidates"][j] for j in order]
            shuffled.append((query["source"], candidates, int(np.flatnonzero(order == query["answer"])[0])))
        if getattr(model, "scorer_only", False):
            for source, candidates, gold in shuffled:
                score_lists.append(model.score(docs[source], [docs[c] for c in candidates]))
                golds.append(gold)
        else:
            needed = sorted({i for s, cands, _ in shuffled for i in [s, *cands]})
            row = {doc_id: n for n, doc_id in enumerate(needed)}
            texts = [docs[i] for i in needed]
            sparse = model.supports("sparse")
            vectors = model.encode_sparse(texts) if sparse else self.embed(model, texts)
            from docembed.scoring import score_one_to_many

            for source, candidates, gold in shuffled:
                rows = [row[c] for c in candidates]
                if sparse:
                    scores = np.asarray((vectors[rows] @ vectors[row[source]].T).todense()).ravel()
                else:
                    scores = score_one_to_many(_rows(vectors, [row[source]]), _rows(vectors, rows))
                score_lists.append(scores)
                golds.append(gold)
        rr = metrics.reciprocal_ranks(score_lists, golds)
        return {
            "mrr": 100.0 * float(rr.mean()),
            "top1": 100.0 * float(np.mean(rr == 1.0)),
            "queries": len(golds),
            "candidates_per_query": int(np.mean([len(s) for s in score_lists])) if score_lists else 0,
            # per query, in the evaluated order: two models on the same queries pair up for a standard error
            "per_item": {"mrr": [round(float(v), 6) for v in rr]},
        }


@register_task
class ParaphraseIdentificationTrain(ParaphraseIdentification):
    name = "paraphrase-identification-train"
    description = "PI train split, same protocol"
    split = "train"


# --- SentEval classification ----------------------------------------------------------------------------
class SentEvalClassification(Evaluator):
    """Logistic-regression probe, 10-fold stratified CV (shuffle, seed 1111), C by inner CV (SentEval)."""

    primary_metric = "accuracy"
    source = ""

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"senteval/{self.source}",)

    def _load(self) -> tuple[list[str], list]:
        from docembed import datasets

        rows = list(datasets.records(self.datasets[0], self.options.data_root))
        labels = [r["label"] for r in rows]
        keep = _subset(len(rows), self.options.limit, self.rng(), labels)
        return [rows[i]["text"] for i in keep], [labels[i] for i in keep]

    def fit_texts(self) -> list[str]:
        return self._load()[0]

    def fit_description(self) -> str:
        return "all sentences of the set, without labels (SentEval has no fixed training split)"

    def compute(self, model) -> dict[str, Any]:
        texts, labels = self._load()
        features = self.embed_for_probe(model, texts)
        outer, inner = (5, 3) if self.options.fast else (10, 10)
        result = senteval_cv_accuracy(features, labels, outer, inner, seed=self.options.seed)
        return {
            "accuracy": 100.0 * result["accuracy"],
            "accuracy_std": 100.0 * result["accuracy_std"],
            "folds": outer,
            "inner_folds": inner,
            "c_per_fold": result["c"],
            "examples": len(texts),
        }


def _senteval(source: str, title: str) -> type[SentEvalClassification]:
    cls = type(
        f"SentEval{source.upper()}",
        (SentEvalClassification,),
        {"name": source, "source": source, "description": f"SentEval {title}: CV probe accuracy x100"},
    )
    return register_task(cls)


for _source, _title in (
    ("mr", "movie review polarity"),
    ("cr", "customer review polarity"),
    ("subj", "subjectivity"),
    ("mpqa", "opinion polarity"),
):
    _senteval(_source, _title)


# --- STS ------------------------------------------------------------------------------------------------
class SemanticSimilarity(Evaluator):
    """Unsupervised STS: Spearman x100 between similarity (cosine, or mean-MaxSim) and human scores."""

    primary_metric = "spearman"
    source = ""

    split = "test"  # "dev" for model selection

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"senteval/{self.source}-{self.split}",)

    def fit_texts(self) -> list[str]:
        from docembed import datasets

        rows = datasets.records(f"senteval/{self.source}-train", self.options.data_root)
        return [t for r in rows for t in (r["s1"], r["s2"])]

    def compute(self, model) -> dict[str, Any]:
        from docembed import datasets
        from docembed.scoring import score_pairs

        rows = list(datasets.records(self.datasets[0], self.options.data_root))
        rows = [rows[i] for i in _subset(len(rows), self.options.limit, self.rng())]
        sentences = sorted({t for r in rows for t in (r["s1"], r["s2"])})
        index = {s: i for i, s in enumerate(sentences)}
        left = [index[r["s1"]] for r in rows]
        right = [index[r["s2"]] for r in rows]
        if model.supports("sparse"):
            vectors = model.encode_sparse(sentences)
            predicted = _sparse_rowwise_dot(vectors[left], vectors[right])
        else:
            vectors = self.embed(model, sentences)
            predicted = score_pairs(_rows(vectors, left), _rows(vectors, right))
        gold = np.array([float(r["score"]) for r in rows])
        from scipy.stats import pearsonr

        pearson = float(pearsonr(predicted, gold).statistic) if len(rows) > 1 else 0.0
        return {
            "spearman": 100.0 * metrics.spearman(predicted, gold),
            "pearson": 100.0 * (0.0 if np.isnan(pearson) else pearson),
            "pairs": len(rows),
        }


@register_task
class STSBenchmark(SemanticSimilarity):
    name = "stsb"
    source = "stsb"
    description = "STS-B test: Spearman x100 of cosine/MaxSim, unsupervised"


@register_task
class SICKRelatedness(SemanticSimilarity):
    name = "sick"
    source = "sick"
    description = "SICK-R test: Spearman x100 of cosine/MaxSim, unsupervised"


@register_task
class STSBenchmarkDev(STSBenchmark):
    name = "stsb-dev"
    split = "dev"
    description = "STS-B dev (1,500 pairs, for model selection): Spearman x100, unsupervised"


@register_task
class SICKRelatednessDev(SICKRelatedness):
    name = "sick-dev"
    split = "dev"
    description = "SICK-R dev (500 pairs, for model selection): Spearman x100, unsupervised"


# --- document classification ------------------------------------------------------------------------------
def token_lengths(model, texts: Sequence[str]) -> tuple[np.ndarray, str]:
    """Subword token counts (special tokens included) with the model's own tokenizer, or with MiniLM's
    (bert-base-uncased WordPiece) for models that have none; the second value says which was used."""
    tokenizer = getattr(model, "tokenizer", None)
    which = f"{model.name}'s tokenizer"
    if tokenizer is None or not callable(tokenizer):
        from transformers import AutoTokenizer

        from docembed.models.offline import minilm_path

        tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
        which = "the all-MiniLM-L6-v2 tokenizer (the model has no subword tokenizer)"
    lengths = []
    for start in range(0, len(texts), 256):
        encoded = tokenizer(list(texts[start : start + 256]), add_special_tokens=True, truncation=False)
        lengths.extend(len(ids) for ids in encoded["input_ids"])
    return np.array(lengths, dtype=np.int64), which


class DocumentClassification(Evaluator):
    """Linear probe trained on the train split, accuracy x100 on test; also on the long test documents
    (more than 512 tokens), where document embedders should beat truncating sentence encoders."""

    primary_metric = "accuracy"
    source = ""

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"{self.source}/train", f"{self.source}/test")

    def _split(self, split: str) -> tuple[list[str], list]:
        from docembed import datasets

        rows = list(datasets.records(f"{self.source}/{split}", self.options.data_root))
        labels = [r["label"] for r in rows]
        keep = _subset(len(rows), self.options.limit, self.rng(), labels)
        return [rows[i]["text"] for i in keep], [labels[i] for i in keep]

    def fit_texts(self) -> list[str]:
        return self._split("train")[0]

    def compute(self, model) -> dict[str, Any]:
        train_texts, train_labels = self._split("train")
        test_texts, test_labels = self._split("test")
        predicted, c = train_test_predictions(
            self.embed_for_probe(model, train_texts),
            train_labels,
            self.embed_for_probe(model, test_texts),
            seed=self.options.seed,
        )
        gold = np.asarray(test_labels)
        lengths, which = token_lengths(model, test_texts)
        long = lengths > LONG_DOCUMENT_TOKENS
        self.notes.append(f"long subset: test documents over {LONG_DOCUMENT_TOKENS} tokens of {which}")
        return {
            "accuracy": 100.0 * metrics.accuracy(predicted, gold),
            "accuracy_long": 100.0 * metrics.accuracy(predicted[long], gold[long]) if long.any() else None,
            "accuracy_short": 100.0 * metrics.accuracy(predicted[~long], gold[~long])
            if (~long).any()
            else None,
            "train_docs": len(train_texts),
            "test_docs": len(test_texts),
            "long_docs": int(long.sum()),
            "c": c,
        }


@register_task
class IMDB(DocumentClassification):
    name = "imdb"
    source = "imdb"
    description = "IMDB sentiment: probe accuracy x100 on test (and on >512-token reviews)"


@register_task
class TwentyNewsgroups(DocumentClassification):
    name = "20newsgroups"
    source = "20newsgroups"
    description = "20 Newsgroups topic: probe accuracy x100 on test (and on >512-token posts)"


# --- retrieval ----------------------------------------------------------------------------------------
@register_task
class NewsgroupsRetrieval(Evaluator):
    """Each 20 Newsgroups test document queries all the others; relevant = same newsgroup. MAP@100 and
    P@10 (x100), and leave-one-out kNN accuracy (k=10 majority vote, ties to the better-ranked label).
    Ties in similarity are broken by a seeded random order, never by data order."""

    name = "20newsgroups-retrieval"
    primary_metric = "map@100"
    description = "20 Newsgroups test: query-by-document, MAP@100 / P@10 / kNN accuracy x100"
    datasets = ("20newsgroups/test",)

    def fit_texts(self) -> list[str]:
        from docembed import datasets

        rows = list(datasets.records("20newsgroups/train", self.options.data_root))
        keep = _subset(len(rows), self.options.limit, self.rng(), [r["label"] for r in rows])
        return [rows[i]["text"] for i in keep]

    def fit_description(self) -> str:
        return "the 20 Newsgroups train split (the same --limit, stratified)"

    def compute(self, model) -> dict[str, Any]:
        from docembed import datasets

        rows = list(datasets.records(self.datasets[0], self.options.data_root))
        labels_all = [r["label"] for r in rows]
        keep = _subset(len(rows), self.options.limit, self.rng(), labels_all)
        texts = [rows[i]["text"] for i in keep]
        labels = np.asarray([labels_all[i] for i in keep])
        result = label_retrieval(similarity_rows(self, model, texts), labels, self.rng())
        return {k: result[k] for k in ("map@100", "p@10", "knn_accuracy")} | {"documents": len(texts)}
