"""docembed models: what --model can name and how to get each one; `--card NAME` prints a model card."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("models")(models)


def models(
    as_json: bool = typer.Option(False, "--json", help="JSON Lines on stdout instead of a table."),
    card: str = typer.Option(
        None,
        "--card",
        help="Print the model card (markdown) of a shipped built-in or of a corpus-fitted family with one "
        "(setenc).",
    ),
) -> None:
    """List every built-in model and corpus-fitted family with how to get it, and the models saved under
    $DOCEMBED_HOME.

    Example: docembed models --card nugget
    """
    import json

    from docembed.models.registry import available_models
    from docembed.runtime import models_home

    if card:
        from docembed.models import zoo
        from docembed.models.registry import BUILTIN, FIT_COMMANDS, fit_card, zoo_name

        if card in BUILTIN and BUILTIN[card].shipped:
            typer.echo(zoo.card(zoo_name(card)), nl=False)
            return
        fitted_card = fit_card(card)
        if fitted_card is not None:
            typer.echo(fitted_card, nl=False)
            return
        from docembed.errors import UsageError

        with_cards = [n for n, e in BUILTIN.items() if e.shipped] + [n for n in FIT_COMMANDS if fit_card(n)]
        raise UsageError(f"model cards exist for {', '.join(with_cards)}, not {card!r}")
    rows = available_models()
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"docembed models (home: {models_home() / 'models'})")
    for column in ("name", "family", "how to get it", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["name"], row["family"], row["get"], row["description"])
    Console().print(table)
