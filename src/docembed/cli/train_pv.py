"""docembed train-pv: Paragraph Vector (gensim Doc2Vec) models, PV-DM, PV-DBOW or both concatenated."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("train-pv")(train_pv)


def train_pv(
    corpus: str = typer.Argument(
        ..., help="Training documents: .jsonl, .txt (one per line) or .tsv (id<TAB>text)."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory to write the model to."),
    mode: str = typer.Option(
        "dbow", "--mode", help="dm | dbow | concat (a DM and a DBOW model, vectors joined)."
    ),
    dim: int = typer.Option(300, "--dim", "--vector-size", min=1, help="Vector size of each sub-model."),
    window: int = typer.Option(10, "--window", min=1, help="Context window (words each side)."),
    negative: int = typer.Option(5, "--negative", min=1, help="Negative samples per prediction."),
    min_count: int = typer.Option(2, "--min-count", min=1, help="Drop words rarer than this."),
    sample: float = typer.Option(1e-4, "--sample", min=0.0, help="Subsampling threshold for frequent words."),
    epochs: int = typer.Option(20, "--epochs", min=1, help="Passes over the corpus."),
    infer_epochs: int = typer.Option(
        None, "--infer-epochs", min=1, help="Inference epochs (default: --epochs)."
    ),
    alpha: float = typer.Option(
        0.025, "--alpha", help="Initial learning rate (decays linearly to --min-alpha)."
    ),
    min_alpha: float = typer.Option(0.0001, "--min-alpha", help="Final learning rate."),
    dbow_words: bool = typer.Option(
        True, "--dbow-words/--no-dbow-words", help="DBOW also trains word vectors."
    ),
    dm_mean: bool = typer.Option(True, "--dm-mean/--dm-sum", help="DM averages or sums its context vectors."),
    normalize: bool = typer.Option(False, "--normalize", help="encode() returns unit-length vectors."),
    workers: int = typer.Option(2, "--workers", min=1, help="Training threads (1 = reproducible training)."),
    encode_workers: int = typer.Option(
        2, "--encode-workers", min=1, help="Processes the saved model encodes with."
    ),
    format: str = common.INPUT_FORMAT,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    skip_invalid: bool = common.SKIP_INVALID,
    overwrite: bool = common.OVERWRITE,
) -> None:
    """Train Paragraph Vectors on CORPUS (streamed: read once for the vocabulary, then once per epoch).

    Example: docembed train-pv corpus.jsonl -o models/pv --mode dbow
    """
    from docembed.errors import UsageError
    from docembed.io.outputs import check_output, directory_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.paragraph_vector import PVConfig, fit_pv
    from docembed.runtime import log, settings, torchrun_rank

    rank, world_size = torchrun_rank()
    if world_size > 1 and rank != 0:
        # gensim trains with worker threads inside one process (--workers), not with DDP: under torchrun
        # rank 0 does the whole job and the other ranks have nothing to do.
        log(f"train-pv: rank {rank} of {world_size} idle (gensim trains in one process; rank 0 trains)")
        return
    if corpus == "-":
        raise UsageError("train-pv reads its corpus several times: give a file, not stdin")
    check_output(output, overwrite, directory=True, inputs=[corpus], kind=MODEL_DIRECTORY)
    config = PVConfig(
        mode=mode,
        vector_size=dim,
        window=window,
        negative=negative,
        dbow_words=dbow_words,
        dm_mean=dm_mean,
        min_count=min_count,
        sample=sample,
        epochs=epochs,
        alpha=alpha,
        min_alpha=min_alpha,
        infer_epochs=infer_epochs,
        seed=settings.seed,
        workers=workers,
        encode_workers=encode_workers,
        normalize=normalize,
    )
    # all or nothing: built in a staging folder, swapped in only when complete
    with directory_output(output, MODEL_DIRECTORY, overwrite, inputs=[corpus]) as staging:
        fit_pv(common.reader(corpus, format, id_field, text_field, skip_invalid), config, staging)
    log(f"saved the model -> {output}")
