"""Batched cosine / mean-MaxSim against naive per-pair loops; long queries read whole."""

import numpy as np
import pytest

from docembed.scoring import (
    LONG_QUERY_PASSAGES,
    maxsim_one_to_many,
    maxsim_pairs,
    rank,
    score_matrix,
    score_one_to_many,
    score_pairs,
)
from docembed.types import MultiVectors


def naive_mean_maxsim(q, d):
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    return float(np.mean([max(float(a @ b) for b in dn) for a in qn]))


def random_multi(rng, counts, dim=8):
    return MultiVectors.from_list([rng.standard_normal((c, dim)).astype(np.float32) for c in counts])


def test_maxsim_one_to_many_matches_naive():
    rng = np.random.default_rng(0)
    query = rng.standard_normal((5, 8)).astype(np.float32)
    docs = random_multi(rng, [1, 4, 7, 2])
    expected = [naive_mean_maxsim(query, docs[i]) for i in range(len(docs))]
    np.testing.assert_allclose(maxsim_one_to_many(query, docs), expected, rtol=1e-5)


def test_maxsim_pairs_matches_naive_across_batches_and_handles_empty_docs():
    rng = np.random.default_rng(1)
    queries = random_multi(rng, [3, 1, 6, 2, 5])
    docs = random_multi(rng, [2, 5, 1, 0, 3])
    scores = maxsim_pairs(queries, docs, batch_size=2)
    for i in (0, 1, 2, 4):
        assert abs(scores[i] - naive_mean_maxsim(queries[i], docs[i])) < 1e-5
    assert scores[3] == -1.0  # a document without vectors scores the lowest cosine
    assert maxsim_one_to_many(queries[0], docs)[3] == -1.0


@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_documents_without_vectors_at_the_end_leave_the_others_whole(temperature):
    """An empty document after the last non-empty one must not cut that one's passages short."""
    rng = np.random.default_rng(6)
    query = rng.standard_normal((2, 8)).astype(np.float32)
    docs = random_multi(rng, [3, 0, 5, 0, 0])
    alone = [maxsim_one_to_many(query, MultiVectors.from_list([docs[i]]), temperature)[0] for i in (0, 2)]
    scores = maxsim_one_to_many(query, docs, temperature)
    np.testing.assert_allclose(scores[[0, 2]], alone, rtol=1e-6)
    assert scores[[1, 3, 4]].tolist() == [-1.0, -1.0, -1.0]
    grouped = MultiVectors(docs.vectors, docs.offsets, np.arange(len(docs.vectors)) % 5 + 1)
    by_window = maxsim_one_to_many(query, grouped, temperature, group_tokens=2)
    first = MultiVectors(grouped.vectors[:3], np.array([0, 3]), grouped.positions[:3])
    last = MultiVectors(grouped.vectors[3:], np.array([0, 5]), grouped.positions[3:])
    expected = [maxsim_one_to_many(query, one, temperature, group_tokens=2)[0] for one in (first, last)]
    np.testing.assert_allclose(by_window[[0, 2]], expected, rtol=1e-6)


def test_maxsim_is_asymmetric_mean_over_query_vectors():
    q = np.array([[1, 0], [0, 1]], dtype=np.float32)
    d = np.array([[1, 0]], dtype=np.float32)
    # query vector 1 matches (1), vector 2 is orthogonal (0): mean 0.5; reversed: 1.0
    assert np.isclose(maxsim_one_to_many(q, MultiVectors.from_list([d]))[0], 0.5)
    assert np.isclose(maxsim_one_to_many(d, MultiVectors.from_list([q]))[0], 1.0)


