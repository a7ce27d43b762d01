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
    from pathlib import Path

    from docembed.errors import UsageError
    from docembed.models.registry import get_family
    from docembed.runtime import log

    if family not in ("tfidf", "bm25"):
        raise UsageError(f"only tfidf and bm25 are fitted this way, not {family!r}")
    target = Path(output)
    from docembed.io.outputs import check_output

    check_output(target, overwrite, directory=True)
    cls = get_family(family)
    config = cls.config_class()
    if svd_dim is not None:
        if family != "tfidf":
            raise UsageError("--svd-dim applies to tfidf only")
        config.svd_dim = svd_dim
    texts = [doc.text for doc in common.reader(input, format, "id", text_field, False)]
    model = cls(config, name=family).fit(texts)
    model.save(target)
    log(f"fitted {family} on {len(texts)} documents -> {target}")
