"""docembed train-setenc: train the order-free set encoder with alignment + uniformity (no labels)."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("train-setenc")(train_setenc)


def train_setenc(
    corpus: str = typer.Argument(
        ...,
        help="Training documents: a .jsonl/.txt/.tsv file, or a data set name such as 20newsgroups/train.",
    ),
    output_dir: str = typer.Option(..., "--output-dir", "-o", help="Where the trained model is written."),
    format: str = common.INPUT_FORMAT,
    text_field: str = common.TEXT_FIELD,
    limit: int = typer.Option(None, "--limit", min=2, help="Train on the first N documents only."),
    # 10 with weight decay: without it, on 20 Newsgroups 28 epochs fitted the training posts' halves (train
    # align 0.22, test 1.10) and retrieved worse than 5 (MAP@100 20.5 vs 26.5); decay (which also shrinks
    # the vectors of words never seen in training) made 10 epochs better than 5 (34.2 vs 32.2 at t = 2).
    epochs: int = typer.Option(10, "--epochs", min=1),
    max_steps: int = typer.Option(None, "--max-steps", min=1, help="Stop after this many optimizer steps."),
    time_budget: float = typer.Option(None, "--time-budget", help="Stop (and save) after this many seconds."),
    batch_size: int = typer.Option(256, "--batch-size", "-b", min=2, help="Documents per step (per rank)."),
    lr: float = typer.Option(2e-2, "--lr"),
    weight_decay: float = typer.Option(0.1, "--weight-decay", help="AdamW's decoupled weight decay."),
    warmup_steps: int = typer.Option(50, "--warmup-steps", min=0),
    t: float = typer.Option(3.0, "--t", help="Uniformity temperature t in log mean exp(-t ||u - v||^2)."),
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
    log_every: int = typer.Option(10, "--log-every", min=1),
    save_every: int = typer.Option(500, "--save-every", min=1),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUTPUT_DIR/checkpoint."),
) -> None:
    """Train a set encoder on CORPUS and save it to OUTPUT_DIR (load it with --model OUTPUT_DIR)."""
    from pathlib import Path

    from docembed.errors import CorruptModelError, UsageError
    from docembed.models.set_encoder import SetEncoderConfig
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import TrainConfig, is_main_process, train
    from docembed.training.setenc_recipe import SetEncoderRecipe

    seed_everything()  # torch is imported now: seed everything the run draws

    if counts not in ("bag", "set"):
        raise UsageError(f"--counts must be bag or set, got {counts!r}")
    if (Path(output_dir) / "checkpoint").exists() and not resume:
        raise UsageError(f"{output_dir} holds a checkpoint: pass --resume to continue it, or pick another -o")
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
    texts = _texts(corpus, format, text_field, limit)
    try:
        recipe = SetEncoderRecipe(
            texts,
            config,
            batch_size=batch_size,
            t=t,
            align_weight=align_weight,
            uniform_weight=uniform_weight,
            max_train_tokens=max_train_tokens,
            seed=settings.seed,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    train_config = TrainConfig(
        output_dir=output_dir,
        epochs=epochs,
        max_steps=max_steps,
        lr=lr,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        amp="off",
        log_every=log_every,
        save_every=save_every,
        resume=resume,
        seed=settings.seed,
        device=settings.device,
        time_budget_s=time_budget,
    )
    summary = train(recipe, train_config)
    if not is_main_process():  # rank 0 alone reports under torchrun
        return
    last = summary.get("last", {})
    align, uniform = last.get("align", float("nan")), last.get("uniform", float("nan"))
    log(
        f"trained {summary['steps']} steps in {summary['seconds']:.0f}s"
        f" ({summary.get('docs_per_s', 0)} docs/s); align {align:.3f}, uniform {uniform:.3f} -> {output_dir}"
    )


def _texts(corpus: str, format: str | None, text_field: str, limit: int | None) -> list[str]:
    """Texts of a file, or of a data set from the data root when CORPUS is not a file but a known name."""
    from pathlib import Path

    from docembed import datasets

    if not Path(corpus).exists() and corpus in datasets.manifest():
        documents = datasets.documents(corpus, text_field=text_field)
    else:
        documents = common.reader(corpus, format, "id", text_field, False)
    texts = []
    for doc in documents:
        if limit is not None and len(texts) >= limit:
            break
        texts.append(doc.text)
    return texts
