"""docembed evaluate: run evaluation tasks on models."""

from __future__ import annotations

import typer

from docembed.cli import common

TASK_HELP = (
    "Task names (several allowed, or comma-separated): paraphrase-identification (alias pi), "
    "paraphrase-identification-train, mr, cr, subj, mpqa (group senteval), stsb, sick (group sts), imdb, "
    "20newsgroups (20ng; the two: group classification), 20newsgroups-retrieval (retrieval); `all` runs "
    "those but -train. Long documents: imdb-long, 20newsgroups-long, halves (group long). For choosing "
    "settings: stsb-dev, sick-dev, imdb-long-val, 20newsgroups-long-val, halves-val (group long-val)."
)


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)


def evaluate(
    tasks: list[str] = typer.Argument(None, help=TASK_HELP),
    models: list[str] = typer.Option(
        ["sbert"],
        "--model",
        "-m",
        help="Model(s) to evaluate: zoo name, saved directory, tfidf, bm25, a fusion (bm25+sbert).",
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
    output: str = typer.Option(
        "eval-results", "--output", "-o", help="Folder for one JSON result file per task and model."
    ),
    output_dir: str = common.hidden_alias("--output-dir"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace result files already in -o."),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Recompute embeddings instead of using the cache."
    ),
    qrels: str = typer.Option(
        None, "--qrels", help="TREC qrels (qid iter docid rel): evaluate --run on these judgements."
    ),
    run: str = typer.Option(
        None, "--run", help="A TREC run, or the JSONL of `search` / `rerank`, to score against --qrels."
    ),
    measures: list[str] = typer.Option(
        None, "--measure", help="ir_measures names (repeatable; default AP nDCG@10 RR R@10 R@100)."
    ),
    per_query: bool = typer.Option(False, "--per-query", help="With --qrels: each query's values too."),
) -> None:
    """Evaluate models on tasks: a table on stderr, one JSON line per result on stdout, JSON files in -o.
    With --qrels and --run: IR measures of a run (ir_measures), one JSON line on stdout.

    Example: docembed evaluate paraphrase-identification sts -m sbert
    Example: docembed evaluate --qrels qrels.txt --run run.txt
    """
    import json

    from docembed.errors import UsageError

    if qrels or run:
        if output_dir or output != "eval-results":
            raise UsageError("-o is for task results; --qrels/--run print one JSON line: redirect it")
        _evaluate_run(qrels, run, measures, per_query, tasks)
        return
    if not tasks:
        raise UsageError("give task names, or --qrels QRELS --run RUN")
    if per_query or measures:
        raise UsageError("--per-query and --measure go with --qrels and --run")

    from docembed.evaluation import TASKS, EvalOptions, load_evaluation_model, resolve_tasks, write_result
    from docembed.runtime import log, resolve_device, stderr_console

    output = output_dir or output
    names = resolve_tasks(tasks)
    options = EvalOptions(
        data_root=data_root, limit=limit, fast=fast, seed=seed, batch_size=batch_size, cache=not no_cache
    )
    from docembed.datasets import data_root as resolve_root

    resolve_root(data_root)  # fail before loading any model when the data is missing
    _check_result_names(models, output, names, overwrite)
    results = []
    for spec in models:
        model = load_evaluation_model(spec, device=resolve_device())
        _check_results_free(output, model.name, names, overwrite)
        for name in names:
            log(f"evaluating {model.name} on {name}")
            result = TASKS[name].from_data_root(options).run(model)
            path = write_result(result, output, overwrite)
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
            if k != r.primary_metric and isinstance(v, (int, float, str))  # per-item lists live in the JSON
        )
        table.add_row(r.task, r.model, r.primary_metric, f"{r.score:.2f}", others, f"{r.seconds:.1f}")
    stderr_console().print(table)


def _check_result_names(specs: list[str], output: str, names: list[str], overwrite: bool) -> None:
    """Before any model loads: each -m writes result files named by its model's name (a folder's name), so
    two models of one name would write the same files, the second over the first; and every model's files
    are checked free at once, not after the models before it have run."""
    from docembed.errors import UsageError

    by_name: dict[str, str] = {}
    for spec in specs:
        resolved = common.resolve(spec)
        name = resolved.name if resolved is not None else spec
        if name in by_name and by_name[name] != spec:
            raise UsageError(
                f"-m {by_name[name]} and -m {spec} are both named {name!r}: their results would be one file "
                "in -o; evaluate them into different -o folders, or give one folder another name"
            )
        by_name[name] = spec
        _check_results_free(output, name, names, overwrite)


def _check_results_free(output: str, model: str, names: list[str], overwrite: bool) -> None:
    """Before a model's tasks run: their result files in -o are replaced only with --overwrite."""
    from pathlib import Path

    from docembed.errors import DocembedError
    from docembed.evaluation import result_filename
    from docembed.evaluation.base import EvalResult

    if overwrite:
        return
    for name in names:
        path = Path(output) / result_filename(EvalResult(name, model, "", 0.0, {}, {}, {}, 0.0, ""))
        if path.exists():
            raise DocembedError(f"output exists: {path} (pass --overwrite to replace it)")


def _evaluate_run(qrels, run, measures, per_query, tasks) -> None:
    import json

    from docembed.errors import UsageError
    from docembed.evaluation.ir import DEFAULT_MEASURES, evaluate_run
    from docembed.runtime import log

    if not (qrels and run):
        raise UsageError("--qrels and --run go together")
    if tasks:
        raise UsageError("give task names or --qrels/--run, not both")
    result = evaluate_run(qrels, run, measures or DEFAULT_MEASURES)
    if not per_query:
        del result["per_query"]
    missing = result["queries_without_results"]
    if missing:
        log(f"note: {len(missing)} judged query(ies) have no results in {run} (scored 0): {missing[:5]}")
    log(", ".join(f"{name} = {value:.4f}" for name, value in result["measures"].items()))
    typer.echo(json.dumps(result))
