"""Options shared by several commands (typer only at import time)."""

from __future__ import annotations

import typer

MODEL = typer.Option("sbert", "--model", "-m", help="Zoo name, saved model directory, or hub id.")
BATCH_SIZE = typer.Option(32, "--batch-size", "-b", min=1, help="Texts per forward pass.")
INPUT_FORMAT = typer.Option(None, "--format", "-f", help="jsonl | txt | tsv (default: from the file name).")
ID_FIELD = typer.Option("id", "--id-field", help="JSON field holding the document id.")
TEXT_FIELD = typer.Option("text", "--text-field", help="JSON field holding the document text.")
SKIP_INVALID = typer.Option(False, "--skip-invalid", help="Skip (and count) malformed lines.")
OVERWRITE = typer.Option(False, "--overwrite", help="Replace an existing output.")
LIMIT = typer.Option(None, "--limit", min=1, help="Read only the first N documents (of each corpus).")


def hidden_alias(name: str, default=None, **extra):
    """An old spelling of an option, still accepted but not listed in --help."""
    return typer.Option(default, name, hidden=True, **extra)


DATA_ROOT = typer.Option(
    None,
    "--data-root",
    envvar="DOCEMBED_DATA",
    help="Folder of evaluation data sets (default ../shared/data).",
)


def reader(path, format, id_field, text_field, skip_invalid, shard=None):
    from docembed.io.readers import DocumentReader, Shard

    return DocumentReader(path, format, id_field, text_field, skip_invalid, Shard.parse(shard))


def load(model: str):
    from docembed.models.registry import load_model
    from docembed.runtime import resolve_device

    return load_model(model, device=resolve_device())
