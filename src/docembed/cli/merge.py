"""docembed merge: one embeddings file from the outputs of `encode --shard i/n`."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("merge")(merge)


def merge(
    parts: list[str] = typer.Argument(
        ...,
        help="Embeddings files (any format): `encode --shard i/n` outputs in any order (ordered by the shard "
        "each records), other files in input order.",
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Merged file (.npy .npz .safetensors .parquet .jsonl)."
    ),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Concatenate embeddings files after checking that they come from the same model. Outputs of
    `encode --shard i/n` are put in input order by the shard each records (so `merge part*.npy` works in
    any glob order); a missing shard, a shard given twice and shards of another input are refused. Files
    without shard provenance are joined in the order given.

    Example: docembed merge part*.npy -o whole.npy
    """
    from docembed.io.embeddings import (
        check_output_path,
        check_same_model,
        concat_sets,
        load_embeddings,
        order_shards,
        save_embeddings,
    )
    from docembed.runtime import log

    check_output_path(output, overwrite, inputs=parts)
    loaded = [load_embeddings(p) for p in parts]
    check_same_model(loaded, list(parts))
    order = order_shards(loaded, list(parts))
    merged = concat_sets([loaded[i] for i in order], [parts[i] for i in order])
    merged.metadata.pop("shard", None)  # the whole input now, not one shard of it
    duplicates = len(merged.ids) - len(set(merged.ids))
    if duplicates:
        log(f"warning: {duplicates} duplicate id(s) across the parts (was a shard given twice?)")
    save_embeddings(merged, output, overwrite=overwrite, inputs=parts, storage=_storage_of(merged, output))
    log(f"merged {len(parts)} file(s), {len(merged)} documents -> {output}")


def _storage_of(merged, output: str) -> str:
    """The parts' storage (concat_sets checked they share one), kept by the merged set: int8 rows written as
    float32 would pass for float32 ones. Refused for a format that holds float32 only."""
    from docembed.errors import DocembedError, UsageError
    from docembed.io.embeddings import check_storage

    storage = merged.metadata.get("storage", "float32")
    if storage == "float32":
        return storage
    try:
        check_storage(output, None, storage)
    except UsageError:
        raise DocembedError(
            f"the parts hold {storage} vectors, which {output} cannot hold: merge them into .npy, .npz or "
            ".safetensors"
        ) from None
    return storage
