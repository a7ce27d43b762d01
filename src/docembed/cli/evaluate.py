"""docembed evaluate: run evaluation tasks on models; docembed fit: fit and save a tfidf/bm25 baseline."""

from __future__ import annotations

import typer

from docembed.cli import common

TASK_HELP = (
    "Task names (several allowed, or comma-separated): paraphrase-identification (alias pi), "
    "paraphrase-identification-train, mr, cr, subj, mpqa (group senteval), stsb, sick (group sts), imdb, "
    "20newsgroups (20ng), 20newsgroups-retrieval (retrieval); `all` runs every task."
)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
    app.command("fit")(fit)


def evaluate(
    tasks: list[str] = typer.Argument(..., help=TASK_HELP),
    models: list[str] = typer.Option(
        ["sbert"], "--model", "-m", help="Model(s) to evaluate: zoo name, saved directory, tfidf, bm25."
    ),
    data_root: str = common.DATA_ROOT,
    limit: int = typer.Option(
        None,
        "--limit",
        min=1,
        help="Use a seeded subset of N examples per split (PI queries, SentEval sentences, STS pairs, "
        "documents per IMDB/20NG split), stratified by label where there is one. Default: the full sets.",
    ),
    fast: bool = typer.Option(
        False, "--fast", help="SentEval: 5 outer / 3 inner CV folds instead of 10 / 10."
    ),
    seed: int = typer.Option(
        1111, "--eval-seed", help="Seed of subsets, shuffles and CV folds (SentEval: 1111)."
    ),
    batch_size: int = common.BATCH_SIZE,
    output_dir: str = typer.Option(
        "eval-results", "--output-dir", "-o", help="Folder for one JSON result file per task and model."
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Recompute embeddings instead of using the cache."
    ),
) -> None:
    """Evaluate models on tasks: a table on stderr, one JSON line per result on stdout, JSON files in -o."""
    import json

    from docembed.evaluation import TASKS, EvalOptions, load_evaluation_model, resolve_tasks, write_result
    from docembed.runtime import log, resolve_device, stderr_console

    names = resolve_tasks(tasks)
    options = EvalOptions(
        data_root=data_root, limit=limit, fast=fast, seed=seed, batch_size=batch_size, cache=not no_cache
    )
    from docembed.datasets import data_root as resolve_root

    resolve_root(data_root)  # fail before loading any model when the data is missing
    results = []
    for spec in models:
        model = load_evaluation_model(spec, device=resolve_device())
        for name in names:
            log(f"evaluating {model.name} on {name}")
            result = TASKS[name](options).run(model)
            path = write_result(result, output_dir)
            for note in result.notes:
                log(f"  note: {note}")
            log(f"  {result.primary_metric} = {result.score:.2f} ({result.seconds:.1f}s) -> {path}")
            typer.echo(json.dumps(result.to_dict()))
            results.append(result)
    from rich.table import Table

    table = Table(title="docembed evaluate")
    for column in ("task", "model", "metric", "score", "other metrics", "seconds"):
        table.add_column(column, justify="right" if column in ("score", "seconds") else "left")
    for r in results:
        others = ", ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in r.metrics.items()
            if k != r.primary_metric and not isinstance(v, list)
        )
        table.add_row(r.task, r.model, r.primary_metric, f"{r.score:.2f}", others, f"{r.seconds:.1f}")
    stderr_console().print(table)


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
    """Fit a corpus-statistics baseline (vocabulary, idf) on a corpus and save it as a model directory."""
    from pathlib import Path

    from docembed.errors import DocembedError, UsageError
    from docembed.models.registry import get_family
    from docembed.runtime import log

    if family not in ("tfidf", "bm25"):
        raise UsageError(f"only tfidf and bm25 are fitted this way, not {family!r}")
    target = Path(output)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise DocembedError(f"output exists: {output} (pass --overwrite to replace it)")
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
