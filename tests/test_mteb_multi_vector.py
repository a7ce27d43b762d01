"""MtebEncoder(model, multi_vector="maxsim") on an STS task (#47): MTEB's STS evaluator compares the two
sides' embeddings row by row (paired cosine, distances) and through the model's `similarity_pairwise`; the
vector sets of a multi-vector model are scored there by mean-MaxSim, pair by pair. The task is built in
memory (no network)."""

import numpy as np
import pytest
from scipy.stats import pearsonr

import docembed

pytest.importorskip("mteb")

PAIRS = [
    ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
    ("A woman is slicing onions.", "Someone cuts an onion.", 4.2),
    ("The cat sleeps on the sofa.", "A dog runs in the park.", 0.6),
    ("Stocks fell sharply on Tuesday.", "Markets dropped at the start of the week.", 3.9),
    ("Children play football outside.", "The chef cooks pasta.", 0.2),
    ("He reads a book in the library.", "A man is reading in a library.", 4.5),
]


def sts_task():
    from datasets import Dataset
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    class PairsSTS(AbsTaskSTS):
        metadata = TaskMetadata(
            name="DocembedPairsSTS",
            description="Six sentence pairs scored from 0 to 5.",
            reference=None,
            dataset={"path": "local", "revision": "1"},
            type="STS",
            category="t2t",
            modalities=["text"],
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            main_score="cosine_spearman",
            date=("2026-11-26", "2026-11-26"),
            domains=[],
            task_subtypes=[],
            license="mit",
            annotations_creators="derived",
            dialect=[],
            sample_creation="created",
            bibtex_citation="",
        )

        def load_data(self, num_proc=None, **kwargs):
            rows = [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in PAIRS]
            self.dataset = {"default": {"test": Dataset.from_list(rows)}}
            self.data_loaded = True

    return PairsSTS()


def evaluate(encoder) -> dict:
    import mteb

    result = mteb.evaluate(encoder, sts_task(), cache=None, show_progress_bar=False)
    return result.task_results[0].scores["test"][0]


@pytest.fixture(scope="module")
def tokens_model(tiny_sbert_tokens_dir):
    return docembed.load(tiny_sbert_tokens_dir, device="cpu")


@pytest.fixture(scope="module")
def nugget_model(minilm_tokenizer):
    from tiny_models import tiny_nugget

    return docembed.Model(tiny_nugget(minilm_tokenizer))


def own_maxsim(model) -> np.ndarray:
    """Each pair's mean-MaxSim (the first sentence's vectors against the second's), by docembed itself."""
    first = model.encode([a for a, _, _ in PAIRS], normalize_embeddings=True)
    second = model.encode([b for _, b, _ in PAIRS], normalize_embeddings=True)
    return np.array(
        [model.similarity(first.select([i]), second.select([i]))[0, 0] for i in range(len(PAIRS))]
    )


@pytest.mark.parametrize("which", ["tokens_model", "nugget_model"])
def test_maxsim_runs_an_sts_task_with_mean_maxsim_per_pair(request, which):
    from docembed.integrations.mteb import MtebEncoder

    model = request.getfixturevalue(which)
    scores = evaluate(MtebEncoder(model, multi_vector="maxsim"))
    gold = [s / 5 for _, _, s in PAIRS]
    # the model's own similarity (MTEB's "pearson") is the mean-MaxSim of each pair ...
    assert scores["pearson"] == pytest.approx(pearsonr(gold, own_maxsim(model))[0], abs=1e-4)
    # ... and the generic paired cosine is that of the mean-pooled vectors, as multi_vector="mean" gives
    pooled = evaluate(MtebEncoder(model, multi_vector="mean"))
    assert scores["cosine_pearson"] == pytest.approx(pooled["cosine_pearson"], abs=1e-4)
    assert np.isfinite(scores["main_score"])


def test_the_calls_the_sts_evaluator_makes(tokens_model):
    """encode each side (an STS task's metadata), then paired cosine on the rows and similarity_pairwise."""
    from sklearn.metrics.pairwise import paired_cosine_distances

    from docembed.integrations.mteb import MtebEncoder

    encoder = MtebEncoder(tokens_model, multi_vector="maxsim")
    task = sts_task().metadata
    sides = [[a for a, _, _ in PAIRS], [b for _, b, _ in PAIRS]]
    first, second = (
        encoder.encode([{"text": side}], task_metadata=task, hf_split="test", hf_subset="default")
        for side in sides
    )
    assert first.shape == second.shape == (len(PAIRS), tokens_model.dim)  # rows, of one width
    assert np.all(np.isfinite(1 - paired_cosine_distances(first, second)))
    assert np.allclose(encoder.similarity_pairwise(first, second), own_maxsim(tokens_model), atol=1e-5)
    # the full matrix through `similarity`, its diagonal the pairs
    matrix = encoder.similarity(first, second)
    assert matrix.shape == (len(PAIRS), len(PAIRS))
    assert np.allclose(np.diag(matrix), own_maxsim(tokens_model), atol=1e-5)
    with pytest.raises(ValueError, match="maxsim"):
        encoder.similarity_pairwise(first + 1.0, second)  # rows this encoder did not give


def test_retrieval_still_gets_the_vector_sets(tokens_model):
    from docembed.integrations.mteb import MtebEncoder
    from test_integrations import retrieval_task

    encoder = MtebEncoder(tokens_model, multi_vector="maxsim")
    padded = encoder.encode(
        [{"text": ["one two three", "four"]}],
        task_metadata=retrieval_task().metadata,
        hf_split="test",
        hf_subset="default",
    )
    assert padded.ndim == 3 and padded.shape[0] == 2
