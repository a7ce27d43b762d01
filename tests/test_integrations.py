"""The framework adapters, each exercised through the framework's own interface: a retrieval task of ours run
by `mteb.evaluate`, LangChain's in-memory vector store, LlamaIndex's VectorStoreIndex (all in memory)."""

import numpy as np
import pytest

import docembed

DOCUMENTS = {
    "python": "Python raises an exception when an error occurs; try and except blocks catch it.",
    "cooking": "Simmer the tomato sauce for twenty minutes, then add basil and olive oil.",
    "football": "The striker scored twice in the second half and the home team won the league.",
    "astronomy": "Jupiter is the largest planet of the solar system, a gas giant with many moons.",
    "gardening": "Water the roses in the morning and prune them back in late winter.",
    "banking": "The central bank raised interest rates to slow inflation.",
}
QUERIES = {
    "q-python": "how do I handle errors in my program",
    "q-cooking": "recipe for a pasta sauce",
    "q-football": "who won the soccer match",
    "q-astronomy": "biggest planet orbiting the sun",
    "q-gardening": "when should I cut my rose bushes",
    "q-banking": "why are loans getting more expensive",
}


@pytest.fixture(scope="module")
def sbert():
    return docembed.load("sbert", device="cpu")


@pytest.fixture(scope="module")
def tokens_model():
    return docembed.load("sbert-tokens", device="cpu")


def own_recall_at_1(model) -> float:
    scores = model.similarity(list(QUERIES.values()), list(DOCUMENTS.values()))
    names = list(DOCUMENTS)
    hits = [
        names[int(np.argmax(row))] == query.removeprefix("q-")
        for row, query in zip(scores, QUERIES, strict=True)
    ]
    return float(np.mean(hits))


def retrieval_task():
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    class TopicRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="DocembedTopicRetrieval",
            description="Six short documents of different topics; a question finds its document.",
            reference=None,
            dataset={"path": "local", "revision": "1"},
            type="Retrieval",
            category="t2t",
            modalities=["text"],
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            main_score="recall_at_1",
            date=("2026-11-25", "2026-11-25"),
            domains=[],
            task_subtypes=[],
            license="mit",
            annotations_creators="derived",
            dialect=[],
            sample_creation="created",
            bibtex_citation="",
        )

        def load_data(self, num_proc=None, **kwargs):
            split = RetrievalSplitData(
                queries=Dataset.from_list([{"id": k, "text": v} for k, v in QUERIES.items()]),
                corpus=Dataset.from_list([{"id": k, "text": v, "title": ""} for k, v in DOCUMENTS.items()]),
                relevant_docs={query: {query.removeprefix("q-"): 1} for query in QUERIES},
                top_ranked=None,
            )
            self.dataset = {"default": {"test": split}}
            self.data_loaded = True

    return TopicRetrieval()


def mteb_recall_at_1(encoder) -> float:
    import mteb

    result = mteb.evaluate(encoder, retrieval_task(), cache=None, show_progress_bar=False)
    return float(result.task_results[0].scores["test"][0]["recall_at_1"])


def test_mteb_runs_our_task_and_agrees_with_our_own_scoring(sbert):
    from docembed.integrations.mteb import MtebEncoder

    score = mteb_recall_at_1(MtebEncoder(sbert))
    assert score == pytest.approx(own_recall_at_1(sbert), abs=1e-4)  # MTEB rounds to 5 decimals
    assert score >= 5 / 6  # sbert finds the topics; a broken adapter (shuffled rows) would not


def test_mteb_scores_a_multi_vector_model_pooled_or_with_mean_maxsim(tokens_model):
    from docembed.integrations.mteb import MtebEncoder

    maxsim = MtebEncoder(tokens_model, multi_vector="maxsim")
    assert mteb_recall_at_1(maxsim) == pytest.approx(own_recall_at_1(tokens_model), abs=1e-4)
    pooled = MtebEncoder(tokens_model)  # mean-pooled: one vector per text, cosine
    vectors = pooled.encode([{"text": ["a b c"]}], task_metadata=None, hf_split="test", hf_subset="default")
    assert vectors.shape == (1, tokens_model.dim)
    with pytest.raises(ValueError, match="multi_vector"):
        MtebEncoder(tokens_model, multi_vector="sum")


def test_langchain_store_finds_documents_by_meaning(sbert):
    from langchain_core.vectorstores import InMemoryVectorStore

    from docembed.integrations.langchain import DocembedEmbeddings

    embeddings = DocembedEmbeddings(sbert)
    store = InMemoryVectorStore.from_texts(list(DOCUMENTS.values()), embeddings, ids=list(DOCUMENTS))
    found = [store.similarity_search(query, k=1)[0].id for query in QUERIES.values()]
    assert np.mean(
        [hit == q.removeprefix("q-") for hit, q in zip(found, QUERIES, strict=True)]
    ) == own_recall_at_1(sbert)
    query = embeddings.embed_query(QUERIES["q-python"])
    assert len(query) == sbert.dim and abs(np.linalg.norm(query) - 1) < 1e-5
    assert np.allclose(query, sbert.encode(QUERIES["q-python"], normalize_embeddings=True), atol=1e-6)


def test_langchain_pools_a_multi_vector_model(tokens_model):
    from docembed.integrations.langchain import DocembedEmbeddings

    vectors = DocembedEmbeddings(tokens_model).embed_documents(["one two", "three"])
    assert np.array(vectors).shape == (2, tokens_model.dim)


def test_llamaindex_index_retrieves_by_meaning(sbert):
    from llama_index.core import VectorStoreIndex
    from llama_index.core.schema import TextNode

    from docembed.integrations.llamaindex import DocembedEmbedding

    nodes = [TextNode(text=text, id_=name) for name, text in DOCUMENTS.items()]
    index = VectorStoreIndex(nodes, embed_model=DocembedEmbedding(sbert))
    retriever = index.as_retriever(similarity_top_k=1)
    found = [retriever.retrieve(query)[0].node.node_id for query in QUERIES.values()]
    assert np.mean(
        [hit == q.removeprefix("q-") for hit, q in zip(found, QUERIES, strict=True)]
    ) == own_recall_at_1(sbert)
