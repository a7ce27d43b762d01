"""docembed train-quickthoughts: train a QuickThoughts sentence encoder on documents."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("train-quickthoughts")(train_quickthoughts)


def train_quickthoughts(
    corpus: list[str] = typer.Argument(
        ..., help="Documents: .jsonl/.txt/.tsv files, or data-set names under the data root (imdb/train)."
    ),
    output: str = typer.Option(..., "--output", "-o", help="Directory for the trained model."),
    text_field: str = common.TEXT_FIELD,
    max_docs: int = typer.Option(
        None, "--max-docs", min=1, help="Read at most this many documents per corpus."
    ),
    context_size: int = typer.Option(1, "--context", min=1, help="Neighbours on each side that are targets."),
    hidden_size: int = typer.Option(300, "--hidden", min=1, help="GRU hidden size (per direction)."),
    bidirectional: bool = typer.Option(False, "--bidirectional/--unidirectional", help="Bidirectional GRUs."),
    vectors: str = typer.Option(
        None,
        "--vectors",
        help="word2vec/GloVe text file for the word embeddings (default: offline GloVe 6B 50d).",
    ),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Keep the word vectors fixed."),
    min_count: int = typer.Option(3, "--min-count", min=1, help="Words seen fewer times become <unk>."),
    max_vocab: int = typer.Option(
        50000, "--max-vocab", min=3, help="Vocabulary size cap (with <pad>, <unk>)."
    ),
    max_length: int = typer.Option(30, "--max-length", min=1, help="Tokens kept per training sentence."),
    cased: bool = typer.Option(False, "--cased", help="Keep case (GloVe 6B is lower-cased)."),
    output_mode: str = typer.Option("mean", "--output-mode", help="mean (one vector per doc) | sentences."),
    batch_size: int = typer.Option(400, "--batch-size", "-b", min=2, help="Consecutive sentences per batch."),
    epochs: int = typer.Option(1, "--epochs", min=1),
    max_steps: int = typer.Option(None, "--max-steps", min=1),
    time_budget: float = typer.Option(None, "--time-budget", help="Stop (and save) after this many seconds."),
    lr: float = typer.Option(5e-4, "--lr"),
    max_grad_norm: float = typer.Option(5.0, "--max-grad-norm"),
    log_every: int = typer.Option(20, "--log-every", min=1),
    resume: bool = typer.Option(False, "--resume", help="Continue from <output>/checkpoint."),
    data_root: str = common.DATA_ROOT,
) -> None:
    """Train QuickThoughts (Logeswaran & Lee 2018) on the sentences of CORPUS, in document order."""
    import itertools
    import json
    from pathlib import Path

    from docembed.datasets import documents
    from docembed.io.readers import DocumentReader
    from docembed.models.quickthoughts import QuickThoughtsConfig
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import TrainConfig, is_main_process, train
    from docembed.training.quickthoughts_recipe import QuickThoughtsRecipe, SentenceCorpus, initial_embeddings

    def texts():
        for source in corpus:
            reader = (
                DocumentReader(source, None, text_field=text_field)
                if Path(source).exists() or source == "-"
                else documents(source, data_root, text_field=text_field)
            )
            for doc in itertools.islice(reader, max_docs):
                yield doc.text

    config = QuickThoughtsConfig(
        hidden_size=hidden_size,
        bidirectional=bidirectional,
        freeze_embeddings=freeze_embeddings,
        lowercase=not cased,
        max_length=max_length,
        context_size=context_size,
        output=output_mode,
    )
    sentences = SentenceCorpus.build(texts(), min_count, max_vocab, max_length, lowercase=not cased)
    unk_rate = float((sentences.tokens == sentences.vocabulary.unk_id).mean())
    log(
        f"corpus: {sentences.num_documents} documents, {sentences.num_sentences} sentences, "
        f"{len(sentences.tokens)} tokens; vocabulary {len(sentences.vocabulary)} words ({unk_rate:.1%} <unk>)"
    )
    matrix, coverage = initial_embeddings(sentences.vocabulary, None, vectors, seed=settings.seed)
    log(f"word vectors: {coverage:.1%} of the vocabulary found in {vectors or 'GloVe 6B 50d (offline)'}")
    seed_everything()  # the GRU initialisation, made before the loop seeds anything
    config.vocab_size = len(sentences.vocabulary)
    config.embedding_dim = int(matrix.shape[1])
    recipe = QuickThoughtsRecipe(
        sentences, config, batch_size=batch_size, seed=settings.seed, embeddings=matrix
    )
    train_config = TrainConfig(
        output_dir=output,
        epochs=epochs,
        max_steps=max_steps,
        lr=lr,
        weight_decay=0.0,  # the reference trains with plain Adam
        max_grad_norm=max_grad_norm,
        log_every=log_every,
        resume=resume,
        seed=settings.seed,
        device=settings.device,
        time_budget_s=time_budget,
    )
    summary = train(recipe, train_config)
    if not is_main_process():  # rank 0 alone writes and reports under torchrun
        return
    summary["corpus"] = {
        "sources": corpus,
        "max_docs": max_docs,
        "documents": sentences.num_documents,
        "sentences": sentences.num_sentences,
        "tokens": int(len(sentences.tokens)),
        "vocabulary": len(sentences.vocabulary),
        "unk_rate": round(unk_rate, 4),
        "glove_coverage": round(coverage, 4),
    }
    (Path(output) / "train_summary.json").write_text(json.dumps(summary, indent=2))
    last = summary.get("last", {})
    loss, accuracy = last.get("loss", float("nan")), last.get("neighbour_acc", float("nan"))
    log(
        f"trained {summary['steps']} steps in {summary['seconds']} s "
        f"({summary['sentences_per_s']} sentences/s), loss {loss:.4f}, neighbour acc {accuracy:.3f}"
        f" -> {output}"
    )
