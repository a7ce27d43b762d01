"""docembed train-retriever: fine-tune a sentence-transformers model to find the part of a long document a
query is about (passage scoring), contrastively, on unlabelled documents."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options
from docembed.training.retrieval_pairs import RETRIEVER_LOOP, RetrieverTraining

DEFAULTS = RetrieverTraining()


def register(app: typer.Typer) -> None:
    app.command("train-retriever")(train_retriever)


# The defaults and the reasons for them: training/retrieval_pairs.py (RETRIEVER_LOOP, RetrieverTraining).
@loop_options(own_validation=True, **RETRIEVER_LOOP)
def train_retriever(
    corpus: str = typer.Argument(
        ...,
        help='Training documents, JSON Lines: "text", optionally "group" (default: "id" up to its last "/"; '
        'a step\'s examples share a group) and "summary" (a title or description of the document).',
    ),
    output: str = typer.Option(..., "--output", "-o", help="Where the trained model is written."),
    val: str = typer.Option(
        None, "--val", help="Validation documents (same format): validate on them and keep the best weights."
    ),
    text_field: str = common.TEXT_FIELD,
    limit: int = typer.Option(None, "--limit", min=2, help="Train on the first N documents only."),
    base: str = typer.Option("all-MiniLM-L6-v2", "--base", help="The sentence-transformers model to tune."),
    kinds: str = typer.Option(
        "part,next,lead,summary",
        "--kinds",
        help="Views to train on: part (a passage -> the text around it), next (a window -> the next one), "
        "lead (an opening -> what follows), summary (the summary field -> the opening), snippet (a passage's "
        "first 30 words -> the text around it; not in the default).",
    ),
    batch_size: int = typer.Option(
        DEFAULTS.batch_size, "--batch-size", "-b", min=2, help="Examples per step."
    ),
    train_layers: int = typer.Option(
        DEFAULTS.train_layers, "--train-layers", min=1, help="Top transformer layers that train."
    ),
    per_document: int = typer.Option(
        DEFAULTS.per_document, "--per-document", min=1, help="Examples per document."
    ),
    window_words: int = typer.Option(
        DEFAULTS.window_words, "--window-words", min=10, help="Words per window."
    ),
    passage_temperature: float = typer.Option(
        0.0,
        "--passage-temperature",
        help="How the saved model pools a document's windows when it scores (0: the best window; more: "
        "smoother); recorded in its config, not used in training.",
    ),
    hard_negatives: bool = typer.Option(
        DEFAULTS.hard_negatives,
        "--hard-negatives/--no-hard-negatives",
        help="Mine a BM25 negative per example.",
    ),
    loop: LoopOptions = None,
) -> None:
    """Fine-tune BASE on views of CORPUS and save it to OUTPUT (use it with --model OUTPUT).

    Example: docembed train-retriever docs.jsonl --val val.jsonl -o models/retriever --time-budget 3600
    """

    from docembed.errors import UsageError
    from docembed.training.retrieval_pairs import KINDS

    for path in (corpus, val):  # before torch: a wrong file fails at once
        if path is not None:
            if path == "-":
                raise UsageError(f"{path}: give a JSON Lines file (it is read more than once)")
            common.check_jsonl_fields(path, (text_field,))  # a missing file: "not found", as elsewhere
    if loop.eval_tasks:
        raise UsageError("train-retriever validates on its own documents: give --val, not --eval-task")
    if loop.eval_every and not val:
        raise UsageError("--eval-every needs validation documents: give --val")
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise UsageError(f"--kinds takes {', '.join(KINDS)}; got {kinds!r}")
    loop.refuse_trained_output(output)

    from docembed.models.sbert import SBertConfig
    from docembed.runtime import log, resolve_device, settings
    from docembed.training.retrieval_pairs import read_documents
    from docembed.training.retriever_recipe import fit_retriever

    config = SBertConfig(model_name_or_path=base, output="windows", passage_temperature=passage_temperature)
    documents = read_documents(corpus, text_field)[:limit]
    held_out = read_documents(val, text_field) if val else []
    training = RetrieverTraining(
        batch_size=batch_size,
        train_layers=train_layers,
        per_document=per_document,
        window_words=window_words,
        hard_negatives=hard_negatives,
    )
    loop_config = loop.train_config(output, settings.seed, resolve_device())
    fit_retriever(documents, config, output, training, loop_config, held_out, chosen)
    log(f"saved the retriever -> {output}")
