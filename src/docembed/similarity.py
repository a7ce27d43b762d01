"""Pairwise similarity and reranking on top of any Encoder (what `similarity` and `rerank` run).

Texts are encoded in batches and scored with docembed.scoring: one matrix product per query for
reranking, padded batched products for pair lists; no Python loop per pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from docembed.encoding import capped
from docembed.errors import InputFormatError
from docembed.io.readers import batched
from docembed.models.base import Encoder
from docembed.models.baselines import sparse_cosines
from docembed.passages import passage_part
from docembed.scoring import (
    best_passages,
    passage_scoring,
    passage_span,
    rank,
    score_one_to_many,
    score_pairs,
)
from docembed.types import MultiVectors, Vectors


def similarity_scores(model: Encoder, left: Sequence[str], right: Sequence[str], batch_size: int = 32):
    """Score left[i] against right[i]: cosine, or mean-MaxSim with left[i] as the query; a scorer's own
    score (a fusion: each part normalised with its saved statistics)."""
    if hasattr(model, "pair_scores"):
        return model.pair_scores(left, right, embed=lambda m, texts: _encode(m, texts, batch_size))
    if getattr(model, "scorer_only", False):
        return np.array([model.score(a, [b])[0] for a, b in zip(left, right, strict=True)], dtype=np.float32)
    left_vectors, right_vectors = _encode(model, left, batch_size), _encode(model, right, batch_size)
    if _sparse_rows(model):
        return sparse_cosines(left_vectors, right_vectors, pairs=True).astype(np.float32)
    return score_pairs(left_vectors, right_vectors, *passage_scoring(model))


def fit_on_candidates(model: Encoder, rows: Iterable[tuple[int, dict]], source: str, docs=None):
    """A scorer that needs fitting (`bm25`, `bm25+sbert`) fitted on the rerank task's candidate documents
    (every --docs document, else the rows' candidate texts), saying so on stderr. Returns the rows (read
    once, kept) for rerank_rows; a model that needs no fitting gets them back untouched."""
    from docembed.runtime import log

    if not getattr(model, "requires_fit", False):
        if getattr(model, "family", None) == "fusion":  # two models, or a fitted folder: its weight said
            log(f"{model.name}: {_fusion_weight(model)}")
        return rows
    rows = list(rows)
    if docs is not None:
        texts = list(docs.values())
    else:
        candidates = (c for _, row in rows for c in row.get("candidates") or [] if isinstance(c, str))
        texts = list(dict.fromkeys(candidates))
    what = f"{len(texts)} candidate documents of {source}"
    if model.family == "tfidf":
        # the exact tf-idf rows, as `evaluate`, a fusion's built-in tfidf part and the results page score
        # them: an LSA fitted on the candidates would make the rule depend on how many there are
        model.config.svd_dim = 0
        what += " (exact tf-idf rows)"
    fitting = [part.name for part in model.unfitted_parts()] if hasattr(model, "unfitted_parts") else None
    model.fit(texts)
    if fitting is not None:  # a fusion: which of its parts were fitted
        log(f"{model.name}: {' and '.join(fitting)} fitted on the {what}; {_fusion_weight(model)}")
    else:
        log(f"{model.name} fitted on the {what}")
    return rows


def _fusion_weight(fusion) -> str:
    chosen = fusion.config.chosen_on
    how = f"chosen on {chosen}" if chosen else "the default, not chosen on validation data"
    return (
        f"fusion weight {fusion.weights_text()} ({fusion.config.normalization}), {how} (`docembed fit "
        "fusion` chooses one on your own queries)"
    )


def _encode(model: Encoder, texts: Sequence[str], batch_size: int) -> Vectors:
    """model.encode on what the model reads of each text (a huge text is cut first, as encode_texts does);
    tf-idf without an LSA projection: its exact rows, sparse (a dense copy is as wide as the vocabulary)."""
    if _sparse_rows(model):
        return model.encode_sparse(capped(model, texts))
    return model.encode(capped(model, texts), batch_size=batch_size)


def _sparse_rows(model) -> bool:
    return getattr(model, "scores_exact_rows", False)


def _take(vectors: Vectors, index: int) -> Vectors:
    if isinstance(vectors, MultiVectors):
        return vectors.select([index])
    return vectors[index : index + 1]


def rerank_rows(
    model: Encoder,
    rows: Iterable[tuple[int, dict]],
    source: str,
    docs: dict[str, str] | None = None,
    batch_size: int = 32,
    chunk_size: int = 256,
    passages: bool = False,
) -> Iterator[dict]:
    """Rerank each task row, best first. A row is {"source": id, "candidates": [ids]} (texts from `docs`),
    {"query": text, "candidates": [ids]} or {"query": text, "candidates": [texts]}. `rows` yields
    (line_number, record); each output row keeps the row's other fields (an id, an answer) but its
    candidates, which its ranking replaces. Rows are processed in chunks: all texts of a chunk are encoded
    together, each distinct document once. `passages`: each candidate also gets "passage": [start, end],
    the character offsets of the passage the query matches best (a model whose vectors are passages:
    Encoder.passage_spans; a fusion: its part that has them, passages.passage_part)."""
    part = passage_part(model) if passages else None
    for chunk in batched(rows, chunk_size):
        unique = _UniqueTexts()
        plans = []
        for line_number, row in chunk:
            query_key, candidate_keys, query_id, candidate_ids = _resolve(row, docs, source, line_number)
            q = unique.add(*_keyed(query_key, query_id, docs))
            c = [unique.add(*_keyed(k, candidate_ids, docs)) for k in candidate_keys]
            kept = {key: value for key, value in row.items() if key != "candidates"}  # qid, answer, ...
            plans.append((kept, query_key, candidate_keys, query_id, candidate_ids, q, c))
        spans = part.passage_spans(unique.texts) if passages else None
        scorer = getattr(model, "scorer_only", False)
        vectors = None if scorer else _encode(model, unique.texts, batch_size)
        score, part_vectors = _scorer(model, unique.texts, batch_size) if scorer else (None, None)
        if passages and scorer:
            vectors = part_vectors[part]  # a fusion's part: the passages its own encoding names
        for kept, query_key, candidate_keys, query_id, candidate_ids, q, c in plans:
            if score is not None:  # bm25, a fusion: scores over the query's own candidates
                scores = score(unique.texts[q], [unique.texts[i] for i in c])
            elif _sparse_rows(model):
                scores = sparse_cosines(_take(vectors, q), _gather(vectors, c))[0].astype(np.float32)
            else:
                scores = score_one_to_many(_take(vectors, q), _gather(vectors, c), *passage_scoring(model))
            key = "id" if candidate_ids else "text"
            order = rank(scores)
            ranking = [{key: candidate_keys[i], "score": round(float(scores[i]), 6)} for i in order]
            if spans is not None:
                group_tokens = passage_scoring(part)[2]
                best, _ = best_passages(_take(vectors, q)[0], _gather(vectors, c), group_tokens)
                for entry, i in zip(ranking, order, strict=True):
                    entry["passage"] = passage_span(spans[c[i]], best[i])
            yield {**kept, ("source" if query_id else "query"): query_key, "ranking": ranking}


def _text(key: str, is_id: bool, docs: dict[str, str] | None) -> str:
    """A row's query or candidate as text: an id's document, or the text itself."""
    return docs[key] if is_id else key


def _keyed(key: str, is_id: bool, docs: dict[str, str] | None) -> tuple[str, str]:
    """(a chunk's key, the text) of a row's query or candidate: an id and a text of the same string differ."""
    return ("id:" if is_id else "text:") + key, _text(key, is_id, docs)


def _scorer(model, texts: list[str], batch_size: int):
    """(score(query, candidates) of a scorer over one chunk, {model part: its vectors of the chunk's texts}):
    each model part of a fusion encodes the chunk's texts once."""
    if not hasattr(model, "lexical"):
        return model.score, {}
    parts = [model.model] if model.hybrid else [model.lexical, model.model]
    vectors = {part: _encode(part, texts, batch_size) for part in parts}
    slot = {text: i for i, text in enumerate(texts)}

    def embed(part, some: list[str]):
        return _gather(vectors[part], [slot[t] for t in some])

    return lambda query, candidates: model.score_matrix([query], candidates, embed=embed)[0], vectors


class _UniqueTexts:
    """Texts to encode for one chunk, each distinct document once."""

    def __init__(self):
        self.texts: list[str] = []
        self._slot: dict[str, int] = {}

    def add(self, key: str, text: str) -> int:
        if key not in self._slot:
            self._slot[key] = len(self.texts)
            self.texts.append(text)
        return self._slot[key]


def _gather(vectors: Vectors, indices: list[int]) -> Vectors:
    if isinstance(vectors, MultiVectors):
        return vectors.select(indices)
    return vectors[np.asarray(indices, dtype=np.int64)]


def check_row(row: dict, docs: dict[str, str] | None, source: str, line_number: int) -> None:
    """A rerank row's shape, as reranking reads it: an InputFormatError naming the line."""
    _resolve(row, docs, source, line_number)


def _resolve(row: dict, docs: dict[str, str] | None, source: str, line_number: int):
    """(query key, candidate keys, whether the query is an id, whether the candidates are ids) of a row: a
    "source" row is ids throughout; a "query" row's candidates are ids of `docs` when any one is (then
    every one must be: the query finds the document it is about), else texts."""
    candidates = row.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        raise InputFormatError(source, line_number, "'candidates' must be a non-empty list")
    if "source" in row:
        if docs is None:
            raise InputFormatError(
                source, line_number, "rows with 'source' ids need --docs FILE (the documents' texts)"
            )
        keys = [str(row["source"]), *map(str, candidates)]
        _require_ids(keys, docs, source, line_number)
        _refuse_repeated_ids(keys[1:], source, line_number)
        return keys[0], keys[1:], True, True
    if "query" in row and isinstance(row["query"], str):
        if not all(isinstance(c, str) for c in candidates):
            raise InputFormatError(source, line_number, "candidates of a 'query' row must be texts or ids")
        by_id = docs is not None and any(c in docs for c in candidates)
        if by_id:  # ids meant: every one must be there, once
            _require_ids(candidates, docs, source, line_number)
            _refuse_repeated_ids(candidates, source, line_number)
        return row["query"], candidates, False, by_id
    raise InputFormatError(source, line_number, "expected a 'source' id or a 'query' text")


def _require_ids(keys: list[str], docs: dict[str, str], source: str, line_number: int) -> None:
    missing = [k for k in keys if k not in docs]
    if missing:
        raise InputFormatError(source, line_number, f"ids not in --docs: {', '.join(missing[:5])}")


def _refuse_repeated_ids(candidates: list[str], source: str, line_number: int) -> None:
    """A candidate id given twice in a row: a run ranks each document once (`evaluate --run` refuses it)."""
    from collections import Counter

    repeated = [doc_id for doc_id, n in Counter(candidates).items() if n > 1]
    if repeated:
        raise InputFormatError(source, line_number, f"candidate ids given twice: {', '.join(repeated[:5])}")


def validation_queries(
    rows: Iterable[tuple[int, dict]], source: str, docs: dict[str, str] | None = None
) -> list[tuple[str, list[str], int]]:
    """Rerank rows with a right answer, as (query text, candidate texts, index of the right candidate):
    what choosing a fusion weight reads. A row is a rerank row plus "answer" (an index into candidates)."""
    out = []
    for line_number, row in rows:
        query_key, candidate_keys, query_id, candidate_ids = _resolve(row, docs, source, line_number)
        answer = row.get("answer")
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(candidate_keys):
            raise InputFormatError(source, line_number, "'answer' must be the index of the right candidate")
        texts = [_text(k, candidate_ids, docs) for k in candidate_keys]
        out.append((_text(query_key, query_id, docs), texts, answer))
    return out