def test_dense_scores_are_cosines_and_rank_is_stable():
    a = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    b = np.array([[1.0, 0.0], [-2.0, -2.0]], dtype=np.float32)
    np.testing.assert_allclose(score_pairs(a, b), [1.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(score_one_to_many(a[:1], b), [1.0, -np.sqrt(0.5)], atol=1e-6)
    assert rank(np.array([0.2, 0.9, 0.2])).tolist() == [1, 0, 2]


def naive_smooth_maxsim(q, d, temperature):
    """mean over query vectors of t * log(mean_j exp(cos(q_i, d_j) / t)), computed directly."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    sims = qn.astype(np.float64) @ dn.T.astype(np.float64)
    return float(np.mean(temperature * np.log(np.mean(np.exp(sims / temperature), axis=1))))


def test_passage_temperature_is_log_mean_exp_in_every_scoring_path():
    rng = np.random.default_rng(3)
    queries = random_multi(rng, [2, 1, 3, 2, 1])
    docs = random_multi(rng, [4, 1, 9, 0, 70])  # the last pair is past LARGE_PAIR: the per-pair GEMM path
    for temperature in (0.02, 0.3):
        pairs = maxsim_pairs(queries, docs, batch_size=2, temperature=temperature)
        for i in (0, 1, 2, 4):
            expected = naive_smooth_maxsim(queries[i], docs[i], temperature)
            assert abs(pairs[i] - expected) < 1e-4
            one = maxsim_one_to_many(queries[i], docs, temperature)[i]
            assert abs(one - expected) < 1e-4
        assert pairs[3] == -1.0 and maxsim_one_to_many(queries[0], docs, temperature)[3] == -1.0


def test_passage_temperature_moves_from_the_best_passage_to_the_mean():
    rng = np.random.default_rng(4)
    query = rng.standard_normal((1, 8)).astype(np.float32)
    docs = random_multi(rng, [6, 3])
    sims = [(query / np.linalg.norm(query)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T for d in docs]
    best = maxsim_one_to_many(query, docs, 0.0)
    np.testing.assert_allclose(best, [s.max() for s in sims], rtol=1e-5)
    np.testing.assert_allclose(maxsim_one_to_many(query, docs, 1e-4), best, atol=1e-4 * np.log(6) + 1e-6)
    smooth = maxsim_one_to_many(query, docs, 10.0)  # mean + variance / (2 t) for large t (Jensen: >= mean)
    means = np.array([s.mean() for s in sims])
    assert np.all(smooth >= means - 1e-6) and np.all(smooth - means < 0.01)
    # smoothing never raises a score above the best passage, and a one-passage document keeps its cosine
    assert np.all(maxsim_one_to_many(query, docs, 0.1) <= best + 1e-6)
    one = random_multi(rng, [1])
    np.testing.assert_allclose(maxsim_one_to_many(query, one, 0.1), maxsim_one_to_many(query, one), rtol=1e-5)
    np.testing.assert_allclose(
        score_one_to_many(MultiVectors.from_list([query]), docs, 0.1),
        maxsim_one_to_many(query, docs, 0.1),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        score_pairs(MultiVectors.from_list([query, query]), docs, 0.1),
        maxsim_one_to_many(query, docs, 0.1),
        rtol=1e-5,
    )


def naive_whole(q, d):
    """cos(mean of the normalised query vectors, mean of the normalised document vectors)."""
    qm = (q / np.linalg.norm(q, axis=1, keepdims=True)).mean(axis=0)
    dm = (d / np.linalg.norm(d, axis=1, keepdims=True)).mean(axis=0)
    return float(qm @ dm / (np.linalg.norm(qm) * np.linalg.norm(dm)))


def test_a_long_query_read_whole_scores_the_means_and_a_short_one_its_passages():
    rng = np.random.default_rng(5)
    docs = random_multi(rng, [3, 1, 5, 0])
    long_query = rng.standard_normal((LONG_QUERY_PASSAGES, 8))
    short_query = rng.standard_normal((LONG_QUERY_PASSAGES - 1, 8))
    whole = maxsim_one_to_many(long_query, docs, 0.1, "whole")
    np.testing.assert_allclose(whole[:3], [naive_whole(long_query, docs[i]) for i in range(3)], rtol=1e-5)
    assert whole[3] == -1.0  # a document without vectors still scores the lowest cosine
    assert not np.allclose(whole, maxsim_one_to_many(long_query, docs, 0.1))
    # fewer passages make no long query: they are scored as before, at the temperature
    np.testing.assert_array_equal(
        maxsim_one_to_many(short_query, docs, 0.1, "whole"), maxsim_one_to_many(short_query, docs, 0.1)
    )
    # pairs, one-to-many and the matrix agree, whichever path each pair takes
    queries = MultiVectors.from_list([long_query, short_query, long_query, short_query])
    pairs = maxsim_pairs(queries, docs, batch_size=2, temperature=0.1, long_queries="whole")
    expected = [maxsim_one_to_many(queries[i], docs, 0.1, "whole")[i] for i in range(4)]
    np.testing.assert_allclose(pairs, expected, rtol=1e-5)
    np.testing.assert_allclose(score_pairs(queries, docs, 0.1, "whole"), expected, rtol=1e-5)
    matrix = score_matrix(queries, docs, 0.1, "whole")
    np.testing.assert_allclose(np.diag(matrix), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="long_queries is one of passages, whole"):
        maxsim_one_to_many(long_query, docs, 0.0, "mean")
