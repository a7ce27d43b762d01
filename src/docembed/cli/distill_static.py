"""docembed distill-static: distil a static model (one vector per token) from the offline MiniLM."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("distill-static")(distill_static)


def distill_static(
    corpus: list[str] = typer.Argument(
        ..., help="Text whose token frequencies weight the tokens: files or data sets (imdb/train ...)."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory to write the model to."),
    dim: int = typer.Option(256, "--dim", min=1, help="Dimensions kept by PCA (at most the model's, 384)."),
    token_pooling: str = typer.Option(
        "token", "--token-pooling", help="token | mean: a token's output, or the mean of [CLS] token [SEP]."
    ),
    weighting: str = typer.Option(
        "zipf", "--weighting", help="zipf | sif | none: how rarer tokens are weighted up."
    ),
    sif_a: float = typer.Option(1e-3, "--sif-a", min=0.0, help="SIF's a (with --weighting sif)."),
    text_field: str = common.TEXT_FIELD,
    data_root: str = common.DATA_ROOT,
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Distil a static model: every vocabulary token through MiniLM, PCA, token weights from CORPUS.

    Example: docembed distill-static imdb/train 20newsgroups/train -o models/static
    """
    from pathlib import Path

    from docembed.datasets import Corpus
    from docembed.errors import UsageError

    texts = Corpus(corpus, text_field=text_field, root=data_root).check()  # before the teacher loads
    from docembed.io.outputs import directory_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.static import StaticConfig
    from docembed.runtime import log, settings
    from docembed.training import static_distill

    if token_pooling not in static_distill.TOKEN_POOLINGS:
        raise UsageError(
            f"--token-pooling must be one of {', '.join(static_distill.TOKEN_POOLINGS)}, "
            f"not {token_pooling!r}"
        )
    if weighting not in static_distill.WEIGHTINGS:
        raise UsageError(
            f"--weighting must be one of {', '.join(static_distill.WEIGHTINGS)}, not {weighting!r}"
        )
    config = StaticConfig(
        dim=dim,
        token_pooling=token_pooling,
        weighting=weighting,
        sif_a=sif_a,
        weights_corpus=",".join(corpus),
    )
    files = [source for source in corpus if Path(source).exists()]  # the others are data set names
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=files) as staging:
        static_distill.distill_static(config, texts, seed=settings.seed).save(staging)
    log(f"saved the model -> {output}")
