"""docembed index build / add / remove, search."""

from __future__ import annotations

import typer

from docembed.cli import common

index_app = typer.Typer(
    help="Build, grow and shrink indexes: faiss over embeddings, or bm25 over texts.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
    app.command("search")(search)


@index_app.command("build")
def build(
    embeddings: str = typer.Argument(
        ..., help="Embeddings file written by `docembed encode` (with --type bm25: the corpus itself)."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Index directory to create."),
    kind: str = typer.Option(
        "flat", "--type", "-t", help="flat (exact) | hnsw | ivf, or bm25 (a first stage over a corpus' text)."
    ),
    storage: str = typer.Option(
        "float32",
        "--storage",
        help="float32 | float16 | int8: how the index holds the vectors (faiss' scalar quantizers; "
        "multi-vector MaxSim reads them as held): half or a quarter of the bytes.",
    ),
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    overwrite: bool = common.OVERWRITE,
    allow_duplicate_ids: bool = typer.Option(
        False,
        "--allow-duplicate-ids",
        help="Index a set whose ids repeat (search may then return an id twice).",
    ),
    analyzer: str = typer.Option(
        None,
        "--analyzer",
        help="bm25: plain (words, lower-cased) | english (+ stopwords out, Snowball stems).",
    ),
) -> None:
    """Build a faiss index (with ids) over dense or multi-vector embeddings.

    An existing index is replaced with --overwrite, or when EMBEDDINGS is newer than it; a rebuild that
    would undo what `index add` / `index remove` changed since it was built (added documents EMBEDDINGS
    lacks, removed ones it still holds) is refused unless --overwrite says to rebuild from EMBEDDINGS alone.

    Example: docembed index build docs.npy -o docs.index && docembed search docs.index --query "cats"
    """
    from docembed.errors import DocembedError, UsageError
    from docembed.faiss_index import INDEX_DIRECTORY, VectorIndex
    from docembed.io.embeddings import load_embeddings
    from docembed.io.outputs import check_output, directory_output
    from docembed.runtime import log

    check_output(output, overwrite, directory=True, inputs=[embeddings], kind=INDEX_DIRECTORY)
    if analyzer is not None and kind != "bm25":
        raise UsageError("--analyzer is for bm25 indexes (--type bm25)")
    if kind == "bm25":
        if storage != "float32":
            raise UsageError("--storage is for faiss indexes; a bm25 index holds sparse weights")
        _build_bm25(embeddings, output, overwrite, allow_duplicate_ids, id_field, text_field, analyzer)
        return
    emb = load_embeddings(embeddings)
    duplicates = len(emb.ids) - len(set(emb.ids))
    if duplicates:
        first = next(i for i, n in _counts(emb.ids).items() if n > 1)
        message = f"{embeddings}: {duplicates} duplicate id(s) (first: {first!r})"
        if not allow_duplicate_ids:
            raise DocembedError(
                f"{message}: search would return one document twice; "
                "pass --allow-duplicate-ids to index them anyway"
            )
        log(f"warning: {message}")
    _refuse_undoing_changes(output, embeddings, emb.ids, overwrite)
    index = VectorIndex.build(emb, kind, storage)
    with directory_output(output, INDEX_DIRECTORY, overwrite, inputs=[embeddings]) as staging:
        # again, under the write lock: an `index add` may have committed while the index was built
        _refuse_undoing_changes(output, embeddings, emb.ids, overwrite, warn=False)
        index.save(staging)
    what = f"{len(emb)} documents" + (f", {len(emb.data.vectors)} vectors" if emb.is_multi else "")
    log(f"indexed {what} ({kind}, {storage}) -> {output}")


def _build_bm25(corpus, output, overwrite, allow_duplicate_ids, id_field, text_field, analyzer) -> None:
    from docembed.errors import DocembedError, UsageError
    from docembed.faiss_index import INDEX_DIRECTORY, BM25Index
    from docembed.io.outputs import directory_output
    from docembed.runtime import log
    from docembed.text import ANALYZERS

    analyzer = analyzer or "plain"
    if analyzer not in ANALYZERS:
        raise UsageError(f"--analyzer is one of {', '.join(ANALYZERS)}, not {analyzer!r}")
    index = BM25Index.build(common.reader(corpus, None, id_field, text_field, False), analyzer=analyzer)
    duplicates = len(index.ids) - len(set(index.ids))
    if duplicates and not allow_duplicate_ids:
        raise DocembedError(
            f"{corpus}: {duplicates} duplicate id(s): search would return one document twice; "
            "pass --allow-duplicate-ids to index them anyway"
        )
    _refuse_undoing_changes(output, corpus, index.ids, overwrite)
    with directory_output(output, INDEX_DIRECTORY, overwrite, inputs=[corpus]) as staging:
        _refuse_undoing_changes(output, corpus, index.ids, overwrite, warn=False)
        index.save(staging)
    log(f"indexed {len(index.ids)} documents (bm25, {len(index.terms)} terms) -> {output}")


def _refuse_undoing_changes(output, source, ids, overwrite: bool, warn: bool = True) -> None:
    """A rebuild of `output` from `source` (holding `ids`) that would undo what `index add` / `index remove`
    changed since the index was built is refused: staleness (make's rule) says the input changed, not that
    those documents should go. --overwrite is the explicit "from `source` alone": then a warning."""
    from docembed.errors import DocembedError
    from docembed.faiss_index import changes_since_build
    from docembed.runtime import log

    changes = changes_since_build(output)
    dropped, revived = changes.undone_by(ids) if changes else ([], [])
    if not dropped and not revived:
        return
    added = (
        f"{len(dropped)} document(s) added with `index add` since it was built (first: {dropped[0]!r}) "
        f"that {source} lacks"
        if dropped
        else ""
    )
    removed = (
        f"{len(revived)} document(s) removed with `index remove`{'' if dropped else ' since it was built'} "
        f"(first: {revived[0]!r}) that {source} still holds"
        if revived
        else ""
    )
    if dropped and revived:
        what, undo, fix = f"holds {added}, and lacks {removed}", "undo both", f"bring {source} up to date"
    elif dropped:
        what, undo, fix = f"holds {added}", "drop them", f"encode them into {source}"
    else:
        what, undo, fix = f"lacks {removed}", "bring them back", f"take them out of {source}"
    message = f"{output} {what}: a rebuild from {source} would {undo}"
    if overwrite:
        if warn:
            log(f"warning: {message} (--overwrite: rebuilding from {source} alone)")
        return
    raise DocembedError(f"{message}; pass --overwrite to rebuild from {source} alone, or {fix} first")


def _refuse_bm25(index: str) -> None:
    from docembed.errors import DocembedError
    from docembed.faiss_index import is_bm25_dir

    if is_bm25_dir(index):
        raise DocembedError(
            f"{index} is a bm25 index, whose idf comes from its whole corpus: rebuild it with "
            "`docembed index build CORPUS --type bm25 -o INDEX`"
        )


@index_app.command("add")
def add(
    index: str = typer.Argument(..., help="Index directory from `docembed index build`."),
    embeddings: str = typer.Argument(..., help="More embeddings (same model) to append."),
    compact: bool = typer.Option(
        False, "--compact", help="Rewrite the index as one file now instead of appending a segment."
    ),
) -> None:
    """Append documents to an index: their ids must be new. The new vectors are written as a segment
    beside the index (its meta.json, replaced last, commits the add), so the cost is theirs, not the
    collection's; IVF/HNSW add them to the trained index when it loads. Once segments hold over 10 % of
    the documents the index is rewritten as one file (also with --compact).

    Example: docembed encode more.jsonl -m glove-avg -o more.npy && docembed index add docs.index more.npy
    """
    from docembed.faiss_index import VectorIndex
    from docembed.io.embeddings import load_embeddings
    from docembed.runtime import log

    _refuse_bm25(index)
    emb = load_embeddings(embeddings)
    compacted = VectorIndex.append_saved(index, emb, compact_share=0.0 if compact else 0.1)
    how = "rewritten as one file" if compacted else "appended as a segment"
    log(f"added {len(emb)} documents to {index} ({how})")


@index_app.command("remove")
def remove(
    index: str = typer.Argument(..., help="Index directory from `docembed index build`."),
    ids: str = typer.Option(..., "--ids", help="File of ids to remove, one per line (- for stdin)."),
) -> None:
    """Remove documents by id (ids not in the index are counted and ignored). All or nothing on disk.

    Example: docembed index remove docs.index --ids gone.txt
    """
    import sys

    from docembed.faiss_index import VectorIndex
    from docembed.runtime import log

    if ids == "-":
        lines = sys.stdin.read().split("\n")
    else:
        with open(ids, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    wanted = [line.removesuffix("\r") for line in lines if line.strip()]
    _refuse_bm25(index)
    removed, left = VectorIndex.remove_saved(index, wanted, inputs=[] if ids == "-" else [ids])
    unknown = len(set(wanted)) - removed
    note = f" ({unknown} id(s) not in the index)" if unknown else ""
    log(f"removed {removed} documents from {index} ({left} left){note}")


def _counts(ids):
    from collections import Counter

    return Counter(ids)


def search(
    index: str = typer.Argument(..., help="Index directory from `docembed index build`."),
    query: list[str] = typer.Option(None, "--query", help="Query text (repeatable)."),
    queries: str = typer.Option(None, "--queries", help="Query file (.jsonl/.txt/.tsv, - for stdin)."),
    queries_format: str = common.INPUT_FORMAT,
    k: int = typer.Option(10, "-k", "--top-k", min=1, help="Results per query."),
    model: str = typer.Option(None, "--model", "-m", help="Query encoder (default: the index's model)."),
    batch_size: int = common.BATCH_SIZE,
    output: str = common.OUTPUT_JSONL,
    overwrite: bool = common.OVERWRITE,
    more_like: list[str] = typer.Option(
        None, "--id", help="More like this: the stored vector of document ID is the query (repeatable)."
    ),
    text_from: str = typer.Option(
        None, "--text-from", help="Corpus (.jsonl/.tsv/.txt) whose texts are shown with each hit."
    ),
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    output_format: str = typer.Option(
        "jsonl", "--output-format", help="jsonl | trec (TREC run lines: qid Q0 docid rank score tag)."
    ),
    run_tag: str = typer.Option("docembed", "--run-tag", help="The tag column of TREC run lines."),
    lexical_index: str = typer.Option(
        None,
        "--lexical-index",
        help="Hybrid search: a bm25 index of the same corpus, fused with INDEX by -m LEXICAL+MODEL or a "
        "fitted fusion folder (its weight and normalisation).",
    ),
    depth: int = typer.Option(
        100, "--depth", min=1, help="Hybrid search: hits taken from each index before they are fused."
    ),
) -> None:
    """Nearest documents for each query, as JSONL {query, results: [{id, score}]} on stdout or in -o FILE.

    Example: docembed search docs.index --query "how do I catch an exception" -k 5

    Hybrid: docembed search docs.index --lexical-index docs.bm25 -m fusion-dir --query "..."
    """
    import json

    from docembed.errors import UsageError
    from docembed.faiss_index import BM25Index, VectorIndex, hybrid_fusion, is_bm25_dir, search_queries
    from docembed.io.readers import batched
    from docembed.io.runs import check_output_format, hit_rows, trec_lines
    from docembed.runtime import resolve_device

    check_output_format(output_format)
    if not query and not queries and not more_like:
        raise UsageError("give --query TEXT (repeatable), --queries FILE or --id ID")
    common.check_text_output(output, overwrite, [index, queries, text_from, lexical_index])
    bm25 = BM25Index.load(index) if is_bm25_dir(index) else None
    if lexical_index is not None and (bm25 is not None or not is_bm25_dir(lexical_index)):
        raise UsageError(
            "--lexical-index takes a bm25 index (`index build CORPUS --type bm25`), beside a vector INDEX"
        )
    lexical = BM25Index.load(lexical_index) if lexical_index is not None else None
    if bm25 is not None and more_like:
        raise UsageError("--id needs a vector index: a bm25 index holds no document vectors")
    vector_index = VectorIndex.load(index) if bm25 is None else None
    if vector_index is not None and resolve_device().startswith("cuda"):
        vector_index.to_gpu()

    # before any model loads: the query file's first record, the corpus of --text-from, the model spec
    query_reader = common.reader(queries, queries_format, id_field, text_field, False) if queries else None
    if text_from:
        common.reader(text_from, None, id_field, text_field, False)
    spec = None
    if vector_index is not None and (query or queries):
        spec = model or vector_index.recorded_model()
        if not spec:
            raise UsageError("the index does not record its model: pass --model")
        common.resolve(spec)

    def query_items():
        if query_reader is not None:
            return ((d.id, d.text) for d in query_reader)
        return ((str(i), text) for i, text in enumerate(query or []))

    def rows():
        liked = vector_index.more_like(more_like, k) if more_like else []
        for doc_id, hits in zip(more_like or [], liked, strict=True):
            yield {"query_id": doc_id, "results": hit_rows(hits)}
        if not query and not queries:
            return
        if bm25 is not None:  # lexical first stage: no model
            for chunk in batched(query_items(), 256):
                for (qid, text), hits in zip(chunk, bm25.search_texts([t for _, t in chunk], k), strict=True):
                    yield {"query_id": qid, "query": text, "results": hit_rows(hits)}
            return
        from docembed.encoding import encode_texts

        encoder = common.load(spec)
        fusion = hybrid_fusion(encoder, lexical)
        if fusion is not None:
            encoder = fusion.model  # the query vectors; the lexical part's scores come from --lexical-index
        for chunk in batched(query_items(), 256):
            texts = [text for _, text in chunk]
            vectors = encode_texts(encoder, texts, batch_size=batch_size)
            found = search_queries(vector_index, texts, vectors, k, lexical, fusion, depth)
            for (qid, text), hits in zip(chunk, found, strict=True):
                yield {"query_id": qid, "query": text, "results": hit_rows(hits)}

    found = rows()
    if text_from:
        found = _with_texts(list(found), text_from, id_field, text_field)
    with common.text_output(output, overwrite, [index, queries, text_from, lexical_index]) as handle:
        for row in found:
            if output_format == "trec":
                handle.write(trec_lines(row["query_id"], row["results"], run_tag))
            else:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _with_texts(rows: list[dict], corpus: str, id_field: str, text_field: str) -> list[dict]:
    """Each hit with its text from `corpus` (read once, keeping only the texts of hits)."""
    from docembed.faiss_index import attach_texts, corpus_texts
    from docembed.runtime import log

    wanted = {hit["id"] for row in rows for hit in row["results"]}
    missing = attach_texts(rows, corpus_texts(corpus, wanted, id_field, text_field))
    if missing:
        log(f"warning: {len(missing)} hit id(s) not in {corpus} (first: {sorted(missing)[0]!r}): text null")
    return rows
