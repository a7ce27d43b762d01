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
    from docembed.io.outputs import check_not_inside, check_output, directory_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.student import convert_long as convert
    from docembed.runtime import log

    _check_length(max_length)
    # replaced only if it is a docembed model (io/outputs.py), and all or nothing; never inside the source,
    # nor the source itself (a docembed model folder converted again)
    check_not_inside(output, [source])
    check_output(output, overwrite, directory=True, inputs=[source], kind=MODEL_DIRECTORY)
    student = convert(source, max_length, attention_window, normalize)
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=[source]) as staging:
        student.save(staging)
    length = student.config.max_length
    log(f"long student from {source}: {length} tokens, window {attention_window} -> {output}")


# The student's position table grows with --max-length (tokens x hidden size x 4 bytes, and the same again
# for the optimiser in train-distill): 131,072 tokens of MiniLM are 200 MB; 100,000,000 would be 153 GB.
MAX_LENGTH_LIMIT = 131_072


def _check_length(max_length: int) -> None:
    from docembed.errors import UsageError

    if max_length > MAX_LENGTH_LIMIT:
        raise UsageError(
            f"--max-length {max_length:,} is over the limit of {MAX_LENGTH_LIMIT:,} tokens "
            "(the student's position table alone would not fit in memory)"
        )
