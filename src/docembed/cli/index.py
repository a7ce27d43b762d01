"""docembed index build / search."""

from __future__ import annotations

import typer

from docembed.cli import common

index_app = typer.Typer(help="Build faiss indexes over embeddings.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
    app.command("search")(search)


@index_app.command("build")
def build(
    embeddings: str = typer.Argument(..., help="Embeddings file written by `docembed encode`."),
    output: str = typer.Option(..., "--output", "-o", help="Index directory to create."),
    kind: str = typer.Option("flat", "--type", "-t", help="flat (exact) | hnsw | ivf."),
    overwrite: bool = common.OVERWRITE,
    allow_duplicate_ids: bool = typer.Option(
        False,
        "--allow-duplicate-ids",
        help="Index a set whose ids repeat (search may then return an id twice).",
    ),
) -> None:
    """Build a faiss index (with ids) over dense or multi-vector embeddings.

    Example: docembed index build docs.npy -o docs.index && docembed search docs.index --query "cats"
    """
    from docembed.errors import DocembedError
    from docembed.faiss_index import INDEX_DIRECTORY, VectorIndex
    from docembed.io.embeddings import load_embeddings
    from docembed.io.outputs import check_output, directory_output
    from docembed.runtime import log

    check_output(output, overwrite, directory=True, inputs=[embeddings], kind=INDEX_DIRECTORY)
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
    index = VectorIndex.build(emb, kind)
    with directory_output(output, INDEX_DIRECTORY, overwrite, inputs=[embeddings]) as staging:
        index.save(staging)
    what = f"{len(emb)} documents" + (f", {len(emb.data.vectors)} vectors" if emb.is_multi else "")
    log(f"indexed {what} ({kind}) -> {output}")


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
) -> None:
    """Nearest documents for each query, as JSONL {query, results: [{id, score}]} on stdout.

    Example: docembed search docs.index --query "how do I catch an exception" -k 5
    """
    import json
    import sys

    from docembed.errors import UsageError
    from docembed.faiss_index import VectorIndex
    from docembed.io.readers import batched
    from docembed.runtime import resolve_device

    if not query and not queries:
        raise UsageError("give --query TEXT (repeatable) or --queries FILE")
    vector_index = VectorIndex.load(index)
    if resolve_device().startswith("cuda"):
        vector_index.to_gpu()
    spec = model or vector_index.metadata.get("model_source") or vector_index.metadata.get("model")
    if not spec:
        raise UsageError("the index does not record its model: pass --model")
    from docembed.encoding import encode_texts

    encoder = common.load(spec)
    items = [(str(i), text) for i, text in enumerate(query or [])]
    if queries:
        items_iter = ((d.id, d.text) for d in common.reader(queries, queries_format, "id", "text", False))
    else:
        items_iter = iter(items)
    for chunk in batched(items_iter, 256):
        vectors = encode_texts(encoder, [text for _, text in chunk], batch_size=batch_size)
        for (qid, text), hits in zip(chunk, vector_index.search(vectors, k), strict=True):
            row = {
                "query_id": qid,
                "query": text,
                "results": [{"id": i, "score": round(s, 6)} for i, s in hits],
            }
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    sys.stdout.flush()
