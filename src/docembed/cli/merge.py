"""docembed merge: one embeddings file from the outputs of `encode --shard i/n`."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)


def merge(
    parts: list[str] = typer.Argument(..., help="Embeddings files (any format), in input order."),
    output: str = typer.Option(
        ..., "--output", "-o", help="Merged file (.npy .npz .safetensors .parquet .jsonl)."
    ),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Concatenate embeddings files in the order given, after checking that they come from the same model.

    Example: docembed merge part0.npy part1.npy part2.npy -o whole.npy
    """
    from docembed.io.embeddings import check_output_path, concat_sets, load_embeddings, save_embeddings
    from docembed.runtime import log

    check_output_path(output, overwrite, inputs=parts)
    merged = concat_sets([load_embeddings(p) for p in parts], list(parts))
    duplicates = len(merged.ids) - len(set(merged.ids))
    if duplicates:
        log(f"warning: {duplicates} duplicate id(s) across the parts (was a shard given twice?)")
    save_embeddings(merged, output, overwrite=overwrite, inputs=parts)
    log(f"merged {len(parts)} file(s), {len(merged)} documents -> {output}")
