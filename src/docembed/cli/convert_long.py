"""docembed convert-long: turn a short encoder into a long-document student (tiled positions, sliding-window
attention), the starting point of train-distill."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("convert-long")(convert_long)


def convert_long(
    source: str = typer.Argument(
        "sbert",
        help="sbert/minilm (offline all-MiniLM-L6-v2), a BERT/RoBERTa checkpoint folder, a hub id, "
        "or a Longformer (allenai/longformer-base-4096) to wrap as is.",
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory for the student."),
    max_length: int = typer.Option(4096, "--max-length", min=2, help="Tokens the student reads."),
    attention_window: int = typer.Option(256, "--attention-window", min=2, help="Sliding window (even)."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help="Unit-length embeddings."),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Turn a short encoder into a long student: tiled positions, sliding-window attention.

    Example: docembed convert-long sbert -o models/long --max-length 4096
    """
    from docembed.models.student import convert_long as convert
    from docembed.runtime import log

    out = _output_dir(output, overwrite)
    student = convert(source, max_length, attention_window, normalize)
    student.save(out)
    log(f"long student from {source}: {student.config.max_length} tokens, window {attention_window} -> {out}")


def _output_dir(output: str, overwrite: bool):
    import shutil
    from pathlib import Path

    from docembed.errors import UsageError

    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise UsageError(f"{output} exists and is not empty (use --overwrite to replace it)")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    return out
