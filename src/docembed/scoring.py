"""Similarity scores, batched: cosine for dense embeddings, mean-MaxSim for multi-vector ones, and faiss
indexes for search.

mean-MaxSim (NUGGET eq. 10; ColBERT's MaxSim averaged instead of summed): for query vectors q_1..q_m and
document vectors d_1..d_k, score = (1/m) * sum_i max_j cos(q_i, d_j). It is asymmetric; `similarity`
reports it with the first text as the query. When a document's vectors are its passages (sbert-windows,
the student's late chunks), each max can be smoothed (`temperature` > 0, log-mean-exp over the passages):
between the best passage (0) and the mean over the whole (large), chosen on validation. How a query of
many passages itself is read follows the kind of query (`long_queries`): "passages" scores each of its
passages as above; "whole" reads a long query (LONG_QUERY_PASSAGES or more: a half of a long document) and
each document as wholes, the cosine of their passages' means, which validation prefers for halves while
shorter queries keep the part they are about. A model whose vectors are tokens (NUGGET's nuggets) can be
scored by passages too (`group_tokens`): its vectors grouped by the window their token position falls in,
each window scored by mean-MaxSim and the windows pooled as passages are.
"""

from __future__ import annotations

import numpy as np

from docembed.types import MultiVectors, Vectors, l2_normalize


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cos(a_i, b_i) for each row i."""
    return np.einsum("ij,ij->i", l2_normalize(a), l2_normalize(b))


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return l2_normalize(a) @ l2_normalize(b).T


#: How a long query is scored against documents of passages: each of its passages ("passages",
#: mean-MaxSim) or the whole query against each whole document ("whole": the cosine of the passages' means).
LONG_QUERIES = ("passages", "whole")
#: A query of at least this many passages (about 1,500 tokens: the half of a long document) is a long query.
#: Chosen on bench_long_retrieval's val tasks, the same for sbert-windows, the student's late chunks and the
#: retriever (val means, 2 -> 6 passages: 76.58 -> 77.10, 77.69 -> 78.23, 76.82 -> 77.48): at 2, texts of
#: one window and a short tail (paraphrase identification's passages) lost 3-4 MRR read whole.
LONG_QUERY_PASSAGES = 6


def passage_scoring(scorer) -> tuple[float, str, int]:
    """(passage_temperature, long_queries, passage_group_tokens) of a model or an index: the last three
    arguments of the scoring functions below, as it scores passages (the defaults for one without)."""
    temperature = float(getattr(scorer, "passage_temperature", 0.0))
    group_tokens = int(getattr(scorer, "passage_group_tokens", 0))
    return temperature, str(getattr(scorer, "long_queries", "passages")), group_tokens


def long_query_rows(queries: Vectors) -> np.ndarray:
    """Whether each query is a long one, LONG_QUERY_PASSAGES passages or more (one vector per text: none)."""
    if not isinstance(queries, MultiVectors):
        return np.zeros(len(queries), dtype=bool)
    return np.asarray(queries.counts) >= LONG_QUERY_PASSAGES


def reads_whole(query: np.ndarray, long_queries: str) -> bool:
    """Whether `long_queries` scores this query (its passage vectors, (m, d)) as a whole."""
    if long_queries not in LONG_QUERIES:
        raise ValueError(f"long_queries is one of {', '.join(LONG_QUERIES)}, not {long_queries!r}")
    return long_queries == "whole" and len(query) >= LONG_QUERY_PASSAGES


def whole_cosines(query: np.ndarray, docs: MultiVectors) -> np.ndarray:
    """cos(mean of the query's normalised vectors, mean of each document's): the texts read as wholes, as
    the mean of their windows is (sbert-chunks). A document with no vectors scores -1."""
    query_mean = l2_normalize(query).mean(axis=0, keepdims=True)
    doc_means = MultiVectors(l2_normalize(docs.vectors), docs.offsets).mean()
    scores = cosine_matrix(query_mean, doc_means)[0]
    scores[docs.counts == 0] = -1.0
    return scores.astype(np.float32)


def window_groups(docs: MultiVectors, group_tokens: int) -> tuple[MultiVectors, np.ndarray]:
    """`docs` cut into passages by token position: a vector at position p (in the text's wrapped token ids,
    its leading special token at 0) is in window (p - 1) // group_tokens, as NUGGET reads a long text in
    windows of group_tokens text tokens. Returns (the windows as documents, each window's document)."""
    if docs.positions is None:
        raise ValueError("scoring by windows needs the vectors' token positions (encode keeps them)")
    windows = np.maximum(np.asarray(docs.positions, dtype=np.int64) - 1, 0) // group_tokens
    owner = np.repeat(np.arange(len(docs)), docs.counts)
    key = owner * (int(windows.max(initial=0)) + 1) + windows
    vectors = docs.vectors
    if np.any(key[1:] < key[:-1]):  # encode gives them window by window; other vectors are sorted so
        order = np.argsort(key, kind="stable")
        vectors, key, owner = vectors[order], key[order], owner[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])  # a group where the (document, window) changes
    offsets = np.r_[starts, len(vectors)].astype(np.int64)
    return MultiVectors(vectors, offsets), owner[starts]


