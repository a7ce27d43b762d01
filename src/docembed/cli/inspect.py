"""docembed inspect: which tokens a NUGGET model keeps (highlighted), how often each token type is chosen
against its frequency, and how well the nuggets reconstruct the text."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)


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
    frequency (the paper's Figures 5 and 6).

    Example: docembed inspect docs.txt -m models/nugget
    """
    import json

    common.resolve(model)  # before torch: a wrong model or file fails at once
    common.reader(input, format, id_field, text_field, False)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from docembed.errors import UsageError
    from docembed.models.nugget import NuggetEncoder
    from docembed.models.nugget_generation import reconstruction_bleu
    from docembed.models.nugget_statistics import nugget_token_statistics

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
