"""The evaluation tasks, one class each, registered by name (see `TASKS` and `GROUPS` in __init__)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from docembed.errors import DocembedError
from docembed.evaluation import metrics
from docembed.evaluation.base import Evaluator, register_task
from docembed.evaluation.probes import SENTEVAL_GRID, senteval_cv_accuracy, train_test_predictions
from docembed.evaluation.retrieval import label_retrieval, similarity_rows
from docembed.evaluation.statistics import LONG_DOCUMENT_TOKENS, sample_indices
from docembed.types import MultiVectors, Vectors


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
    each query's reciprocal rank.

    Built from `docs` (id -> text) and `queries` ({"source": id, "candidates": [ids], "answer": index of the
    gold candidate}). `options.limit` keeps a seeded sample of the queries at evaluation time (drawn with
    the same generator that shuffles the candidates): `evaluated_queries()` are the ones scored."""

    name = "paraphrase-identification"
    primary_metric = "mrr"
    description = "PI dev (NUGGET paper): MRR x100 over 20 candidates, pessimistic ties"
    split = "dev"
    supports_scorers = True

    def __init__(
        self, docs: dict[str, str], queries: Sequence[dict], options=None, embed=None, fit_corpus=None
    ):
        super().__init__(options, embed, fit_corpus)
        self.docs, self.queries = dict(docs), list(queries)
        for query in self.queries:
            missing = [i for i in [query["source"], *query["candidates"]] if i not in self.docs]
            if missing:
                raise DocembedError(f"{self.name}: unknown document id(s) {missing[:3]}")

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (
            f"paraphrase_identification/{self.split}/docs",
            f"paraphrase_identification/{self.split}/task",
        )

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> ParaphraseIdentification:
        from docembed import datasets
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        root = options.data_root
        docs = {d.id: d.text for d in datasets.documents(f"paraphrase_identification/{cls.split}/docs", root)}
        queries = list(datasets.records(f"paraphrase_identification/{cls.split}/task", root))
        return cls(docs, queries, options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return list(self.docs.values())

    def fit_description(self) -> str:
        return f"every document of the {self.split} split (the unlabelled pool the candidates come from)"

    def evaluated_queries(self) -> list[dict]:
        """The queries compute() scores: all of them, or the seeded `options.limit` sample."""
        return [self.queries[i] for i in sample_indices(len(self.queries), self.options.limit, self.rng())]

    def evaluated_texts(self) -> list[str]:
        """The documents compute() embeds, in the order it embeds them (sorted by id)."""
        chosen = self.evaluated_queries()
        return [self.docs[i] for i in sorted({i for q in chosen for i in [q["source"], *q["candidates"]]})]

    def compute(self, model) -> dict[str, Any]:
        docs, queries = self.docs, self.queries
        rng = self.rng()
        queries = [queries[i] for i in sample_indices(len(queries), self.options.limit, rng)]
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
            from docembed.scoring import passage_scoring, score_one_to_many

            for source, candidates, gold in shuffled:
                rows = [row[c] for c in candidates]
                if sparse:
                    scores = np.asarray((vectors[rows] @ vectors[row[source]].T).todense()).ravel()
                else:
                    scores = score_one_to_many(
                        _rows(vectors, [row[source]]), _rows(vectors, rows), *passage_scoring(model)
                    )
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
    """Logistic-regression probe, 10-fold stratified CV (shuffle, seed 1111), C by inner CV (SentEval).
    Built from `sentences` and their `labels`; `grid` is the probe's C grid (SentEval's 2^-2..2^3 when
    None)."""

    primary_metric = "accuracy"
    source = ""
    name = "senteval"

    def __init__(
        self,
        sentences: Sequence[str],
        labels: Sequence,
        options=None,
        embed=None,
        fit_corpus=None,
        grid: Sequence[float] | None = None,
    ):
        super().__init__(options, embed, fit_corpus)
        self.sentences, self.labels = list(sentences), list(labels)
        self.grid = tuple(grid) if grid is not None else SENTEVAL_GRID

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"senteval/{self.source}",)

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> SentEvalClassification:
        """The set's sentences, a seeded sample of `options.limit` stratified by label."""
        from docembed import datasets
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        rows = list(datasets.records(f"senteval/{cls.source}", options.data_root))
        labels = [r["label"] for r in rows]
        keep = sample_indices(len(rows), options.limit, np.random.default_rng(options.seed), labels)
        return cls([rows[i]["text"] for i in keep], [labels[i] for i in keep], options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return list(self.sentences)

    def fit_description(self) -> str:
        return "all sentences of the set, without labels (SentEval has no fixed training split)"

    def compute(self, model) -> dict[str, Any]:
        texts, labels = self.sentences, self.labels
        features = self.embed_for_probe(model, texts)
        outer, inner = (5, 3) if self.options.fast else (10, 10)
        result = senteval_cv_accuracy(features, labels, outer, inner, seed=self.options.seed, grid=self.grid)
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
    """Unsupervised STS: Spearman x100 between similarity (cosine, or mean-MaxSim) and human scores.
    Built from `sentences1`, `sentences2` (pair i is sentences1[i], sentences2[i]) and the gold `scores`."""

    primary_metric = "spearman"
    source = ""
    name = "sts"

    split = "test"  # "dev" for model selection

    def __init__(
        self,
        sentences1: Sequence[str],
        sentences2: Sequence[str],
        scores: Sequence[float],
        options=None,
        embed=None,
        fit_corpus=None,
    ):
        super().__init__(options, embed, fit_corpus)
        if not len(sentences1) == len(sentences2) == len(scores):
            raise DocembedError(f"{self.name}: sentences1, sentences2 and scores differ in length")
        self.sentences1, self.sentences2 = list(sentences1), list(sentences2)
        self.scores = [float(s) for s in scores]

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"senteval/{self.source}-{self.split}",)

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> SemanticSimilarity:
        """The split's pairs (a seeded `options.limit` sample); baselines fit on the train split's text."""
        from docembed import datasets
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        rows = list(datasets.records(f"senteval/{cls.source}-{cls.split}", options.data_root))
        rows = [
            rows[i] for i in sample_indices(len(rows), options.limit, np.random.default_rng(options.seed))
        ]

        def train_sentences() -> list[str]:
            train = datasets.records(f"senteval/{cls.source}-train", options.data_root)
            return [t for r in train for t in (r["s1"], r["s2"])]

        kwargs.setdefault("fit_corpus", train_sentences)
        pairs = ([r["s1"] for r in rows], [r["s2"] for r in rows], [r["score"] for r in rows])
        return cls(*pairs, options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return [t for pair in zip(self.sentences1, self.sentences2, strict=True) for t in pair]

    def fit_description(self) -> str:
        return "the task's training split" if self.read_from_data_root else "the pairs' sentences"

    def compute(self, model) -> dict[str, Any]:
        from docembed.scoring import passage_scoring, score_pairs

        sentences = sorted(set(self.sentences1) | set(self.sentences2))
        index = {s: i for i, s in enumerate(sentences)}
        left = [index[s] for s in self.sentences1]
        right = [index[s] for s in self.sentences2]
        if model.supports("sparse"):
            vectors = model.encode_sparse(sentences)
            predicted = _sparse_rowwise_dot(vectors[left], vectors[right])
        else:
            vectors = self.embed(model, sentences)
            predicted = score_pairs(_rows(vectors, left), _rows(vectors, right), *passage_scoring(model))
        gold = np.array(self.scores)
        from scipy.stats import pearsonr

        pearson = float(pearsonr(predicted, gold).statistic) if len(gold) > 1 else 0.0
        return {
            "spearman": 100.0 * metrics.spearman(predicted, gold),
            "pearson": 100.0 * (0.0 if np.isnan(pearson) else pearson),
            "pairs": len(gold),
        }


STSEvaluator = SemanticSimilarity  # the sentence-transformers name of the same thing


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
    (more than 512 tokens), where document embedders should beat truncating sentence encoders. Built from
    the training texts and labels and the test texts and labels."""

    primary_metric = "accuracy"
    source = ""
    name = "document-classification"

    def __init__(
        self,
        train_texts: Sequence[str],
        train_labels: Sequence,
        test_texts: Sequence[str],
        test_labels: Sequence,
        options=None,
        embed=None,
        fit_corpus=None,
    ):
        super().__init__(options, embed, fit_corpus)
        self.train_texts, self.train_labels = list(train_texts), list(train_labels)
        self.test_texts, self.test_labels = list(test_texts), list(test_labels)

    @property
    def datasets(self) -> tuple[str, ...]:  # type: ignore[override]
        return (f"{self.source}/train", f"{self.source}/test")

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> DocumentClassification:
        """Both splits, each a seeded `options.limit` sample stratified by label."""
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        train = labelled_sample(f"{cls.source}/train", options)
        test = labelled_sample(f"{cls.source}/test", options)
        return cls(*train, *test, options, **kwargs)._from_root()

    def texts(self) -> list[str]:
        return list(self.train_texts)

    def compute(self, model) -> dict[str, Any]:
        predicted, c = train_test_predictions(
            self.embed_for_probe(model, self.train_texts),
            self.train_labels,
            self.embed_for_probe(model, self.test_texts),
            seed=self.options.seed,
        )
        gold = np.asarray(self.test_labels)
        lengths, which = token_lengths(model, self.test_texts)
        long = lengths > LONG_DOCUMENT_TOKENS
        self.notes.append(f"long subset: test documents over {LONG_DOCUMENT_TOKENS} tokens of {which}")
        return {
            "accuracy": 100.0 * metrics.accuracy(predicted, gold),
            "accuracy_long": 100.0 * metrics.accuracy(predicted[long], gold[long]) if long.any() else None,
            "accuracy_short": 100.0 * metrics.accuracy(predicted[~long], gold[~long])
            if (~long).any()
            else None,
            "train_docs": len(self.train_texts),
            "test_docs": len(self.test_texts),
            "long_docs": int(long.sum()),
            "c": c,
        }


def labelled_sample(name: str, options) -> tuple[list[str], list]:
    """(texts, labels) of data set `name`: a seeded `options.limit` sample stratified by label, in order."""
    from docembed import datasets

    rows = list(datasets.records(name, options.data_root))
    labels = [r["label"] for r in rows]
    keep = sample_indices(len(rows), options.limit, np.random.default_rng(options.seed), labels)
    return [rows[i]["text"] for i in keep], [labels[i] for i in keep]


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
class LabelRetrieval(Evaluator):
    """Each document queries all the others; relevant = same label. MAP@100 and P@10 (x100), and
    leave-one-out kNN accuracy (k=10 majority vote, ties to the better-ranked label). Ties in similarity are
    broken by a seeded random order, never by data order. Built from `documents` and their `labels`."""

    name = "label-retrieval"
    primary_metric = "map@100"
    supports_scorers = True  # bm25, a fusion: each document's scores over all the documents

    def __init__(self, documents: Sequence[str], labels: Sequence, options=None, embed=None, fit_corpus=None):
        super().__init__(options, embed, fit_corpus)
        self.documents, self.labels = list(documents), list(labels)

    def texts(self) -> list[str]:
        return list(self.documents)

    def compute(self, model) -> dict[str, Any]:
        labels = np.asarray(self.labels)
        result = label_retrieval(similarity_rows(self, model, self.documents), labels, self.rng())
        return {k: result[k] for k in ("map@100", "p@10", "knn_accuracy")} | {
            "documents": len(self.documents),
            "per_item": {"map@100": result["per_item"]},
        }


@register_task
class NewsgroupsRetrieval(LabelRetrieval):
    name = "20newsgroups-retrieval"
    description = "20 Newsgroups test: query-by-document, MAP@100 / P@10 / kNN accuracy x100"
    datasets = ("20newsgroups/test",)

    @classmethod
    def from_data_root(cls, options=None, **kwargs) -> NewsgroupsRetrieval:
        """The test posts (a seeded `options.limit` sample stratified by group); baselines fit on the train
        split (the same `--limit`, stratified)."""
        from docembed.evaluation.base import EvalOptions

        options = options or EvalOptions()
        kwargs.setdefault("fit_corpus", lambda: labelled_sample("20newsgroups/train", options)[0])
        return cls(*labelled_sample("20newsgroups/test", options), options, **kwargs)._from_root()

    def fit_description(self) -> str:
        return "the 20 Newsgroups train split (the same --limit, stratified)"
