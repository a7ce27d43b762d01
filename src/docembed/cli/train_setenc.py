"""docembed train-setenc: train the order-free set encoder with alignment + uniformity (no labels)."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options
from docembed.training.fitting import SETENC_ATTENTION, SETENC_LOOP, SetEncoderTraining

DEFAULTS = SetEncoderTraining()


def register(app: typer.Typer) -> None:
    app.command("train-setenc")(train_setenc)


# The defaults and the reasons for them: docembed.training.fitting (SETENC_LOOP, SetEncoderTraining).
@loop_options(**SETENC_LOOP)
def train_setenc(
    corpus: str = typer.Argument(
        ...,
        help="Training documents: a .jsonl/.txt/.tsv file, or a data set name such as 20newsgroups/train.",
    ),
    output: str = typer.Option(None, "--output", "-o", help="Where the trained model is written."),
    output_dir: str = common.hidden_alias("--output-dir"),
    format: str = common.INPUT_FORMAT,
    text_field: str = common.TEXT_FIELD,
    limit: int = typer.Option(None, "--limit", min=2, help="Train on the first N documents only."),
    batch_size: int = typer.Option(
        DEFAULTS.batch_size, "--batch-size", "-b", min=2, help="Documents per step (per rank)."
    ),
    temperature: float = typer.Option(
        DEFAULTS.temperature,
        "--temperature",
        help="Uniformity temperature t in log mean exp(-t ||u - v||^2).",
    ),
    t: float = common.hidden_alias("--t"),
    align_weight: float = typer.Option(DEFAULTS.align_weight, "--align-weight"),
    uniform_weight: float = typer.Option(DEFAULTS.uniform_weight, "--uniform-weight"),
    max_train_tokens: int = typer.Option(
        DEFAULTS.max_train_tokens,
        "--max-train-tokens",
        min=2,
        help="Tokens per document before the split (a random subset).",
    ),
    dim: int = typer.Option(256, "--dim", min=1, help="Output dimension."),
    word_dim: int = typer.Option(64, "--word-dim", min=1),
    heads: int = typer.Option(4, "--heads", min=1),
    hidden: int = typer.Option(512, "--hidden", min=1),
    buckets: int = typer.Option(1 << 16, "--buckets", min=2, help="Rows of the hashed word-vector table."),
    hashes: int = typer.Option(2, "--hashes", min=1, max=8, help="Hashes (table rows summed) per token."),
    counts: str = typer.Option("set", "--counts", help="set (token counts ignored) | bag (they matter)."),
    token_norm: bool = typer.Option(True, "--token-norm/--no-token-norm", help="LayerNorm on word vectors."),
    attention: str = typer.Option(
        SETENC_ATTENTION, "--attention", help="kernel (elu + 1 features) | softmax."
    ),
    loop: LoopOptions = None,
) -> None:
    """Train a set encoder on CORPUS and save it to OUTPUT (load it with --model OUTPUT).

    Example: docembed train-setenc 20newsgroups/train -o models/setenc
    """

    from docembed.datasets import Corpus
    from docembed.errors import CorruptModelError, UsageError

    Corpus(corpus, format, text_field, limit).check()  # before torch: a wrong file fails at once
    from docembed.models.setenc import SetEncoderConfig
    from docembed.runtime import log, settings
    from docembed.training.fitting import fit_setenc

    output = output or output_dir
    if output is None:
        raise UsageError("Missing option '--output' / '-o'.")
    temperature = temperature if t is None else t

    if counts not in ("bag", "set"):
        raise UsageError(f"--counts must be bag or set, got {counts!r}")
    loop.refuse_trained_output(output)
    try:
        config = SetEncoderConfig(
            num_buckets=buckets,
            num_hashes=hashes,
            word_dim=word_dim,
            heads=heads,
            dim=dim,
            hidden=hidden,
            counts=counts,
            token_norm=token_norm,
            attention=attention,
        )
    except CorruptModelError as error:  # bad shapes given on the command line are usage errors here
        raise UsageError(str(error)) from None
    training = SetEncoderTraining(
        batch_size=batch_size,
        temperature=temperature,
        align_weight=align_weight,
        uniform_weight=uniform_weight,
        max_train_tokens=max_train_tokens,
    )
    fit_setenc(
        Corpus(corpus, format, text_field, limit),
        config,
        output,
        training,
        loop.train_config(output, settings.seed, settings.device),
        validation=loop.validation,
    )
    log(f"saved the set encoder -> {output}")
