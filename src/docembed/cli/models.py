"""docembed models: what --model can name."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("models")(models)


def models(
    as_json: bool = typer.Option(False, "--json", help="JSON Lines on stdout instead of a table."),
) -> None:
    """List built-in model names and the models saved under $DOCEMBED_HOME."""
    import json

    from docembed.models.registry import available_models, models_home

    rows = available_models()
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"docembed models (home: {models_home() / 'models'})")
    for column in ("name", "family", "where", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["family"], row["where"], row["description"])
    Console().print(table)
