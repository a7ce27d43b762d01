"""docembed train-setenc: train the order-free set encoder with alignment + uniformity (no labels)."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options


def register(app: typer.Typer) -> None:
    app.command("train-setenc")(train_setenc)


# AdamW with weight decay 0.1 and 10 epochs: without decay, on 20 Newsgroups 28 epochs fitted the training
# posts' halves (train align 0.22, test 1.10) and retrieved worse than 5 (MAP@100 20.5 vs 26.5); decay
# (which also shrinks the vectors of words never seen in training) made 10 epochs better than 5 (34.2 vs
# 32.2 at t = 2).
# AMP off by default: the runs above were made in float32. t = 2 was selected on a validation split of
# 20NG *train* (bench/sweep_setenc.py, 90/10, seed 0): MAP@100 24.5, kNN 64.3 against 15.7, 59.9 at t = 3;
# against 12 wider, longer or larger-hash variants (three seeds for five of them) nothing was better by more
# than one standard error, so these remain the defaults (bench/results/setenc/sweep_validation.md).
@loop_options(epochs=10, lr=2e-2, weight_decay=0.1, warmup_steps=50, amp="off")
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
    batch_size: int = typer.Option(256, "--batch-size", "-b", min=2, help="Documents per step (per rank)."),
    temperature: float = typer.Option(
        2.0, "--temperature", help="Uniformity temperature t in log mean exp(-t ||u - v||^2)."
    ),
    t: float = common.hidden_alias("--t"),
    align_weight: float = typer.Option(1.0, "--align-weight"),
    uniform_weight: float = typer.Option(1.0, "--uniform-weight"),
    max_train_tokens: int = typer.Option(
        1024, "--max-train-tokens", min=2, help="Tokens per document before the split (a random subset)."
    ),
    dim: int = typer.Option(256, "--dim", help="Output dimension."),
    word_dim: int = typer.Option(64, "--word-dim"),
    heads: int = typer.Option(4, "--heads", min=1),
    hidden: int = typer.Option(512, "--hidden", min=1),
    buckets: int = typer.Option(1 << 16, "--buckets", min=2, help="Rows of the hashed word-vector table."),
    hashes: int = typer.Option(2, "--hashes", min=1, max=8, help="Hashes (table rows summed) per token."),
    counts: str = typer.Option("set", "--counts", help="set (token counts ignored) | bag (they matter)."),
    token_norm: bool = typer.Option(True, "--token-norm/--no-token-norm", help="LayerNorm on word vectors."),
    attention: str = typer.Option("kernel", "--attention", help="kernel (elu + 1 features) | softmax."),
    loop: LoopOptions = None,
) -> None:
    """Train a set encoder on CORPUS and save it to OUTPUT (load it with --model OUTPUT).

    Example: docembed train-setenc 20newsgroups/train -o models/setenc
    """
    from pathlib import Path

    from docembed.datasets import Corpus
    from docembed.errors import CorruptModelError, UsageError
    from docembed.models.setenc import SetEncoderConfig
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import is_main_process, train
    from docembed.training.setenc_recipe import SetEncoderRecipe

    seed_everything()  # torch is imported now: seed everything the run draws
    output = output or output_dir
    if output is None:
        raise UsageError("Missing option '--output' / '-o'.")
    temperature = temperature if t is None else t

    if counts not in ("bag", "set"):
        raise UsageError(f"--counts must be bag or set, got {counts!r}")
    if (Path(output) / "checkpoint").exists() and not loop.resume:
        raise UsageError(f"{output} holds a checkpoint: pass --resume to continue it, or pick another -o")
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
    texts = Corpus(corpus, format, text_field, limit)
    try:
        recipe = SetEncoderRecipe(
            texts,
            config,
            batch_size=batch_size,
            t=temperature,
            align_weight=align_weight,
            uniform_weight=uniform_weight,
            max_train_tokens=max_train_tokens,
            seed=settings.seed,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    train_config = loop.train_config(output, settings.seed, settings.device)
    summary = train(recipe, train_config)
    if not is_main_process():  # rank 0 alone reports under torchrun
        return
    last = summary.get("last", {})
    align, uniform = last.get("align", float("nan")), last.get("uniform", float("nan"))
    log(
        f"trained {summary['steps']} steps in {summary['seconds']:.0f}s"
        f" ({summary.get('docs_per_s', 0)} docs/s); align {align:.3f}, uniform {uniform:.3f} -> {output}"
    )
