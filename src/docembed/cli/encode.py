"""docembed encode: the main job."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("encode")(encode)


def encode(
    input: str = typer.Argument(
        ..., help="Documents: .jsonl, .txt (one per line), .tsv (id<TAB>text), or - for stdin."
    ),
    output: str = typer.Option(
        "-",
        "--output",
        "-o",
        help="Output file (.npy .npz .safetensors .parquet .jsonl); - is JSONL on stdout.",
    ),
    model: str = common.MODEL,
    format: str = common.INPUT_FORMAT,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    skip_invalid: bool = common.SKIP_INVALID,
    shard: str = typer.Option(
        None, "--shard", help="I/N: encode only the I-th (0-based) of N contiguous slices."
    ),
    batch_size: int = common.BATCH_SIZE,
    output_format: str = typer.Option(None, "--output-format", help="Override the format implied by -o."),
    overwrite: bool = common.OVERWRITE,
    ratio: float = typer.Option(None, "--ratio", help="NUGGET: compression ratio r at encode time."),
    workers: int = typer.Option(
        None, "--workers", min=1, help="PV: inference processes (default: the model's)."
    ),
) -> None:
    """Embed every document of INPUT (one output row per input row, empty texts included)."""
    from docembed.encoding import encode_documents
    from docembed.io.embeddings import check_output_path, save_embeddings
    from docembed.runtime import log

    check_output_path(output, overwrite)
    documents = common.reader(input, format, id_field, text_field, skip_invalid, shard)
    encoder = common.load(model)
    if ratio is not None:
        if not hasattr(encoder, "set_ratio"):
            raise typer.BadParameter(f"model {model!r} has no compression ratio", param_hint="--ratio")
        encoder.set_ratio(ratio)
    if workers is not None:
        if not hasattr(encoder, "set_workers"):
            raise typer.BadParameter(f"model {model!r} encodes in one process", param_hint="--workers")
        encoder.set_workers(workers)
    total = len(documents) if input != "-" and _progress_wanted() else None
    embeddings = encode_documents(encoder, documents, batch_size=batch_size, total=total)
    if documents.skipped:
        log(f"skipped {documents.skipped} invalid line(s) of {documents.name}")
    save_embeddings(embeddings, output, output_format)
    shape = f"dim {embeddings.dim}"
    if embeddings.is_multi:
        shape = f"multi-vector, {embeddings.data.counts.mean():.1f} vectors/doc, " + shape
    where = "stdout" if output == "-" else output
    log(f"encoded {len(embeddings)} documents with {encoder.name} ({shape}) -> {where}")


def _progress_wanted() -> bool:
    from docembed.runtime import progress_enabled

    return progress_enabled()