def window_scores(query: np.ndarray, docs: MultiVectors, group_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """mean-MaxSim of `query` with each window of each document (`window_groups`), and each window's
    document (sorted: a document's windows are consecutive)."""
    windows, owner = window_groups(docs, group_tokens)
    return maxsim_one_to_many(query, windows), owner


def passage_counts(docs: MultiVectors, group_tokens: int = 0) -> np.ndarray:
    """How many passages each document has: its vectors, or with `group_tokens` its windows."""
    if group_tokens <= 0 or len(docs.vectors) == 0:
        return np.asarray(docs.counts)
    return np.bincount(window_groups(docs, group_tokens)[1], minlength=len(docs))


def maxsim_one_to_many(
    query: np.ndarray,
    docs: MultiVectors,
    temperature: float = 0.0,
    long_queries: str = "passages",
    group_tokens: int = 0,
) -> np.ndarray:
    """mean-MaxSim of one query (m, d) against every document of `docs`, in one matrix product.
    A document with no vectors scores -1 (the lowest cosine), an empty query 0.

    `temperature` > 0 replaces each max by its smooth form over the document's vectors (passages), the
    log-mean-exp `t * log(mean_j exp(s_j / t))`: 0 is the best passage (MaxP), large values tend to the mean
    of the passages' cosines, so one number moves from "the part the query is about" to "the whole".
    `long_queries="whole"` scores a long query (LONG_QUERY_PASSAGES vectors or more) by `whole_cosines`.
    `group_tokens` > 0 scores token vectors by passages (`window_groups`): each window of a document by
    mean-MaxSim, then the best window (temperature 0) or their log-mean-exp at `temperature`."""
    if len(query) == 0 or len(docs) == 0:
        return np.zeros(len(docs), dtype=np.float32)
    if group_tokens > 0:
        if len(docs.vectors) == 0:
            return np.full(len(docs), -1.0, dtype=np.float32)
        per_window, owner = window_scores(query, docs, group_tokens)
        counts = np.bincount(owner, minlength=len(docs))  # each document's windows, one score each
        scores = smooth_max(per_window[None, :], counts, temperature)[0]
    else:
        if reads_whole(query, long_queries) and len(docs.vectors):
            return whole_cosines(query, docs)
        sims = l2_normalize(query) @ l2_normalize(docs.vectors).T  # (m, total)
        counts = docs.counts
        if sims.shape[1] == 0:
            return np.full(len(docs), -1.0, dtype=np.float32)
        scores = smooth_max(sims, counts, temperature).mean(axis=0)
    scores[counts == 0] = -1.0
    return scores.astype(np.float32)


def smooth_max(sims: np.ndarray, counts: np.ndarray, temperature: float) -> np.ndarray:
    """Per query row, each document's max over its columns of `sims` (m, total; `counts` columns each, in
    order), or at `temperature` > 0 their log-mean-exp: (m, n). A document with no columns: -1."""
    best = reduce_columns(np.maximum, sims, counts, fill=-1.0)
    if temperature > 0:
        best = best + smooth_max_excess(sims, best, counts, temperature)
    return best


def reduce_columns(ufunc, values: np.ndarray, counts: np.ndarray, fill: float) -> np.ndarray:
    """`ufunc` over each document's columns of `values` (m, total; `counts` columns each, in order): (m, n),
    `fill` for a document with none. Only the non-empty documents' starts go to `reduceat`: an empty one's
    start, equal to the next one's (or past the end), would cut its neighbour short."""
    counts = np.asarray(counts)
    out = np.full((values.shape[0], len(counts)), fill, dtype=np.result_type(values, np.float32))
    present = counts > 0
    if present.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[present]
        out[:, present] = ufunc.reduceat(values, starts, axis=1)
    return out


def passage_span(spans, passage: int) -> list[int] | None:
    """[start, end] of `best_passages`' passage index among one text's passage `spans` (None for -1, and
    for an empty text: its one window holds no characters); an index one past the text's last window (a
    full last window's [SEP]: see best_passages) is its last."""
    if passage < 0 or len(spans) == 0:
        return None
    start, end = (int(x) for x in spans[min(passage, len(spans) - 1)])
    return [start, end] if end > start else None


def best_passages(
    query: np.ndarray, docs: MultiVectors, group_tokens: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per document, which of its vectors (passages) the query (m, d) matches best: the one with the
    highest cosine averaged over the query's vectors, as an index within the document (-1 for a document
    with no vectors), and that cosine (NaN there). With `group_tokens` (token vectors scored by windows),
    which of its windows: the one of highest mean-MaxSim, as its index among the document's windows, and
    that score. (A window is known by its vectors' token positions, and a window's special tokens share
    their positions with its neighbours' edge tokens: a short last window whose one nugget is its [CLS]
    joins the window before, a full last window's [SEP] makes one more: `passage_span` caps the index at
    the text's last window.)"""
    found = np.full(len(docs), -1, dtype=np.int64)
    cosines = np.full(len(docs), np.nan, dtype=np.float64)
    if len(query) == 0 or len(docs.vectors) == 0:
        return found, cosines
    if group_tokens > 0:
        per_window, owner = window_scores(query, docs, group_tokens)
        bounds = np.searchsorted(
            owner, np.arange(len(docs) + 1)
        )  # document i's windows: bounds[i]:bounds[i+1]
        for i in np.flatnonzero(np.diff(bounds)):
            mine = per_window[bounds[i] : bounds[i + 1]]
            found[i] = int(np.argmax(mine))
            cosines[i] = float(mine[found[i]])
        return found, cosines
    sims = (l2_normalize(query) @ l2_normalize(docs.vectors).T).mean(axis=0)
    for i, (start, stop) in enumerate(zip(docs.offsets[:-1], docs.offsets[1:], strict=True)):
        if stop > start:
            found[i] = int(np.argmax(sims[start:stop]))
            cosines[i] = float(sims[start + found[i]])
    return found, cosines


def smooth_max_excess(sims: np.ndarray, best: np.ndarray, counts: np.ndarray, temperature: float):
    """log-mean-exp minus max of each document's columns of `sims` (m, total), per query row: (m, n), <= 0.
    Computed from the max (so exp never overflows); a document with no vectors gets 0."""
    owner = np.repeat(np.arange(len(counts)), counts)
    shifted = np.exp((sims - best[:, owner]) / temperature)  # in (0, 1]
    sums = reduce_columns(np.add, shifted, counts, fill=0.0)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), 1.0)
    return temperature * np.log(np.maximum(means, np.finfo(np.float64).tiny))


