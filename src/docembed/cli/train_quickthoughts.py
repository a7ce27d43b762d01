"""docembed train-quickthoughts: train a QuickThoughts sentence encoder on documents."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options


def register(app: typer.Typer) -> None:
    app.command("train-quickthoughts")(train_quickthoughts)


# The reference trains with plain Adam (no weight decay) and clips at 5.
@loop_options(lr=5e-4, weight_decay=0.0, max_grad_norm=5.0, log_every=20)
def train_quickthoughts(
    corpus: list[str] = typer.Argument(
        ..., help="Documents: .jsonl/.txt/.tsv files, or data-set names under the data root (imdb/train)."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory for the trained model."),
    text_field: str = common.TEXT_FIELD,
    limit: int = common.LIMIT,
    max_docs: int = common.hidden_alias("--max-docs", min=1),
    context_size: int = typer.Option(1, "--context", min=1, help="Neighbours on each side that are targets."),
    hidden_size: int = typer.Option(300, "--hidden", min=1, help="GRU hidden size (per direction)."),
    bidirectional: bool = typer.Option(False, "--bidirectional/--unidirectional", help="Bidirectional GRUs."),
    vectors: str = typer.Option(
        None,
        "--vectors",
        help="word2vec/GloVe text file for the word embeddings (default: offline GloVe 6B 50d).",
    ),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Keep the word vectors fixed."),
    expand_vocabulary: bool = typer.Option(
        True,
        "--expand-vocabulary/--no-expand-vocabulary",
        help="At encode time, map words outside the vocabulary in from the base word vectors (Kiros et al.).",
    ),
    min_count: int = typer.Option(3, "--min-count", min=1, help="Words seen fewer times become <unk>."),
    max_vocab: int = typer.Option(
        50000, "--max-vocab", min=3, help="Vocabulary size cap (with <pad>, <unk>)."
    ),
    max_length: int = typer.Option(30, "--max-length", min=1, help="Tokens kept per training sentence."),
    cased: bool = typer.Option(False, "--cased", help="Keep case (GloVe 6B is lower-cased)."),
    output_mode: str = typer.Option("mean", "--output-mode", help="mean (one vector per doc) | sentences."),
    batch_size: int = typer.Option(400, "--batch-size", "-b", min=2, help="Consecutive sentences per batch."),
    data_root: str = common.DATA_ROOT,
    init: str = typer.Option(
        None,
        "--init",
        help="Continue a trained QuickThoughts model (a directory or zoo name): its vocabulary, architecture"
        " and weights are used, and the options that set them are ignored.",
    ),
    loop: LoopOptions = None,
) -> None:
    """Train QuickThoughts (Logeswaran & Lee 2018) on the sentences of CORPUS, in document order.

    Example: docembed train-quickthoughts corpus.txt -o models/qt --context 1
    """
    import json
    from pathlib import Path

    from docembed.datasets import Corpus

    limit = limit or max_docs
    texts = Corpus(corpus, text_field=text_field, limit=limit, root=data_root).check()  # before torch
    loop.refuse_trained_output(output)
    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder
    from docembed.models.word_vectors import initial_embeddings
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import is_main_process, train
    from docembed.training.quickthoughts_recipe import QuickThoughtsRecipe, SentenceCorpus

    start = _initial_model(init) if init else None
    if start is not None:
        # The architecture and vocabulary are the model's; what the run changes is said here.
        config = QuickThoughtsConfig.from_dict(start.config.to_dict())
        config.context_size, config.max_length, config.output = context_size, max_length, output_mode
        config.expand_vocabulary = expand_vocabulary
        log(f"continuing {init}: {config.vocab_size} words, {config.sentence_dim}-d sentences")
    else:
        config = QuickThoughtsConfig(
            hidden_size=hidden_size,
            bidirectional=bidirectional,
            freeze_embeddings=freeze_embeddings,
            lowercase=not cased,
            max_length=max_length,
            context_size=context_size,
            output=output_mode,
            expand_vocabulary=expand_vocabulary,
            vectors=str(Path(vectors).expanduser().resolve()) if vectors else None,
        )
    sentences = SentenceCorpus.build(
        texts,
        min_count,
        max_vocab,
        max_length,
        lowercase=config.lowercase,
        vocabulary=start.vocabulary if start is not None else None,
    )
    unk_rate = float((sentences.tokens == sentences.vocabulary.unk_id).mean())
    log(
        f"corpus: {sentences.num_documents} documents, {sentences.num_sentences} sentences, "
        f"{len(sentences.tokens)} tokens; vocabulary {len(sentences.vocabulary)} words ({unk_rate:.1%} <unk>)"
    )
    if start is None:
        matrix, coverage = initial_embeddings(sentences.vocabulary, None, vectors, seed=settings.seed)
        log(f"word vectors: {coverage:.1%} of the vocabulary found in {vectors or 'GloVe 6B 50d (offline)'}")
        config.vocab_size = len(sentences.vocabulary)
        config.embedding_dim = int(matrix.shape[1])
    else:
        matrix, coverage = None, None
    seed_everything()  # the GRU initialisation, made before the loop seeds anything
    recipe = QuickThoughtsRecipe(
        sentences, config, batch_size=batch_size, seed=settings.seed, embeddings=matrix
    )
    if start is not None:
        recipe.network.load_state_dict(start.module.state_dict())
    train_config = loop.train_config(output, settings.seed, settings.device)
    encoder = QuickThoughtsEncoder(config, vocabulary=sentences.vocabulary, module=recipe.network)
    summary = train(recipe, train_config, validate=loop.validation(encoder))
    if not is_main_process():  # rank 0 alone writes and reports under torchrun
        return
    summary["corpus"] = {
        "sources": corpus,
        "max_docs": limit,
        "documents": sentences.num_documents,
        "sentences": sentences.num_sentences,
        "tokens": int(len(sentences.tokens)),
        "vocabulary": len(sentences.vocabulary),
        "unk_rate": round(unk_rate, 4),
        "glove_coverage": round(coverage, 4) if coverage is not None else None,
        "init": init,
    }
    (Path(output) / "train_summary.json").write_text(json.dumps(summary, indent=2))
    last = summary.get("last", {})
    loss, accuracy = last.get("loss", float("nan")), last.get("neighbour_acc", float("nan"))
    log(
        f"trained {summary['steps']} steps in {summary['seconds']} s "
        f"({summary['sentences_per_s']} sentences/s), loss {loss:.4f}, neighbour acc {accuracy:.3f}"
        f" -> {output}"
    )


def _initial_model(spec: str):
    """The QuickThoughts model --init names, or a usage error."""
    from docembed.errors import UsageError
    from docembed.models.registry import load_model

    model = load_model(spec)
    if model.family != "quickthoughts":
        raise UsageError(f"--init needs a QuickThoughts model; {spec} is a {model.family} model")
    return model
