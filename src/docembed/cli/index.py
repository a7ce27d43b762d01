"""docembed index build / add / remove / update / compact / migrate, search."""

from __future__ import annotations

from pathlib import Path

import typer

from docembed.cli import common

index_app = typer.Typer(
    help="Build, grow, shrink and migrate indexes: faiss or Lance over embeddings, bm25 over texts.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
    app.command("search")(search)


@index_app.command("build")
def build(
    embeddings: str = typer.Argument(
        ...,
        help="Embeddings written by `docembed encode` (a file, a shard directory or a Lance collection; with "
        "--type bm25: the corpus itself).",
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
    store: str = typer.Option(
        "auto",
        "--store",
        help="auto | lance (a LanceDB table: filters, stored text, hybrid search, updates and versions) | "
        "faiss (index.faiss + ids). auto: lance for one vector per document, faiss for multi-vector "
        "embeddings (searched many times faster), --storage int8 or --allow-duplicate-ids; an existing "
        "index keeps its store. Lance types: flat | ivf_flat | ivf_pq | ivf_hnsw_sq | ivf_hnsw_pq "
        "(hnsw, ivf: ivf_hnsw_sq, ivf_flat).",
    ),
    text_from: str = typer.Option(
        None,
        "--text-from",
        help="--store lance: corpus whose texts are stored per id (full-text searchable).",
    ),
    fields: str = typer.Option(
        None,
        "--fields",
        help="--store lance: scalar fields of the corpus rows to store per id (a,b), for --where.",
    ),
) -> None:
    """Build an index over dense or multi-vector embeddings: a Lance table or a faiss index (--store).

    An existing index is replaced with --overwrite, or when EMBEDDINGS is newer than it; a rebuild that
    would undo what `index add` / `index remove` changed since it was built (added documents EMBEDDINGS
    lacks, removed ones it still holds) is refused unless --overwrite says to rebuild from EMBEDDINGS alone.

    Example: docembed index build docs.npy -o docs.index && docembed search docs.index --query "cats"
    """
    from docembed.errors import DocembedError, UsageError
    from docembed.faiss_index import VectorIndex
    from docembed.io.outputs import check_output, directory_output
    from docembed.lance_index import ANY_INDEX_DIRECTORY as INDEX_DIRECTORY  # a Lance folder may go too
    from docembed.runtime import log

    if store not in ("auto", "faiss", "lance"):
        raise UsageError(f"--store is auto, lance or faiss, not {store!r}")
    if analyzer is not None and kind != "bm25":
        raise UsageError("--analyzer is for bm25 indexes (--type bm25)")
    _refuse_changing_store(output, embeddings, store, overwrite)
    emb = None
    if store == "auto":
        check_output(output, overwrite, directory=True, inputs=[embeddings], kind=INDEX_DIRECTORY)
        store, emb = _auto_store(embeddings, output, kind, storage, allow_duplicate_ids, text_from, fields)
    if store == "lance":
        options = (kind, storage, overwrite, allow_duplicate_ids, text_from, fields, id_field, text_field)
        _build_lance(embeddings, output, *options, loaded=emb)
        return
    if text_from is not None or fields is not None:
        raise UsageError("--text-from and --fields store text and fields in a Lance index: add --store lance")
    check_output(output, overwrite, directory=True, inputs=[embeddings], kind=INDEX_DIRECTORY)
    if kind == "bm25":
        if storage != "float32":
            raise UsageError("--storage is for faiss indexes; a bm25 index holds sparse weights")
        _build_bm25(embeddings, output, overwrite, allow_duplicate_ids, id_field, text_field, analyzer)
        return
    emb = emb if emb is not None else _build_input(embeddings)
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


def _refuse_changing_store(output, embeddings, store: str, overwrite: bool) -> None:
    """A build with --store naming the other store than the index at `output` holds would replace it, and
    each store checks only its own kind of index for what `index add` / `index remove` changed: refused
    unless --overwrite says to rebuild from the embeddings alone."""
    from docembed.errors import UsageError
    from docembed.faiss_index import is_index_dir
    from docembed.lance_index import is_lance_dir

    if overwrite or store == "auto":
        return
    held = "lance" if is_lance_dir(output) else "faiss" if is_index_dir(Path(output)) else None
    if held is not None and held != store:
        raise UsageError(
            f"{output} is a {held} index: --store {store} would replace it with one built from {embeddings} "
            "alone, without what `index add` / `index remove` changed there; pass --overwrite for that "
            "(`index migrate` turns a faiss index into a Lance one, added documents included)"
        )


def _auto_store(embeddings, output, kind, storage, allow_duplicate_ids, text_from, fields):
    """(the store `--store auto` picks, the embeddings if they had to be read to pick it). Lance, but faiss
    where it serves measurably better or Lance cannot: multi-vector sets (bench/bench_multivector.py: the
    faiss IVF answers 28 queries/s at recall@10 0.92 on 50,000 NUGGET documents, Lance's MaxSim under 1 on
    20,000 in bench/results/lance.json), int8 storage and repeated ids. Dense search is as fast in Lance
    (bench/results/lance_dense.json: exact, 107 queries/s against faiss' 99, and its HNSW's 82 at recall@10
    0.99). An existing index keeps its store, so a rebuild never changes what other commands find there."""
    from docembed.faiss_index import KINDS, is_index_dir
    from docembed.lance_index import is_lance_dir

    if kind == "bm25":
        return "faiss", None  # the bm25 branch below: a store of its own
    if text_from is not None or fields is not None or kind not in KINDS or is_lance_dir(output):
        return "lance", None
    if storage == "int8" or allow_duplicate_ids or is_index_dir(Path(output)):
        return "faiss", None
    emb = _build_input(embeddings)
    return ("faiss" if emb.is_multi else "lance"), emb


def _build_lance(
    embeddings,
    output,
    kind,
    storage,
    overwrite,
    allow_duplicate_ids,
    text_from,
    fields,
    id_field,
    text_field,
    loaded=None,
) -> None:
    from docembed.errors import UsageError

    if allow_duplicate_ids:
        raise UsageError("a Lance index keys its rows by id: --allow-duplicate-ids is for faiss indexes")
    _write_lance(
        (lambda: loaded) if loaded is not None else (lambda: _build_input(embeddings)),
        embeddings,
        output,
        kind,
        storage,
        overwrite,
        text_from,
        fields,
        id_field,
        text_field,
    )


def _build_input(embeddings: str):
    """What `index build` indexes: an embeddings file or shard directory, or a Lance collection (`encode
    --engine ray -o X.lance`, `index build --store lance`) read back as its ids, vectors and model."""
    from docembed.io.embeddings import load_embeddings
    from docembed.lance_index import is_lance_dataset, load_collection

    return load_collection(embeddings) if is_lance_dataset(embeddings) else load_embeddings(embeddings)


def _write_lance(load, source, output, kind, storage, overwrite, text_from, fields, id_field, text_field):
    """Write the embeddings `load()` returns (read from `source`) as a Lance index at `output`, with the
    texts and fields of `text_from`: `index build --store lance` and `index migrate`. Every check that needs
    no embeddings comes first."""
    from docembed.errors import UsageError
    from docembed.io.outputs import check_output, directory_output
    from docembed.lance_index import (
        ANY_INDEX_DIRECTORY,
        KINDS,
        LanceIndex,
        corpus_columns,
        refuse_repeated_ids,
        refuse_undoing_changes,
    )
    from docembed.runtime import log

    inputs = [path for path in (source, text_from) if path]
    check_output(output, overwrite, directory=True, inputs=inputs, kind=ANY_INDEX_DIRECTORY)
    if kind not in KINDS:
        raise UsageError(f"unknown Lance index type {kind!r}; choose one of {', '.join(KINDS)}")
    names = _field_names(fields)
    if names and text_from is None:
        raise UsageError("--fields reads the corpus rows: give --text-from CORPUS")
    if text_from is not None:
        common.reader(text_from, None, id_field, text_field, False)  # a wrong corpus fails before any work
    emb = load()
    refuse_repeated_ids(emb.ids, str(source))
    if not overwrite:
        refuse_undoing_changes(output, source, emb.ids)
    texts, values = None, {}
    if text_from is not None:
        texts, values = corpus_columns(text_from, names, set(emb.ids), id_field, text_field)
        _warn_missing(text_from, emb.ids, texts)
    with directory_output(output, ANY_INDEX_DIRECTORY, overwrite, inputs=inputs) as staging:
        if not overwrite:  # again, under the write lock: an `index add` may have committed meanwhile
            refuse_undoing_changes(output, source, emb.ids)
        index = LanceIndex.build(staging, emb, kind, storage, texts, values)
    what = f"{len(emb)} documents" + (f", {len(emb.data.vectors)} vectors" if emb.is_multi else "")
    stored = ", text" if texts is not None else ""
    stored += "".join(f", {name}" for name in names)
    log(f"indexed {what} (lance {kind}, {storage}{stored}; version {index.version}) -> {output}")


def _field_names(fields: str | None) -> list[str]:
    from docembed.errors import UsageError

    if fields is None:
        return []
    names = [name.strip() for name in fields.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise UsageError(f"--fields takes distinct names separated by commas, not {fields!r}")
    return names


def _warn_missing(corpus: str, ids, texts) -> None:
    from docembed.runtime import log

    missing = [i for i in ids if i not in texts]
    if missing:
        log(f"warning: {len(missing)} id(s) not in {corpus} (first: {missing[0]!r}): their text is null")


def _lance_changes(index, embeddings, text_from):
    """What `index add` / `index update` give a Lance index: the embeddings, and with --text-from the texts
    and the index's own fields read from that corpus."""
    from docembed.io.embeddings import load_embeddings
    from docembed.lance_index import corpus_columns

    if text_from is not None:
        common.reader(text_from, None, "id", "text", False)
    emb = load_embeddings(embeddings)
    if text_from is None:
        return emb, None, {}
    texts, values = corpus_columns(text_from, index.fields, set(emb.ids), with_text=index.has_text)
    if texts is not None:
        _warn_missing(text_from, emb.ids, texts)
    return emb, texts, values


def _lance(index: str):
    """The Lance index at `index`, or None when it is a faiss or bm25 one."""
    from docembed.lance_index import LanceIndex, is_lance_dir

    return LanceIndex.open(index) if is_lance_dir(index) else None


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


@index_app.command("migrate")
def migrate(
    index: str = typer.Argument(..., help="A faiss index directory (`index build --store faiss`)."),
    output: str = typer.Option(..., "-o", "--output", help="The Lance index directory to write."),
    kind: str = typer.Option(
        "flat", "--type", "-t", help="Lance index type (as `index build --store lance`)."
    ),
    storage: str = typer.Option(
        None, "--storage", help="float32 | float16 (default: float16 for a float16 or int8 faiss index)."
    ),
    text_from: str = typer.Option(None, "--text-from", help="Corpus whose texts are stored per id."),
    fields: str = typer.Option(None, "--fields", help="Scalar fields of the corpus rows to store (a,b)."),
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Convert a faiss index into a Lance one: the same ids, vectors (as faiss holds them, `index add`
    segments included) and model, plus the texts and fields of --text-from. The faiss index is left as it is.

    Example: docembed index migrate docs.index -o docs.lance --text-from docs.jsonl --fields year
    """
    from docembed.errors import UsageError
    from docembed.faiss_index import VectorIndex, is_index_dir, read_index_meta

    if not is_index_dir(Path(index)):
        raise UsageError(f"{index} is not a faiss index directory (index.faiss, ids.json, meta.json)")
    metadata = read_index_meta(Path(index) / "meta.json")
    if metadata.get("index_kind") == "bm25":
        raise UsageError(
            f"{index} is a bm25 index: a Lance index stores the texts (--text-from) and searches them"
        )
    held = metadata.get("storage", "float32")
    storage = storage or ("float32" if held == "float32" else "float16")
    _write_lance(
        lambda: VectorIndex.load(index).embeddings(),
        index,
        output,
        kind,
        storage,
        overwrite,
        text_from,
        fields,
        id_field,
        text_field,
    )


@index_app.command("add")
def add(
    index: str = typer.Argument(..., help="Index directory from `docembed index build`."),
    embeddings: str = typer.Argument(..., help="More embeddings (same model) to append."),
    compact: bool = typer.Option(
        False, "--compact", help="Rewrite the index as one file now instead of appending a segment."
    ),
    text_from: str = typer.Option(
        None, "--text-from", help="Lance index: corpus holding the new documents' texts (and fields)."
    ),
) -> None:
    """Append documents to an index: their ids must be new. The new vectors are written as a segment
    beside the index (its meta.json, replaced last, commits the add), so the cost is theirs, not the
    collection's; IVF/HNSW add them to the trained index when it loads. Once segments hold over 10 % of
    the documents the index is rewritten as one file (also with --compact).

    Example: docembed encode more.jsonl -m glove-avg -o more.npy && docembed index add docs.index more.npy

    A Lance index (--store lance) appends them in one commit: a new version.
    """
    from docembed.errors import UsageError
    from docembed.faiss_index import VectorIndex
    from docembed.io.embeddings import load_embeddings
    from docembed.runtime import log

    lance = _lance(index)
    if lance is not None:
        emb, texts, values = _lance_changes(lance, embeddings, text_from)
        version = lance.add(emb, texts, values)
        log(f"added {len(emb)} documents to {index} (version {version})")
        return
    if text_from is not None:
        raise UsageError("--text-from stores text in a Lance index (index build --store lance)")
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
    lance = _lance(index)
    if lance is not None:
        removed, left, version = lance.remove(wanted)
        unknown = len(set(wanted)) - removed
        note = f" ({unknown} id(s) not in the index)" if unknown else ""
        log(f"removed {removed} documents from {index} ({left} left, version {version}){note}")
        return
    _refuse_bm25(index)
    removed, left = VectorIndex.remove_saved(index, wanted, inputs=[] if ids == "-" else [ids])
    unknown = len(set(wanted)) - removed
    note = f" ({unknown} id(s) not in the index)" if unknown else ""
    log(f"removed {removed} documents from {index} ({left} left){note}")


@index_app.command("update")
def update(
    index: str = typer.Argument(..., help="Lance index directory (`index build --store lance`)."),
    embeddings: str = typer.Argument(..., help="Embeddings (same model) replacing the rows with their ids."),
    text_from: str = typer.Option(
        None, "--text-from", help="Corpus holding the documents' new texts (and fields); else they are kept."
    ),
) -> None:
    """Replace documents by id (their vectors; texts and fields too with --text-from) and insert the ids
    that are new, in one commit (LanceDB merge_insert): a new version.

    Example: docembed index update docs.lance changed.npy --text-from changed.jsonl
    """
    from docembed.errors import UsageError
    from docembed.runtime import log

    lance = _lance(index)
    if lance is None:
        raise UsageError(
            f"{index} is not a Lance index: for a faiss index, `index remove` the ids, then `index add`"
        )
    emb, texts, values = _lance_changes(lance, embeddings, text_from)
    updated, inserted, version = lance.update(emb, texts, values)
    log(f"updated {updated} and inserted {inserted} documents in {index} (version {version})")


@index_app.command("compact")
def compact(
    index: str = typer.Argument(..., help="Index directory from `docembed index build`."),
    prune: bool = typer.Option(
        False, "--prune", help="Lance: delete every version but the latest (search --version can't go back)."
    ),
) -> None:
    """Compact an index: a Lance table's small files merged, its indexes brought up to date with the rows
    added since they were built (LanceDB optimize); a faiss index's added segments rewritten as one file.

    Example: docembed index compact docs.lance
    """
    from docembed.errors import UsageError
    from docembed.faiss_index import INDEX_DIRECTORY, VectorIndex
    from docembed.io.outputs import directory_output
    from docembed.runtime import log

    lance = _lance(index)
    if lance is not None:
        version = lance.compact(prune)
        log(f"compacted {index} (version {version}{', older versions pruned' if prune else ''})")
        return
    if prune:
        raise UsageError("--prune deletes a Lance index's old versions; a faiss index keeps none")
    _refuse_bm25(index)
    with directory_output(index, INDEX_DIRECTORY, overwrite=True) as staging:
        VectorIndex.load(index).save(staging)  # loaded under the lock: an add meanwhile is kept
    log(f"compacted {index} (rewritten as one file)")


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
        100,
        "--depth",
        min=1,
        help="Hybrid search: hits taken from each ranking before they are fused (at least -k of them).",
    ),
    where: str = typer.Option(
        None, "--where", help="Lance index: an SQL filter on its fields, applied before the vector search."
    ),
    hybrid: bool = typer.Option(
        False,
        "--hybrid",
        help="Lance index: fuse the vector ranking with a full-text search of the stored text (RRF); with "
        "-m LEXICAL+MODEL or a fusion folder, their candidates ranked by the fusion's scores and weight.",
    ),
    version: int = typer.Option(
        None, "--version", min=1, help="Lance index: search this earlier version (index add/remove log it)."
    ),
    nprobe: int = typer.Option(
        None,
        "--nprobe",
        min=1,
        help="IVF index: lists scanned per query vector (default: as recorded at build).",
    ),
    candidates: int = typer.Option(
        None,
        "--candidates",
        min=1,
        help="Multi-vector index: nearest vectors taken per query vector, whose documents are rescored "
        "exactly (default: as recorded at build).",
    ),
    rescore: int = typer.Option(
        None,
        "--rescore",
        min=0,
        help="Multi-vector faiss index: documents rescored exactly per query, those whose hits promise "
        "most (0: every document hit; default: as recorded at build).",
    ),
    passages: bool = typer.Option(
        False,
        "--passages",
        help="Add to each hit its best passage for the query: passage [start, end] (character offsets, as "
        "`rerank --passages` gives them) and passage_text. For an index of passages (sbert-windows, the "
        "student with --long late-chunks) and the hits' text (a Lance index storing it, or --text-from).",
    ),
) -> None:
    """Nearest documents for each query, as JSONL {query, results: [{id, score}]} on stdout or in -o FILE.

    Example: docembed search docs.index --query "how do I catch an exception" -k 5

    Hybrid: docembed search docs.index --lexical-index docs.bm25 -m fusion-dir --query "..."

    Lance: docembed search docs.lance --query "..." --where "year >= 2020" --hybrid (stored text in the hits)

    Passages: docembed search windows.index --query "..." --text-from docs.jsonl --passages
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
    if query and queries:  # the file's rows would be the only queries
        raise UsageError("give --query TEXT (repeatable) or --queries FILE, not both")
    if hybrid and not query and not queries:  # --id rows have no text to search in full
        raise UsageError("--hybrid fuses a query text's full-text hits: give --query or --queries")
    common.check_text_output(output, overwrite, [index, queries, text_from, lexical_index])
    lance = _lance_for_search(index, where, hybrid, version, lexical_index)
    bm25 = BM25Index.load(index) if lance is None and is_bm25_dir(index) else None
    if lexical_index is not None and (bm25 is not None or not is_bm25_dir(lexical_index)):
        raise UsageError(
            "--lexical-index takes a bm25 index (`index build CORPUS --type bm25`), beside a vector INDEX"
        )
    lexical = BM25Index.load(lexical_index) if lexical_index is not None else None
    if bm25 is not None and more_like:
        raise UsageError("--id needs a vector index: a bm25 index holds no document vectors")
    vector_index = lance if lance is not None else VectorIndex.load(index) if bm25 is None else None
    if rescore is not None and lance is not None:
        raise UsageError(
            "--rescore tunes a faiss multi-vector index; a Lance index rescores its --candidates"
        )
    if vector_index is not None:
        vector_index.tune(nprobe, candidates, **({"rescore": rescore} if rescore is not None else {}))
    elif nprobe or candidates or rescore is not None:
        raise UsageError(
            "--nprobe, --candidates and --rescore tune a vector index's search, not a bm25 index's"
        )
    if passages:
        _check_passages(index, vector_index, lance, text_from, output_format)
    if lance is None and vector_index is not None and resolve_device().startswith("cuda"):
        vector_index.to_gpu()

    # before any model loads: the query file's first record, the corpus of --text-from, the model spec
    query_reader = common.reader(queries, queries_format, id_field, text_field, False) if queries else None
    if text_from:
        common.reader(text_from, None, id_field, text_field, False)
    spec = None
    if vector_index is not None and (query or queries or passages):  # --passages: the model's tokenizer
        spec = model or vector_index.recorded_model()
        if not spec:
            raise UsageError("the index does not record its model: pass --model")
        resolved = common.resolve(spec)
        if lexical is not None:
            from docembed.faiss_index import refuse_hybrid_spec

            refuse_hybrid_spec(resolved)
        own_text = lance is not None and lexical is None  # a Lance index fuses its own full-text hits
        if own_text and resolved is not None and resolved.kind == "fusion" and not lance.has_text:
            raise UsageError(
                f"-m {spec} fuses full-text hits; {index} holds no text (build it --text-from, or give "
                "a bm25 --lexical-index)"
            )

    def query_items():
        if query_reader is not None:
            return ((d.id, d.text) for d in query_reader)
        return ((str(i), text) for i, text in enumerate(query or []))

    loaded = []

    def query_model():
        """(the query encoder, the fusion or None), loaded once when first needed."""
        from docembed.models.base import recorded_settings
        from docembed.runtime import settings as runtime

        if not loaded:
            encoder = common.load(spec)
            if lance is not None and lexical is None and encoder.family == "fusion":  # its own full text
                encoder.require_lexical("hybrid search")
                fusion = encoder
            else:
                fusion = hybrid_fusion(encoder, lexical)
            queries_by = fusion.model if fusion is not None else encoder
            if not runtime.server and (model is None or model == vector_index.recorded_model()):
                # the settings the indexed documents were encoded with (--ratio, --long, ...): the queries too
                recorded_settings(vector_index.metadata).apply(queries_by)
            loaded.append((queries_by, fusion))
            if passages:
                from docembed.passages import check_passage_model

                check_passage_model(loaded[0][0])
        return loaded[0]

    def kept(row, query_vectors):
        """--passages: the row keeps its query's vectors until its hits have their text (_with_passages)."""
        if passages:
            row[_QUERY_VECTORS] = query_vectors
        return row

    def rows():
        if passages:
            query_model()  # a model without passages is refused before any search
        if lance is not None:
            liked = lance.more_like(more_like, k, where) if more_like else []
        else:
            liked = vector_index.more_like(more_like, k) if more_like else []
        for doc_id, hits in zip(more_like or [], liked, strict=True):
            stored = vector_index.stored(doc_id) if passages else None
            yield kept({"query_id": doc_id, "results": hit_rows(hits)}, stored)
        if not query and not queries:
            return
        if bm25 is not None:  # lexical first stage: no model
            for chunk in batched(query_items(), 256):
                for (qid, text), hits in zip(chunk, bm25.search_texts([t for _, t in chunk], k), strict=True):
                    yield {"query_id": qid, "query": text, "results": hit_rows(hits)}
            return
        from docembed.encoding import encode_texts

        encoder, fusion = query_model()  # a fusion's model part: the query vectors; the lexical part's
        # scores come from its own index
        for chunk in batched(query_items(), 256):
            texts = [text for _, text in chunk]
            vectors = encode_texts(encoder, texts, batch_size=batch_size)
            if lance is not None and fusion is not None and lexical is None:
                found = lance.fused_search(texts, vectors, fusion, k, where, depth)
            elif lance is not None and hybrid:
                found = lance.hybrid_search(texts, vectors, k, where, depth)
            elif lance is not None and lexical is None:
                found = lance.search(vectors, k, where)
            else:  # a faiss index, or a Lance one beside a bm25 --lexical-index: the same fused search
                found = search_queries(vector_index, texts, vectors, k, lexical, fusion, depth)
            for i, ((qid, text), hits) in enumerate(zip(chunk, found, strict=True)):
                query_vectors = vectors.select([i]) if passages else None  # passages: multi-vector
                yield kept({"query_id": qid, "query": text, "results": hit_rows(hits)}, query_vectors)

    found = rows()
    if text_from:
        found = _with_texts(list(found), text_from, id_field, text_field)
    elif lance is not None and lance.has_text:
        found = _with_stored_texts(found, lance)
    if passages:
        found = _with_passages(found, vector_index, query_model()[0])
    with common.text_output(output, overwrite, [index, queries, text_from, lexical_index]) as handle:
        for row in found:
            if output_format == "trec":
                handle.write(trec_lines(row["query_id"], row["results"], run_tag))
            else:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")


_QUERY_VECTORS = "_query_vectors"  # a search row's query vectors, kept for --passages, never written


def _check_passages(index, vector_index, lance, text_from, output_format) -> None:
    """--passages, refused in one line before any model loads: for JSON Lines, an index of passages, and
    the hits' text (the spans are found in it)."""
    from docembed.errors import UsageError
    from docembed.passages import refuse_index_without_passages

    if output_format == "trec":
        raise UsageError("--passages adds offsets to JSONL rows; a TREC run has no place for them")
    if vector_index is None:
        raise UsageError(f"--passages: {index} is a bm25 index, which holds no passages")
    refuse_index_without_passages(vector_index, index)
    if text_from is None and (lance is None or not lance.has_text):
        stores = "was built without --text-from" if lance is not None else "is a faiss index (no text)"
        raise UsageError(
            f"--passages finds each passage in its document's text, and {index} {stores}: "
            "give --text-from CORPUS"
        )


def _with_passages(rows, vector_index, encoder):
    """Each hit with its best passage for the row's query (docembed.passages.add_passages), per batch."""
    from docembed.io.readers import batched
    from docembed.passages import add_passages

    for chunk in batched(rows, 256):
        queries = [row.pop(_QUERY_VECTORS) for row in chunk]
        add_passages(chunk, queries, vector_index, encoder)
        yield from chunk


def _lance_for_search(index, where, hybrid, version, lexical_index):
    """The Lance index to search (at --version), or None for a faiss / bm25 one, which the Lance-only
    options are refused for."""
    from docembed.errors import UsageError
    from docembed.lance_index import LanceIndex, is_lance_dir

    if not is_lance_dir(index):
        given = [
            name
            for name, value in (("--where", where), ("--hybrid", hybrid), ("--version", version))
            if value
        ]
        if given:
            raise UsageError(f"{', '.join(given)}: for a Lance index (`index build --store lance`)")
        return None
    if lexical_index is not None and (hybrid or where):
        # the bm25 index's hits are neither filtered nor the table's own full-text ones
        raise UsageError("--lexical-index fuses a separate bm25 index: leave out --hybrid and --where")
    lance = LanceIndex.open(index, version)
    if hybrid and not lance.has_text:
        raise UsageError(f"--hybrid needs the documents' text in {index}: build it with --text-from CORPUS")
    if where:
        lance.check_filter(where)
    return lance


def _with_stored_texts(rows, lance):
    """Each hit with the text its Lance index stores, fetched per batch of rows."""
    from docembed.io.readers import batched

    for chunk in batched(rows, 256):
        lance_texts = lance.texts_of([hit["id"] for row in chunk for hit in row["results"]])
        for row in chunk:
            for hit in row["results"]:
                hit["text"] = lance_texts.get(hit["id"])
        yield from chunk


def _with_texts(rows: list[dict], corpus: str, id_field: str, text_field: str) -> list[dict]:
    """Each hit with its text from `corpus` (read once, keeping only the texts of hits)."""
    from docembed.faiss_index import attach_texts, corpus_texts
    from docembed.runtime import log

    wanted = {hit["id"] for row in rows for hit in row["results"]}
    missing = attach_texts(rows, corpus_texts(corpus, wanted, id_field, text_field))
    if missing:
        log(f"warning: {len(missing)} hit id(s) not in {corpus} (first: {sorted(missing)[0]!r}): text null")
    return rows
