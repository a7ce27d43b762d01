"""Options shared by several commands (typer only at import time)."""

from __future__ import annotations

from contextlib import contextmanager

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
    """The documents of an input, its first record already read: a missing file, a wrong format or field
    is reported now, before a model loads."""
    from docembed.io.readers import DocumentReader, Shard

    documents = DocumentReader(path, format, id_field, text_field, skip_invalid, Shard.parse(shard))
    documents.check()
    return documents


def resolve(model: str):
    """What a model spec is (a built-in, a folder, a hub id, a fusion), found before anything loads: a
    mistake fails in a fraction of a second. With --server the served model is used instead (see load)."""
    from docembed.runtime import settings

    if settings.server:
        return None
    from docembed.models.registry import resolve_model

    return resolve_model(model)


def load(model: str):
    """The model for a command: the one a running `docembed serve` holds when --server (DOCEMBED_SERVER)
    is set, else `model` loaded here."""
    from docembed.runtime import resolve_device, settings

    if settings.server:
        from docembed.remote import RemoteEncoder

        return RemoteEncoder.connect(settings.server, expected=model)
    from docembed.models.registry import load_model

    return load_model(model, device=resolve_device())


def check_jsonl_fields(path: str, fields: tuple[str, ...], hint: str = "") -> tuple[int, dict] | None:
    """(line number, first row) of a JSON Lines input, read before a model loads, with each of `fields`
    checked to be a string: a wrong file or field name fails at once, naming the line."""
    from docembed.errors import InputFormatError
    from docembed.io.readers import json_record, peek_first_line

    first = peek_first_line(path)
    if first is None:
        return None
    raw, index = first
    row = json_record(raw, path, index + 1)
    for field in fields:
        if not isinstance(row.get(field), str):
            have = ", ".join(row) or "none"
            raise InputFormatError(
                path, index + 1, f"field {field!r} missing or not a string (fields: {have}){hint}"
            )
    return index + 1, row


OUTPUT_JSONL = typer.Option(
    "-",
    "--output",
    "-o",
    help="Output file (default: stdout), written all or nothing; replaced with --overwrite or when stale.",
)


def check_text_output(output: str, overwrite: bool, inputs) -> None:
    """Before any work: the one output rule (io/outputs.py) for a text output of a command."""
    from docembed.io.embeddings import check_output_path

    check_output_path(output, overwrite, [str(p) for p in inputs if p])


@contextmanager
def text_output(output: str, overwrite: bool, inputs):
    """A text handle for `-o OUTPUT`: stdout for '-', else a temporary sibling renamed into place only when
    the block finishes (a failed run leaves the previous output, or none: never a 0-byte target that make
    would take for up to date), under the output rule (replaced with --overwrite or when stale)."""
    import sys
    from pathlib import Path

    from docembed.io.outputs import atomic_path

    if output == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    inputs = [str(p) for p in inputs if p]
    with atomic_path(Path(output), overwrite, inputs) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        yield handle
