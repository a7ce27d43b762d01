"""docembed train-nugget: train a NUGGET encoder (training/nugget_recipe.py)."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options


def register(app: typer.Typer) -> None:
    app.command("train-nugget")(train_nugget)


@loop_options(lr=5e-5)
def train_nugget(
    corpus: str = typer.Argument(
        ..., help="ae: documents (.jsonl/.txt/.tsv); mt, sim: JSON Lines source/target pairs."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", help="Folder for the trained model, checkpoints and logs."
    ),
    objective: str = typer.Option(
        "ae",
        "--objective",
        help="ae (autoencode with token deletion) | mt (decode the pair's target) | "
        "sim (soft MaxSim between paraphrases, in-batch negatives).",
    ),
    noise: float = typer.Option(0.1, "--noise", min=0.0, max=0.9, help="ae: token deletion rate."),
    source_field: str = typer.Option("source", "--source-field", help="mt: JSON field of the source text."),
    target_field: str = typer.Option("target", "--target-field", help="mt: JSON field of the target text."),
    text_field: str = common.TEXT_FIELD,
    format: str = common.INPUT_FORMAT,
    max_docs: int = typer.Option(
        None, "--limit", "--max-docs", min=1, help="Use only the first N documents / pairs."
    ),
    max_length: int = typer.Option(128, "--max-length", min=8, help="Tokens per document (both sides)."),
    backbone: str = typer.Option(
        "minilm", "--backbone", help="minilm (offline BERT2BERT), or a BART/mBART id."
    ),
    kind: str = typer.Option(None, "--kind", help="bert | bart (default: bert for minilm, else bart)."),
    decoder_layers: int = typer.Option(None, "--decoder-layers", min=1, help="BERT2BERT decoder depth."),
    ratio: float = typer.Option(
        0.1, "--ratio", min=0.0, max=1.0, help="Compression ratio r (k = ceil(r n))."
    ),
    train_ratio: float = typer.Option(
        None,
        "--train-ratio",
        min=0.0,
        max=1.0,
        help="Select this r while training (default: --ratio); the model still encodes at --ratio. "
        "Larger lets the residual reach the tokens just below the cut.",
    ),
    scorer_layer: int = typer.Option(
        3, "--scorer-layer", min=0, help="l: scorer input; layers below freeze."
    ),
    no_feedback: bool = typer.Option(False, "--no-feedback", help="Ablation: no nugget type embeddings."),
    residual: str = typer.Option("raw", "--residual", help="raw | straight-through | none."),
    selector: str = typer.Option("scorer", "--selector", help="scorer | chunk | idf (rules)."),
    freeze: str = typer.Option(
        "bottom",
        "--freeze",
        help="bottom (layers below l) | encoder (the whole encoder) | encoder+value (and W_V at the "
        "identity: only the selection learns).",
    ),
    anchor_weight: float = typer.Option(
        0.0, "--anchor-weight", min=0.0, help="L2 pull of the trainable encoder weights to the warm start."
    ),
    idf_prior: float = typer.Option(
        0.0, "--idf-prior", help="Add this times the token's IDF (fitted on the training text) to its score."
    ),
    aggregate: str = typer.Option(
        "none",
        "--aggregate",
        help="none (a nugget is its token's vector) | assign (every token joins its most similar nugget, "
        "which becomes their mean), while training and in the saved model.",
    ),
    attention_temperature: float = typer.Option(
        0.05, "--attention-temperature", min=1e-4, help="sim: temperature of the soft MaxSim."
    ),
    temperature: float = typer.Option(0.05, "--temperature", min=1e-4, help="sim: InfoNCE temperature."),
    negatives_per_pair: int = typer.Option(
        3,
        "--negatives-per-pair",
        min=0,
        help="sim: hard negatives drawn per pair from its JSON 'negatives' list (a list of texts), if any.",
    ),
    batch_size: int = typer.Option(16, "--batch-size", "-b", min=1),
    loop: LoopOptions = None,
) -> None:
    """Train NUGGET (Qin & Van Durme 2023). Runs under torchrun unchanged.

    Example: docembed train-nugget pairs.jsonl -o models/nugget --objective mt --ratio 0.1
    """
    from pathlib import Path

    from docembed.errors import UsageError

    loop.refuse_trained_output(output)
    if objective == "ae":  # before torch: a wrong file or field fails at once
        common.reader(corpus, format, "id", text_field, False)
    elif objective in ("mt", "sim") and (first := common.check_jsonl_fields(corpus, ())) is not None:
        _pair(first[1], corpus, first[0], source_field, target_field)
    from docembed.models.nugget import NuggetConfig, NuggetEncoder
    from docembed.runtime import log, seed_everything, settings
    from docembed.training.loop import is_main_process, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    seed_everything()  # torch is imported now: seed the model's initialisation too

    if objective not in ("ae", "mt", "sim"):
        raise UsageError(f"--objective must be ae, mt or sim, got {objective!r}")
    if ratio <= 0:
        raise UsageError("--ratio must be > 0")
    sources, targets, negatives = _read_corpus(
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
        freeze=freeze,
        idf_prior=idf_prior,
        aggregate=aggregate,
        max_length=max_length,  # it encodes what it was trained on
    )
    encoder = NuggetEncoder.from_base(config, seed=settings.seed)
    encoder.name = Path(output).name
    if config.uses_idf:  # the IDF table ships with the model: fitted on the training text, once
        encoder.fit_idf(list(dict.fromkeys(sources + (targets or []))))
    examples = tokenize_examples(
        encoder, sources, targets, max_length, negatives if objective == "sim" else None
    )
    with_negatives = sum(bool(e.negatives) for e in examples)
    log(
        f"train-nugget: {len(examples)} examples ({objective}), {sum(len(e.source) for e in examples)} tokens"
        + (f", {with_negatives} with hard negatives" if with_negatives else "")
    )
    recipe = NuggetRecipe(
        encoder,
        examples,
        objective,
        noise,
        batch_size,
        seed=settings.seed,
        anchor_weight=anchor_weight,
        attention_temperature=attention_temperature,
        temperature=temperature,
        negatives_per_pair=negatives_per_pair,
        train_ratio=train_ratio,
    )
    summary = train(
        recipe,
        loop.train_config(output, settings.seed, settings.device),
        validate=loop.validation(encoder),
    )
    if not is_main_process():  # rank 0 alone reports under torchrun
        return
    log(
        f"trained {summary['steps']} steps in {summary['seconds']} s ({summary['tokens_per_s']} tokens/s), "
        f"last loss {summary['last'].get('loss', float('nan')):.4f} -> {output}"
    )


def _read_corpus(path, objective, format, text_field, source_field, target_field, max_docs):
    from docembed.errors import DocembedError
    from docembed.io.readers import iter_jsonl_lines

    if objective == "ae":
        documents = common.reader(path, format, "id", text_field, False)
        texts = []
        for doc in documents:
            if max_docs and len(texts) >= max_docs:
                break
            texts.append(doc.text)
        return texts, None, None
    sources, targets, negatives = [], [], []
    for number, record in iter_jsonl_lines(path):
        if max_docs and len(sources) >= max_docs:
            break
        source, target, given = _pair(record, path, number, source_field, target_field)
        sources.append(source)
        targets.append(target)
        negatives.append(given)
    if not sources:
        raise DocembedError(f"{path}: no pairs")
    return sources, targets, negatives


def _pair(record: dict, path: str, number: int, source_field: str, target_field: str):
    """(source, target, negatives) of one mt/sim training record, or an InputFormatError naming its line."""
    from docembed.errors import InputFormatError

    if source_field not in record or target_field not in record:
        raise InputFormatError(path, number, f"needs fields {source_field!r} and {target_field!r}")
    source, target = record[source_field], record[target_field]
    if not isinstance(source, str) or not isinstance(target, str):
        # str() would silently train on the text "5" or "None"
        raise InputFormatError(path, number, f"{source_field!r} and {target_field!r} must be strings")
    given = record.get("negatives", [])
    if not isinstance(given, list) or not all(isinstance(text, str) for text in given):
        raise InputFormatError(path, number, "'negatives' must be a list of texts")
    return source, target, given