#: Above this many query x document vector products per pair, one BLAS GEMM per pair is already efficient
#: (Python's per-pair overhead is a few percent of it) and beats numpy's stacked matmul, which has no
#: BLAS path; below it, pairs are scored in padded batches. Measured in bench/bench_speed.py.
LARGE_PAIR = 64 * 64


def maxsim_pairs(
    queries: MultiVectors,
    docs: MultiVectors,
    batch_size: int = 32,
    temperature: float = 0.0,
    long_queries: str = "passages",
    group_tokens: int = 0,
) -> np.ndarray:
    """mean-MaxSim of queries[i] against docs[i] for every i (`temperature`, `long_queries`,
    `group_tokens`: see maxsim_one_to_many).

    Pairs are sorted by size and cut into batches of similar shapes (little padding). A batch of small
    sets is one gather into padded arrays and one stacked matrix product; a batch of large sets is
    scored with one GEMM per pair (see LARGE_PAIR)."""
    if len(queries) != len(docs):
        raise ValueError("maxsim_pairs needs as many queries as documents")
    if group_tokens > 0:  # by windows: one pair at a time (its windows are a few small documents)
        return np.array(
            [
                maxsim_one_to_many(queries[i], docs.select([i]), temperature, long_queries, group_tokens)[0]
                for i in range(len(queries))
            ],
            dtype=np.float32,
        )
    q_flat = l2_normalize(queries.vectors).astype(np.float32, copy=False)
    d_flat = l2_normalize(docs.vectors).astype(np.float32, copy=False)
    q_counts, d_counts = queries.counts, docs.counts
    scores = np.zeros(len(queries), dtype=np.float32)
    for batch in _similar_size_batches(q_counts, d_counts, batch_size):
        if int(q_counts[batch].max()) * int(d_counts[batch].max()) >= LARGE_PAIR:
            for i in batch:
                scores[i] = _mean_maxsim(q_flat, queries.offsets, d_flat, docs.offsets, i, temperature)
            continue
        q_pad, q_mask = _gather_padded(q_flat, queries.offsets[batch], q_counts[batch])
        d_pad, d_mask = _gather_padded(d_flat, docs.offsets[batch], d_counts[batch])
        sims = np.matmul(q_pad, d_pad.transpose(0, 2, 1))  # (b, mq, md)
        sims[np.broadcast_to(~d_mask[:, None, :], sims.shape)] = -2.0  # padding never wins
        best = np.maximum(sims.max(axis=2), -1.0)  # (b, mq); a document without vectors gives -1
        if temperature > 0:  # padding (-2) adds exp(<= -1 / t) per slot: removed by counting real slots
            shifted = np.exp((sims - best[:, :, None]) / temperature) * d_mask[:, None, :]
            means = shifted.sum(axis=2) / np.maximum(d_mask.sum(axis=1), 1)[:, None]
            smooth = best + temperature * np.log(np.maximum(means, np.finfo(np.float32).tiny))
            best = np.where(d_mask.any(axis=1)[:, None], smooth, best)
        n_q = q_mask.sum(axis=1)
        scores[batch] = np.where(n_q > 0, (best * q_mask).sum(axis=1) / np.maximum(n_q, 1), 0.0)
    if long_queries != "passages":
        for i in np.flatnonzero(q_counts >= LONG_QUERY_PASSAGES):
            if reads_whole(queries[i], long_queries) and d_counts[i]:
                scores[i] = whole_cosines(queries[i], docs.select([i]))[0]
    return scores


