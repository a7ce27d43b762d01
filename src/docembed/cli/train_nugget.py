"""docembed train-nugget (train a NUGGET encoder-decoder) and docembed inspect (which tokens become nuggets,
and how well the nuggets reconstruct the text)."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("train-nugget")(train_nugget)
    app.command("inspect")(inspect)


def train_nugget(
    corpus: str = typer.Argument(
        ..., help="ae: documents (.jsonl/.txt/.tsv); mt: JSON Lines source/target pairs."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Folder for the trained model, checkpoints and logs."
    ),
    objective: str = typer.Option(
        "ae", "--objective", help="ae (autoencode with token deletion) | mt (pairs)."
    ),
    noise: float = typer.Option(0.1, "--noise", min=0.0, max=0.9, help="ae: token deletion rate."),
    source_field: str = typer.Option("source", "--source-field", help="mt: JSON field of the source text."),
    target_field: str = typer.Option("target", "--target-field", help="mt: JSON field of the target text."),
    text_field: str = common.TEXT_FIELD,
    format: str = common.INPUT_FORMAT,
    max_docs: int = typer.Option(None, "--max-docs", min=1, help="Use only the first N documents / pairs."),
    max_length: int = typer.Option(128, "--max-length", min=8, help="Tokens per document (both sides)."),
    backbone: str = typer.Option(
        "minilm", "--backbone", help="minilm (offline BERT2BERT), or a BART/mBART id."
    ),
    kind: str = typer.Option(None, "--kind", help="bert | bart (default: bert for minilm, else bart)."),
    decoder_layers: int = typer.Option(None, "--decoder-layers", min=1, help="BERT2BERT decoder depth."),
    ratio: float = typer.Option(
        0.1, "--ratio", min=0.0, max=1.0, help="Compression ratio r (k = ceil(r n))."
    ),
    scorer_layer: int = typer.Option(
        3, "--scorer-layer", min=0, help="l: scorer input; layers below freeze."
    ),
    no_feedback: bool = typer.Option(False, "--no-feedback", help="Ablation: no nugget type embeddings."),
    residual: str = typer.Option("raw", "--residual", help="raw | straight-through | none."),
    selector: str = typer.Option("scorer", "--selector", help="scorer | chunk (rule-based ablation)."),
    epochs: int = typer.Option(1, "--epochs", min=1),
    max_steps: int = typer.Option(None, "--max-steps", min=1),
    time_budget: float = typer.Option(None, "--time-budget", help="Stop (and save) after this many seconds."),
    batch_size: int = typer.Option(16, "--batch-size", "-b", min=1),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1),
    lr: float = typer.Option(5e-5, "--lr"),
    warmup_steps: int = typer.Option(0, "--warmup-steps", min=0),
    amp: str = typer.Option("auto", "--amp", help="auto | off | bf16 | fp16 (CUDA only)."),
    save_every: int = typer.Option(500, "--save-every", min=1),
    log_every: int = typer.Option(10, "--log-every", min=1),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUTPUT/checkpoint."),
) -> None:
    """Train NUGGET (Qin & Van Durme 2023). Runs under torchrun unchanged."""
    from pathlib import Path

    from docembed.errors import UsageError
    from docembed.models.nugget import NuggetConfig, NuggetEncoder
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import TrainConfig, is_main_process, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    seed_everything()  # torch is imported now: seed the model's initialisation too

    if objective not in ("ae", "mt"):
        raise UsageError(f"--objective must be ae or mt, got {objective!r}")
    if ratio <= 0:
        raise UsageError("--ratio must be > 0")
    sources, targets = _read_corpus(
        corpus, objective, format, text_field, source_field, target_field, max_docs
    )
    config = NuggetConfig(
        backbone=backbone,
        kind=kind or ("bert" if backbone == "minilm" else "bart"),
        ratio=ratio,
        scorer_layer=scorer_layer,
        feedback=not no_feedback,
        residual=residual,
        selector=selector,
        decoder_layers=decoder_layers,
    )
    encoder = NuggetEncoder(config, name=Path(output).name)
    examples = tokenize_examples(encoder, sources, targets, max_length)
    log(
        f"train-nugget: {len(examples)} examples ({objective}), {sum(len(e.source) for e in examples)} tokens"
    )
    recipe = NuggetRecipe(encoder, examples, objective, noise, batch_size, seed=settings.seed)
    summary = train(
        recipe,
        TrainConfig(
            output_dir=output,
            epochs=epochs,
            max_steps=max_steps,
            lr=lr,
            warmup_steps=warmup_steps,
            grad_accum=grad_accum,
            amp=amp,
            log_every=log_every,
            save_every=save_every,
            resume=resume,
            seed=settings.seed,
            device=settings.device,
            time_budget_s=time_budget,
        ),
    )
    if not is_main_process():  # rank 0 alone reports under torchrun
        return
    log(
        f"trained {summary['steps']} steps in {summary['seconds']} s ({summary['tokens_per_s']} tokens/s), "
        f"last loss {summary['last'].get('loss', float('nan')):.4f} -> {output}"
    )


def _read_corpus(path, objective, format, text_field, source_field, target_field, max_docs):
    from docembed.errors import DocembedError, InputFormatError
    from docembed.io.readers import iter_jsonl_lines

    if objective == "ae":
        documents = common.reader(path, format, "id", text_field, False)
        texts = []
        for doc in documents:
            if max_docs and len(texts) >= max_docs:
                break
            texts.append(doc.text)
        return texts, None
    sources, targets = [], []
    for number, record in iter_jsonl_lines(path):
        if max_docs and len(sources) >= max_docs:
            break
        if source_field not in record or target_field not in record:
            raise InputFormatError(path, number, f"needs fields {source_field!r} and {target_field!r}")
        sources.append(str(record[source_field]))
        targets.append(str(record[target_field]))
    if not sources:
        raise DocembedError(f"{path}: no pairs")
    return sources, targets


def inspect(
    input: str = typer.Argument(..., help="Documents (.jsonl/.txt/.tsv)."),
    model: str = typer.Option(..., "--model", "-m", help="A NUGGET model (saved directory or name)."),
    ratio: float = typer.Option(None, "--ratio", help="Compression ratio r (default: the model's)."),
    show: int = typer.Option(3, "--show", min=0, help="Documents to print with their nuggets highlighted."),
    limit: int = typer.Option(None, "--limit", min=1, help="Use only the first N documents."),
    top: int = typer.Option(20, "--top", min=1, help="Rows of the token statistics table."),
    bleu: int = typer.Option(
        0,
        "--bleu",
        min=0,
        help="Also decode N documents from their nuggets (beam 5) "
        "and report corpus BLEU-4 against the (truncated) input.",
    ),
    bleu_max_length: int = typer.Option(
        128, "--bleu-max-length", min=8, help="Tokens per document for --bleu."
    ),
    format: str = common.INPUT_FORMAT,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    batch_size: int = common.BATCH_SIZE,
) -> None:
    """Show which tokens NUGGET keeps (highlighted) and how often each token is chosen versus its corpus
    frequency (the paper's Figures 5 and 6)."""
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from docembed.errors import UsageError
    from docembed.models.nugget import NuggetEncoder, nugget_token_statistics, reconstruction_bleu

    encoder = common.load(model)
    if not isinstance(encoder, NuggetEncoder):
        raise UsageError(f"inspect needs a NUGGET model; {model!r} is a {encoder.family} model")
    if ratio is not None:
        encoder.set_ratio(ratio)
    texts = []
    for doc in common.reader(input, format, id_field, text_field, False):
        if limit and len(texts) >= limit:
            break
        texts.append(doc.text)
    items = encoder.nuggets(texts, batch_size)
    console = Console(highlight=False)
    tokenizer = encoder.tokenizer
    for text_index in range(min(show, len(items))):
        _, positions, ids = items[text_index]
        chosen = set(positions.tolist())
        pieces = []
        for position, token in enumerate(tokenizer.convert_ids_to_tokens(ids)):
            word = escape(token)
            if position in chosen:  # highlighted in a terminal; [[marked]] when piped or without colour
                word = f"[bold black on yellow]{word}[/]" if console.color_system else escape(f"[[{token}]]")
            pieces.append(word)
        console.print(
            f"[dim]doc {text_index} ({len(chosen)} nuggets / {len(ids)} tokens):[/] " + " ".join(pieces)
        )
        console.print()
    stats = nugget_token_statistics(items, tokenizer)
    table = Table(
        title=f"nugget tokens (r={encoder.config.ratio}, {stats['documents']} docs, "
        f"{stats['nuggets']} nuggets of {stats['tokens']} tokens)"
    )
    for column in ("token", "chosen", "share of nuggets", "share of tokens", "chosen when seen"):
        table.add_column(column, justify="left" if column == "token" else "right")
    for row in stats["rows"][:top]:
        table.add_row(
            escape(row["token"]),
            str(row["chosen"]),
            f"{row['nugget_share']:.3f}",
            f"{row['token_share']:.3f}",
            f"{row['selection_rate']:.3f}",
        )
    console.print(table)
    frequent = ", ".join(f"{escape(r['token'])} {r['selection_rate']:.2f}" for r in stats["frequent"][:10])
    console.print(f"most frequent tokens, chosen when seen: {frequent}")
    if bleu:
        score = reconstruction_bleu(encoder, texts[:bleu], beams=5, max_length=bleu_max_length)
        console.print(
            json.dumps({"ratio": encoder.config.ratio, "documents": min(bleu, len(texts)), **score})
        )
