"""docembed export: a model as a folder another library loads (sentence-transformers)."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    model: str = typer.Argument(..., help="An sbert-family model: built-in name, saved folder or hub id."),
    output: str = typer.Option(..., "--output", "-o", help="Folder to write (SentenceTransformer(FOLDER))."),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Write an sbert-family model as a sentence-transformers folder.

    Example: docembed export sbert -o minilm-st   (then SentenceTransformer("minilm-st") in Python)
    """
    from docembed.errors import UsageError

    common.resolve(model)  # before torch: a wrong model fails at once
    from docembed.io.outputs import check_not_inside, check_output, directory_output
    from docembed.models.sbert import SENTENCE_TRANSFORMERS_DIRECTORY
    from docembed.runtime import log

    check_not_inside(output, [model])  # the model folder read is an input: nothing lands inside it
    check_output(output, overwrite, directory=True, inputs=[model], kind=SENTENCE_TRANSFORMERS_DIRECTORY)
    encoder = common.load(model)
    if encoder.family != "sbert":
        raise UsageError(
            f"{model} is a {encoder.family} model: only sbert-family models export to sentence-transformers "
            "(use docembed.load in Python, or `docembed encode`, for the others)"
        )
    if encoder.config.output != "mean":
        what = {
            "tokens": "one vector per token",
            "chunks": "the mean of windows over the whole text",
            "windows": "one vector per window of the whole text, scored by its passages",
        }.get(encoder.config.output, f"its {encoder.config.output!r} output")
        log(
            f"note: {model} gives {what}; the exported folder gives "
            f"sentence-transformers' one mean-pooled vector of the first {encoder.max_seq_length} tokens"
        )
    with directory_output(output, SENTENCE_TRANSFORMERS_DIRECTORY, overwrite, inputs=[model]) as staging:
        encoder.export_sentence_transformers(staging)
    log(f"exported {model} -> {output} (load with SentenceTransformer({output!r}))")
