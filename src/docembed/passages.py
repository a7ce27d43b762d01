"""The passage a search hit matched (`search --passages`, serve's /search "passages": true).

An index built from a model whose vectors are passages (sbert-windows, the student with --long late-chunks)
holds each document as its passage vectors, and `search` groups passage hits into their documents: one hit
per document, scored by the smooth maximum over its passages (the passage temperature; the best passage at
0). A hit's best passage is the one `rerank --passages` picks (scoring.best_passages over the document's
stored vectors), its span found in the document's text by the model's tokenizer (Encoder.passage_spans),
so a search and a rerank of the same query and document name the same span. Works on any index with
`metadata` and `vectors_of(ids)` (faiss_index.VectorIndex, lance_index.LanceIndex).
"""

from __future__ import annotations

from collections.abc import Sequence

from docembed.errors import DocembedError, UsageError
from docembed.scoring import best_passages, passage_counts, passage_scoring, passage_span
from docembed.types import MultiVectors

PASSAGE_MODELS = (
    "sbert-windows, retriever, student-passages, nugget-passages, or a student saved with long_documents "
    "late-chunks"
)


def refuse_index_without_passages(index, where: str, option: str = "--passages") -> None:
    """Refuse, before any model loads, an index whose vectors cannot be passages: one vector per document,
    or a model family that has no passages. `option`: what asked for passages, named in the error."""
    metadata = index.metadata
    model = metadata.get("model_source") or metadata.get("model") or "its model"
    if metadata.get("kind") != "multi":
        raise UsageError(
            f"{option}: {where} holds one vector per document ({model}): its hits have no passages "
            f"(index the output of {PASSAGE_MODELS})"
        )
    if not _family_has_passages(metadata.get("family")):
        raise UsageError(
            f"{option}: {where} was built with {model} ({metadata.get('family')}), whose vectors are not "
            f"passages ({PASSAGE_MODELS})"
        )


def _family_has_passages(family: str | None) -> bool:
    """Whether a model family can make passage vectors (True when the index does not say which family)."""
    from docembed.models.families import FAMILY_MODULES, get_family

    if family not in FAMILY_MODULES:
        return True  # an older or unknown record: the loaded model is checked instead
    return "passages" in get_family(family).capabilities


#: the built-ins whose vectors are passages (what check_passage_model accepts of them once loaded)
BUILTIN_PASSAGE_MODELS = frozenset({"sbert-windows", "retriever", "student-passages", "nugget-passages"})


def _no_passages(option: str, name) -> UsageError:
    return UsageError(
        f"{option} needs a model whose vectors are passages ({PASSAGE_MODELS}, or a fusion with one of "
        f"them such as tfidf+retriever), not {name!r}"
    )


def refuse_spec_without_passages(resolved, option: str = "--passages") -> None:
    """Refuse, before it loads, a model spec (registry.resolve_model's answer; None with --server) that is
    a built-in without passages, or a fusion of such built-ins. A folder or hub part may be saved with
    passages: check_passage_model checks it once loaded."""
    if resolved is None:
        return
    parts = resolved.parts if resolved.kind == "fusion" else (resolved,)
    if all(p.kind in ("builtin", "fitted") and p.name not in BUILTIN_PASSAGE_MODELS for p in parts):
        raise _no_passages(option, resolved.spec)


def check_passage_model(encoder, option: str = "--passages"):
    """The model that names the passages: `encoder` itself, which must cut texts into passages as the
    index's vectors were cut (the rule `rerank --passages` applies), or a fusion's part that does
    (passage_part). Returns that model."""
    part = passage_part(encoder)
    if not cuts_passages(part):
        raise _no_passages(option, getattr(encoder, "name", encoder))
    return part


def passage_part(encoder):
    """The model whose passages a ranking by `encoder` names: `encoder` itself, or for a fusion
    (`tfidf+retriever`, `student-passages+nugget-passages`) its model part when that cuts passages, else
    its first model. The fusion ranks the documents; that part says which passage of each the query
    is about, the one it scores the document by. A fusion with neither gives its model part."""
    if not (getattr(encoder, "scorer_only", False) and hasattr(encoder, "lexical")):
        return encoder
    parts = [encoder.model] if encoder.hybrid else [encoder.model, encoder.lexical]
    return next((part for part in parts if cuts_passages(part)), encoder.model)


def cuts_passages(encoder) -> bool:
    """Whether `encoder`'s vectors are passages with character spans (`passage_spans`)."""
    supports = getattr(encoder, "supports", None)
    return bool(
        supports and supports("passages") and encoder.multi_vector and hasattr(encoder, "passage_spans")
    )


def add_passages(rows: Sequence[dict], queries: Sequence[MultiVectors], index, encoder) -> None:
    """Give each hit of each search row (`rows[i]["results"]`, hits carrying their "text") the character
    span of its best passage for the row's query, "passage": [start, end], and that span's "passage_text";
    both null for a hit without text. `queries[i]`: row i's query vectors (a MultiVectors of one);
    `index`: a faiss or Lance index holding the hits' passage vectors; `encoder`: the query's model."""
    for row, query in zip(rows, queries, strict=True):
        hits = row["results"]
        if not hits:
            continue
        stored = index.vectors_of([hit["id"] for hit in hits])
        group_tokens = passage_scoring(index)[2]
        found, _ = best_passages(query[0], stored, group_tokens)  # the rule of `rerank --passages`
        counts = passage_counts(stored, group_tokens)
        for hit, span in zip(hits, passage_spans(encoder, hits, found, counts, group_tokens), strict=True):
            hit["passage"] = span
            hit["passage_text"] = None if span is None else hit["text"][span[0] : span[1]]


def passage_spans(
    encoder, hits: Sequence[dict], found, counts, group_tokens: int = 0
) -> list[list[int] | None]:
    """[start, end] of passage found[i] in the text of hits[i] (None without a text or a passage), whose
    document the index holds as counts[i] passages (vectors; windows of token vectors with `group_tokens`,
    which may count one more or one fewer than the text has: scoring.best_passages)."""
    with_text = [i for i, hit in enumerate(hits) if hit.get("text") is not None]
    spans = dict(zip(with_text, encoder.passage_spans([hits[i]["text"] for i in with_text]), strict=True))
    result = []
    for i, hit in enumerate(hits):
        passage = int(found[i])
        if i not in spans or passage < 0:
            result.append(None)
            continue
        extra = 1 if group_tokens else 0
        if abs(len(spans[i]) - counts[i]) > extra:  # another text or model than the index's
            raise DocembedError(
                f"id {hit['id']!r}: the model cuts its text into {len(spans[i])} passage(s), the index holds "
                f"{counts[i]} for it: give the corpus and the model the index was built from"
            )
        result.append(passage_span(spans[i], passage))
    return result
