"""Evaluators built from data in memory (the sentence-transformers pattern), each checked against a value
computed by hand; the data-root classmethod against the same evaluator built from the files' contents."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from docembed.evaluation import (
    DocumentClassification,
    EvalOptions,
    Halves,
    LabelRetrieval,
    LongDocumentClassification,
    ParaphraseIdentification,
    SentEvalClassification,
    STSEvaluator,
    get_evaluator,
)
from docembed.models.base import Encoder, EncoderConfig
from test_evaluation import WORDS, ConstantEncoder, build_data_root

NO_CACHE = EvalOptions(cache=False)


class WordCounts(Encoder):
    """A dense vector of word counts over WORDS: cosine is word overlap, computable by hand."""

    family = "word-counts-test"

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        out = np.zeros((len(texts), len(WORDS)), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                if word in WORDS:
                    out[row, WORDS.index(word)] += 1
        return out

    def save(self, directory):  # pragma: no cover - never saved
        raise NotImplementedError

    @classmethod
    def load(cls, directory, device="cpu"):  # pragma: no cover
        raise NotImplementedError


def model(cls=WordCounts):
    return cls(EncoderConfig(), name=cls.family)


def test_paraphrase_identification_from_documents_and_queries():
    docs = {
        "s1": "alpha bravo",
        "g1": "bravo alpha",
        "n1": "charlie",
        "s2": "delta",
        "g2": "echo",
        "n2": "delta",
    }
    queries = [
        {"source": "s1", "candidates": ["g1", "n1"], "answer": 0},  # gold shares both words: rank 1
        {"source": "s2", "candidates": ["n2", "g2"], "answer": 1},  # the other candidate is the copy: rank 2
    ]
    result = ParaphraseIdentification(docs, queries, NO_CACHE).run(model())
    assert result.score == pytest.approx(100 * (1 + 1 / 2) / 2)
    assert result.metrics["per_item"]["mrr"] == [1.0, 0.5]
    assert result.data == {}  # built from memory: no data set was read


def test_paraphrase_identification_rejects_unknown_documents():
    from docembed.errors import DocembedError

    with pytest.raises(DocembedError, match="unknown document"):
        ParaphraseIdentification({"a": "x"}, [{"source": "a", "candidates": ["b"], "answer": 0}])


def test_embed_function_replaces_the_models_encode():
    docs = {"s": "alpha", "g": "alpha", "n": "bravo"}
    queries = [{"source": "s", "candidates": ["g", "n"], "answer": 0}]
    seen = []

    def constant(model, texts):
        seen.append(list(texts))
        return np.ones((len(texts), 2), dtype=np.float32)  # every score ties: the gold ranks last

    evaluator = ParaphraseIdentification(docs, queries, NO_CACHE, embed=constant)
    assert evaluator.run(model()).score == pytest.approx(50.0)
    assert seen == [evaluator.evaluated_texts()]  # the embedded texts, in the order the evaluator says


def test_sts_from_sentence_pairs_and_scores():
    sentences1 = ["alpha bravo", "alpha bravo", "alpha bravo"]
    sentences2 = ["alpha bravo", "alpha charlie", "delta echo"]  # cosine 1, 1/2, 0
    evaluator = STSEvaluator(sentences1, sentences2, [5.0, 2.5, 0.0], NO_CACHE)
    assert evaluator.run(model()).score == pytest.approx(100.0)
    reversed_gold = STSEvaluator(sentences1, sentences2, [0.0, 2.5, 5.0], NO_CACHE).run(model())
    assert reversed_gold.score == pytest.approx(-100.0)
    assert reversed_gold.metrics["pairs"] == 3


def separable(n: int, offset: int = 0) -> tuple[list[str], list[int]]:
    """n texts, label i % 2: "alpha" marks label 1, "foxtrot" label 0; the second word carries no label."""
    texts = [f"{'alpha' if i % 2 else 'foxtrot'} {WORDS[1 + (i // 2 + offset) % 4]}" for i in range(n)]
    return texts, [i % 2 for i in range(n)]


def test_senteval_classification_from_sentences_and_labels_with_a_c_grid():
    texts, labels = separable(20)
    evaluator = SentEvalClassification(texts, labels, EvalOptions(cache=False, fast=True), grid=(16.0,))
    result = evaluator.run(model())
    assert result.score == pytest.approx(100.0) and result.metrics["examples"] == 20
    assert result.metrics["c_per_fold"] == [16.0] * 5  # the grid given, not SentEval's


def test_document_classification_from_train_and_test_texts():
    train, test = separable(20), separable(10, offset=2)
    result = DocumentClassification(*train, *test, NO_CACHE).run(model())
    assert result.score == pytest.approx(100.0)
    assert (result.metrics["train_docs"], result.metrics["test_docs"], result.metrics["long_docs"]) == (
        20,
        10,
        0,
    )


def test_label_retrieval_from_documents_and_labels():
    documents = ["alpha"] * 3 + ["bravo"] * 3
    result = LabelRetrieval(documents, [0, 0, 0, 1, 1, 1], NO_CACHE).run(model())
    assert result.metrics["map@100"] == pytest.approx(100.0)  # both same-label documents rank first
    assert result.metrics["per_item"]["map@100"] == [1.0] * 6  # one average precision per query
    assert result.metrics["p@10"] == pytest.approx(100 * 2 / 10)
    # each document's 5 neighbours: 2 of its label, 3 of the other -> the vote is always wrong
    assert result.metrics["knn_accuracy"] == 0.0


def test_long_document_classification_from_rows():
    train = separable(20)
    rows = [{"text": t, "label": y} for t, y in zip(*separable(6, offset=1), strict=True)]
    evaluator = LongDocumentClassification(*train, rows, NO_CACHE)
    result = evaluator.run(model()).metrics
    assert result["accuracy"] == pytest.approx(100.0) and result["accuracy_se"] == 0.0
    assert result["documents"] == 6 and result["per_item"]["accuracy"] == [1.0] * 6


def test_halves_from_documents():
    documents = [f"{a} {a} {b} {b}" for a, b in (("alpha", "bravo"), ("charlie", "delta"), ("echo", "golf"))]
    # each first half ("alpha alpha") shares nothing with any second half: every score ties at 0
    tied = Halves(documents, NO_CACHE).run(model()).metrics
    assert tied["mrr"] == pytest.approx(100 / 3) and tied["documents"] == 3
    found = Halves([f"{a} {a} {a} {a}" for a in WORDS[:4]], NO_CACHE).run(model()).metrics
    assert found["mrr"] == pytest.approx(100.0) and found["mrr_se"] == 0.0


def test_paired_retrieval_ranks_each_answer_among_all_and_refuses_unequal_lists():
    from docembed.errors import UsageError
    from docembed.evaluation import PairedRetrieval

    queries = [f"{a} {a}" for a in WORDS[:4]]
    answers = [f"{a} {a} {a}" for a in WORDS[:4]]
    found = PairedRetrieval(queries, answers, NO_CACHE).run(model()).metrics
    assert found["mrr"] == pytest.approx(100.0) and found["queries"] == 4
    assert found["per_item"]["mrr"] == [1.0] * 4
    swapped = PairedRetrieval(queries, answers[1:] + answers[:1], NO_CACHE).run(model()).metrics
    assert swapped["top1"] == 0.0  # each query's answer is now another word's: never first
    with pytest.raises(UsageError, match="3 queries but 4 answers"):
        PairedRetrieval(queries[:3], answers, NO_CACHE)


# --- the data-root classmethods read what the registry reads ------------------------------------------------
@pytest.fixture
def data_root(tmp_path):
    return build_data_root(tmp_path / "data")


def test_data_root_classmethod_equals_the_evaluator_built_from_the_files(data_root):
    from docembed import datasets

    root = str(data_root)
    options = EvalOptions(data_root=root, limit=12, cache=False)
    docs = {d.id: d.text for d in datasets.documents("paraphrase_identification/dev/docs", root)}
    queries = list(datasets.records("paraphrase_identification/dev/task", root))
    in_memory = ParaphraseIdentification(docs, queries, options).run(model())
    registry = get_evaluator("pi", options).run(model())
    assert in_memory.metrics == registry.metrics and registry.metrics["queries"] == 12
    assert set(registry.data) == {"paraphrase_identification/dev/docs", "paraphrase_identification/dev/task"}

    rows = list(datasets.records("senteval/stsb-test", root))
    pairs = ([r["s1"] for r in rows], [r["s2"] for r in rows], [r["score"] for r in rows])
    full = EvalOptions(data_root=root, cache=False)
    assert STSEvaluator(*pairs, full).run(model()).metrics == get_evaluator("stsb", full).run(model()).metrics

    news = get_evaluator("20newsgroups-retrieval", full)
    test_rows = list(datasets.records("20newsgroups/test", root))
    assert news.documents == [r["text"] for r in test_rows]  # what it evaluated on, public
    rebuilt = LabelRetrieval(news.documents, news.labels, full).run(model())
    assert rebuilt.metrics == news.run(model()).metrics


def test_a_variant_is_a_new_evaluator_built_from_the_public_data(data_root):
    """A held-out subset of the queries: no monkeypatching, a new evaluator on the registry's data."""
    options = EvalOptions(data_root=str(data_root), cache=False)
    whole = get_evaluator("pi", options)
    last = ParaphraseIdentification(whole.docs, whole.queries[-5:], options).run(
        ConstantEncoder(EncoderConfig())
    )
    assert last.metrics["queries"] == 5 and last.score == pytest.approx(5.0)  # 20 tied candidates


def test_nugget_encodes_from_shared_token_states_as_it_encodes(minilm_tokenizer):
    from nugget_helpers import TEXTS
    from tiny_models import tiny_nugget

    reference = tiny_nugget(minilm_tokenizer, freeze="encoder", feedback=False, selector="chunk")
    states = reference.token_states(TEXTS)
    # a model with its own scorer over the same frozen backbone reads the reference's states
    scorer = tiny_nugget(minilm_tokenizer, freeze="encoder", feedback=False)
    for encoder in (reference, scorer):
        direct, shared = encoder.encode(TEXTS), encoder.encode_from_states(TEXTS, states)
        assert shared.offsets.tolist() == direct.offsets.tolist()
        assert np.array_equal(shared.positions, direct.positions)
        assert np.allclose(shared.vectors, direct.vectors, atol=1e-5)