def _mean_maxsim(q_flat, q_offsets, d_flat, d_offsets, i: int, temperature: float = 0.0) -> float:
    q = q_flat[q_offsets[i] : q_offsets[i + 1]]
    d = d_flat[d_offsets[i] : d_offsets[i + 1]]
    if len(q) == 0:
        return 0.0
    if len(d) == 0:
        return -1.0
    sims = q @ d.T
    best = sims.max(axis=1)
    if temperature > 0:
        best = best + smooth_max_excess(sims, best[:, None], np.array([len(d)]), temperature)[:, 0]
    return float(best.mean())


def _similar_size_batches(q_counts: np.ndarray, d_counts: np.ndarray, batch_size: int, group: int = 8):
    """Index batches whose pairs have similar query and document sizes, so padding wastes little:
    sort by document size, cut groups of `group` batches, sort each group by query size, cut batches."""
    by_doc = np.argsort(d_counts, kind="stable")
    span = batch_size * group
    for start in range(0, len(by_doc), span):
        block = by_doc[start : start + span]
        block = block[np.argsort(q_counts[block], kind="stable")]
        for offset in range(0, len(block), batch_size):
            yield block[offset : offset + batch_size]


def _gather_padded(flat: np.ndarray, starts: np.ndarray, counts: np.ndarray):
    """Rows starts[i] .. starts[i] + counts[i] of `flat`, zero-padded to the widest: (b, width, dim), mask."""
    width = max(int(counts.max(initial=0)), 1)
    columns = np.arange(width)
    mask = columns[None, :] < counts[:, None]
    if len(flat) == 0:
        return np.zeros((len(counts), width, flat.shape[1]), dtype=np.float32), mask
    padded = flat[np.where(mask, starts[:, None] + columns[None, :], 0)]
    padded[~mask] = 0.0
    return padded, mask


