"""docembed fit: fit a corpus-statistics baseline (tfidf, bm25) and save it as a model directory."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("fit")(fit)


def fit(
    family: str = typer.Argument(..., help="Baseline to fit: tfidf or bm25."),
    input: str = typer.Argument(
        ..., help="Corpus: .jsonl, .txt (one document per line) or .tsv (id<TAB>text)."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Directory for the fitted model (usable as --model)."
    ),
    format: str = common.INPUT_FORMAT,
    text_field: str = common.TEXT_FIELD,
    svd_dim: int = typer.Option(
        None, "--svd-dim", min=0, help="tfidf: size of the dense LSA output of encode (0 = raw tf-idf rows)."
    ),
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Fit a corpus-statistics baseline (vocabulary, idf) on a corpus and save it as a model directory.

    Example: docembed fit tfidf corpus.jsonl -o models/tfidf
    """
    from docembed.errors import UsageError
    from docembed.io.outputs import directory_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.baselines import BM25Config, TfidfConfig, fit_bm25, fit_tfidf
    from docembed.runtime import log, settings

    if family not in ("tfidf", "bm25"):
        raise UsageError(f"only tfidf and bm25 are fitted this way, not {family!r}")
    if svd_dim is not None and family != "tfidf":
        raise UsageError("--svd-dim applies to tfidf only")
    # all or nothing, under the output's lock from the start: a second fit to the same output fails at once
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=[input]) as staging:
        texts = [doc.text for doc in common.reader(input, format, "id", text_field, False)]
        if family == "tfidf":
            config = TfidfConfig(seed=settings.seed)
            if svd_dim is not None:
                config.svd_dim = svd_dim
            model = fit_tfidf(texts, config)
        else:
            model = fit_bm25(texts, BM25Config())
        model.save(staging)
    log(f"saved the fitted {family} model -> {output}")
