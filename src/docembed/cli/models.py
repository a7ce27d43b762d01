"""docembed models: what --model can name and how to get each one; `--card NAME` prints a model card.
Also `fit_beside`, the one step behind `docembed encode --fit` for the corpus-fitted families."""

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

    from docembed.models.registry import available_models, models_home

    if card:
        from docembed import zoo
        from docembed.models.registry import BUILTIN, FIT_COMMANDS, fit_card

        if card in BUILTIN and BUILTIN[card].shipped:
            typer.echo(zoo.card(card), nl=False)
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


def fit_model_dir(output: str) -> str:
    """Where `encode --fit -o OUTPUT` keeps the model it fits: OUTPUT without its suffix + `.model/`."""
    from pathlib import Path

    path = Path(output)
    stem = path.name
    for suffix in reversed(path.suffixes):
        stem = stem.removesuffix(suffix)
    return str(path.with_name(f"{stem or path.name}.model"))


def fit_beside(
    name: str, input: str, output: str, format: str | None, text_field: str, overwrite: bool
) -> str:
    """`encode --fit`: fit the corpus-fitted family `name` on INPUT with its default settings (the command
    `docembed models` lists), save it beside OUTPUT, and return that directory for --model."""
    import shutil
    from pathlib import Path

    from docembed.errors import DocembedError, UsageError
    from docembed.models.registry import FIT_COMMANDS
    from docembed.runtime import log, settings

    if name not in FIT_COMMANDS:
        raise UsageError(
            f"--fit applies to the corpus-fitted families ({', '.join(FIT_COMMANDS)}), not {name!r}"
        )
    if input == "-" or output == "-":
        raise UsageError("--fit reads the input twice and saves the model beside -o: give files, not -")
    target = Path(fit_model_dir(output))
    if target.exists():
        if not overwrite:
            raise DocembedError(f"{target} exists (the model --fit would write): pass --overwrite to refit")
        shutil.rmtree(target)
    command = FIT_COMMANDS[name].split()[1:]
    args = [part.replace("CORPUS", input).replace("DIR", str(target)) for part in command]
    args += ["--text-field", text_field] + (["--format", format] if format else [])
    log(f"--fit: docembed {' '.join(args)}")
    from docembed.cli import app

    root = ["--seed", str(settings.seed), *(["-q"] if settings.quiet else []), "--device", settings.device]
    app(root + args, standalone_mode=False)
    return str(target)
