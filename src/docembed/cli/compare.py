"""docembed similarity / rerank."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("similarity")(similarity)
    app.command("rerank")(rerank)


def similarity(
    texts: list[str] = typer.Argument(None, help="Two texts to compare (or use --pairs)."),
    pairs: str = typer.Option(
        None, "--pairs", "-p", help="JSONL of pairs (- for stdin); prints each row + score."
    ),
    left_field: str = typer.Option("text1", "--left-field", help="Field of the first text in --pairs rows."),
    right_field: str = typer.Option(
        "text2", "--right-field", help="Field of the second text in --pairs rows."
    ),
    model: str = common.MODEL,
    batch_size: int = common.BATCH_SIZE,
    output: str = common.OUTPUT_JSONL,
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Similarity of text pairs: cosine (dense models) or mean-MaxSim, first text as query (multi-vector).

    Example: docembed similarity "first text" "second text" -m sbert
    """
    import json

    from docembed.errors import InputFormatError, UsageError
    from docembed.io.readers import batched, iter_jsonl_lines
    from docembed.similarity import similarity_scores

    if (pairs is None) == (not texts):
        raise UsageError("give exactly two texts, or --pairs FILE")
    resolved = common.resolve(model)
    if resolved is not None and resolved.kind == "fusion":  # a spec, not a fitted folder: no statistics
        from docembed.models.fusion import no_pair_statistics

        raise no_pair_statistics(model)
    if pairs is None:
        if len(texts) != 2:
            raise UsageError(f"similarity compares two texts, got {len(texts)}")
        common.check_text_output(output, overwrite, [])
        score = similarity_scores(common.load(model), [texts[0]], [texts[1]], batch_size)[0]
        with common.text_output(output, overwrite, []) as handle:
            handle.write(f"{score:.6f}\n")
        return
    common.check_text_output(output, overwrite, [pairs])
    hint = "; choose them with --left-field/--right-field"
    common.check_jsonl_fields(pairs, (left_field, right_field), hint)
    encoder = common.load(model)
    rows = iter_jsonl_lines(pairs)
    with common.text_output(output, overwrite, [pairs]) as handle:
        for chunk in batched(rows, 1024):
            for line_number, row in chunk:
                for field in (left_field, right_field):
                    if not isinstance(row.get(field), str):
                        raise InputFormatError(pairs, line_number, f"field {field!r} missing or not a string")
            left = [row[left_field] for _, row in chunk]
            right = [row[right_field] for _, row in chunk]
            scores = similarity_scores(encoder, left, right, batch_size)
            for (_, row), score in zip(chunk, scores, strict=True):
                handle.write(json.dumps({**row, "score": round(float(score), 6)}, ensure_ascii=False) + "\n")


def _read_docs(docs: str, id_field: str, text_field: str) -> dict[str, str]:
    """id -> text of --docs; a repeated id keeps its last text, with a warning as `encode` gives."""
    from docembed.runtime import log

    texts: dict[str, str] = {}
    duplicates, first = 0, None
    for doc in common.reader(docs, None, id_field, text_field, False):
        if doc.id in texts:
            duplicates += 1
            first = first if first is not None else doc.id
        texts[doc.id] = doc.text
    if duplicates:
        log(f"warning: {duplicates} duplicate id(s) in {docs} (first: {first!r}): each keeps its last text")
    return texts


TREC_NEEDS_IDS = "--output-format trec needs id rows {source, candidates: [ids]} (a run names its queries)"


def rerank(
    tasks: str = typer.Argument(
        ...,
        help="JSONL rows {source, candidates: \\[ids]}, {query, candidates: \\[ids]} (ids of --docs) or "
        "{query, candidates: \\[texts]}; - for stdin.",
    ),
    docs: str = typer.Option(
        None, "--docs", "-d", help="Documents for id rows (.jsonl, .tsv id<TAB>text, .txt)."
    ),
    model: str = common.MODEL,
    output: str = typer.Option("-", "--output", "-o", help="Output JSONL (default stdout)."),
    top_k: int = typer.Option(None, "--top-k", "-k", min=1, help="Keep only the best K candidates per row."),
    batch_size: int = common.BATCH_SIZE,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    overwrite: bool = common.OVERWRITE,
    output_format: str = typer.Option(
        "jsonl", "--output-format", help="jsonl | trec (TREC run lines: source Q0 id rank score tag)."
    ),
    run_tag: str = typer.Option("docembed", "--run-tag", help="The tag column of TREC run lines."),
    passages: bool = typer.Option(
        False,
        "--passages",
        help="Add to each candidate the passage the query matches best, as character offsets \\[start, end] "
        "(models whose vectors are passages: sbert-windows, retriever, student-passages, nugget-passages; a "
        "fusion such as tfidf+retriever ranks by its fused score and names its model's best passage).",
    ),
) -> None:
    """Rerank candidates per row, best first, with their scores (cosine or mean-MaxSim).

    Example: docembed rerank tasks.jsonl --docs docs.tsv -m sbert-tokens -o ranked.jsonl
    """
    import json
    import sys
    from pathlib import Path

    from docembed.errors import UsageError
    from docembed.io.embeddings import check_output_path
    from docembed.io.outputs import atomic_path, check_not_inside
    from docembed.io.readers import iter_jsonl_lines
    from docembed.io.runs import check_output_format, trec_lines
    from docembed.runtime import log
    from docembed.similarity import fit_on_candidates, rerank_rows

    check_output_format(output_format)
    if passages and output_format == "trec":
        raise UsageError("--passages adds offsets to JSONL rows; a TREC run has no place for them")
    inputs = [tasks, docs] if docs else [tasks]
    check_output_path(output, overwrite, inputs)
    check_not_inside(output, [model])  # a model folder's own files
    resolved = common.resolve(model)
    if passages:
        from docembed.passages import refuse_spec_without_passages

        refuse_spec_without_passages(resolved)
    doc_texts = _read_docs(docs, id_field, text_field) if docs else None
    first = common.check_jsonl_fields(tasks, ())
    if first is not None:  # the first row's shape (ids need --docs, and those ids), before the model loads
        from docembed.similarity import check_row

        check_row(first[1], doc_texts, tasks, first[0])
        if output_format == "trec" and "source" not in first[1]:
            raise UsageError(TREC_NEEDS_IDS)
    encoder = common.load(model)
    if passages:
        from docembed.passages import check_passage_model

        check_passage_model(encoder)
    rows = fit_on_candidates(encoder, iter_jsonl_lines(tasks), tasks, doc_texts)  # bm25(+MODEL) unfitted
    ranked = rerank_rows(encoder, rows, tasks, doc_texts, batch_size, passages=passages)

    def write(handle) -> int:
        n = 0
        for row in ranked:
            if top_k:
                row["ranking"] = row["ranking"][:top_k]
            if output_format != "trec":
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            elif "source" in row:
                handle.write(trec_lines(row["source"], row["ranking"], run_tag))
            else:
                raise UsageError(TREC_NEEDS_IDS)
            n += 1
        return n

    if output == "-":
        n = write(sys.stdout)
        sys.stdout.flush()
    else:
        with atomic_path(Path(output), overwrite, inputs) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            n = write(handle)
    log(f"reranked {n} rows with {encoder.name}")