def score_pairs(
    left: Vectors,
    right: Vectors,
    temperature: float = 0.0,
    long_queries: str = "passages",
    group_tokens: int = 0,
) -> np.ndarray:
    """Similarity of left[i] and right[i]: cosine (dense) or mean-MaxSim with left as query (multi; its max
    smoothed at `temperature` > 0, a long query read whole by `long_queries`, token vectors scored by
    windows with `group_tokens`: see maxsim_one_to_many)."""
    if isinstance(left, MultiVectors) != isinstance(right, MultiVectors):
        raise ValueError("cannot compare dense with multi-vector embeddings")
    if isinstance(left, MultiVectors):
        return maxsim_pairs(
            left, right, temperature=temperature, long_queries=long_queries, group_tokens=group_tokens
        )
    return cosine_pairs(left, right).astype(np.float32)


def score_one_to_many(
    query: Vectors,
    candidates: Vectors,
    temperature: float = 0.0,
    long_queries: str = "passages",
    group_tokens: int = 0,
) -> np.ndarray:
    """Scores of one query (a 1-row array or a 1-document MultiVectors) against all candidates."""
    if isinstance(query, MultiVectors):
        return maxsim_one_to_many(query[0], candidates, temperature, long_queries, group_tokens)
    return (cosine_matrix(np.asarray(query).reshape(1, -1), candidates)[0]).astype(np.float32)


def score_matrix(
    queries: Vectors,
    candidates: Vectors,
    temperature: float = 0.0,
    long_queries: str = "passages",
    group_tokens: int = 0,
) -> np.ndarray:
    """Scores of every query against every candidate, (len(queries), len(candidates)) float32: cosine
    (dense) or mean-MaxSim with the queries as queries (multi-vector, one query at a time)."""
    if isinstance(queries, MultiVectors) != isinstance(candidates, MultiVectors):
        raise ValueError("cannot compare dense with multi-vector embeddings")
    if not isinstance(queries, MultiVectors):
        return cosine_matrix(np.asarray(queries), np.asarray(candidates)).astype(np.float32)
    scores = np.zeros((len(queries), len(candidates)), dtype=np.float32)
    for row in range(len(queries)):
        scores[row] = maxsim_one_to_many(queries[row], candidates, temperature, long_queries, group_tokens)
    return scores


def rank(scores: np.ndarray) -> np.ndarray:
    """Indices best first; ties keep input order (stable)."""
    return np.argsort(-scores, kind="stable")
