"""docembed train-distill: the long-document student (Burian's Longformer distilled from SBERT for depth and
Paragraph Vector for breadth)."""

from __future__ import annotations

import typer

from docembed.cli import common
from docembed.cli.training_options import LoopOptions, loop_options


def register(app: typer.Typer) -> None:
    app.command("train-distill")(train_distill)


@loop_options(lr=2e-5, save_every=200)
def train_distill(
    corpus: str = typer.Argument(..., help="Training documents: .jsonl, .txt (one per line) or .tsv."),
    output: str = typer.Option(..., "--output", "-o", help="Directory for the trained student."),
    student: str = typer.Option(
        "sbert", "--student", help="A student folder (convert-long) or a source to convert (as convert-long)."
    ),
    max_length: int = typer.Option(
        None,
        "--max-length",
        min=2,
        help="Tokens per document (default: the student's; 4096 when converting).",
    ),
    attention_window: int = typer.Option(256, "--attention-window", min=2, help="Window when converting."),
    teacher: str = typer.Option("sbert,pv", "--teacher", help="sbert, pv, or sbert,pv."),
    sbert_model: str = typer.Option(
        "sbert", "--sbert-model", help="Depth teacher (sbert, sbert-mpnet, dir)."
    ),
    pv_model: str = typer.Option(
        None, "--pv-model", help="Breadth teacher: a trained PV folder (default: train-pv on CORPUS first)."
    ),
    pv_mode: str = typer.Option(
        "concat", "--pv-mode", help="When training the PV teacher: dm | dbow | concat."
    ),
    pv_dim: int = typer.Option(
        100, "--pv-dim", min=1, help="When training the PV teacher: size per sub-model."
    ),
    depth_loss: str = typer.Option("cosine", "--depth-loss", help="cosine | mse | margin."),
    margin: float = typer.Option(0.2, "--margin", help="Margin of the max-margin depth loss."),
    depth_weight: float = typer.Option(
        1.0, "--depth-weight", min=0.0, help="lambda for documents SBERT reads whole."
    ),
    depth_target: str = typer.Option(
        "whole",
        "--depth-target",
        help="whole (the thesis: depth loss only on documents SBERT reads whole) | chunks (every document, "
        "its target SBERT averaged over 256-token windows).",
    ),
    breadth_loss: str = typer.Option("soft-cca", "--breadth-loss", help="soft-cca | mse | cca (ablations)."),
    pv_projection: str = typer.Option("identity", "--pv-projection", help="identity | linear."),
    cca_dim: int = typer.Option(
        None, "--cca-dim", min=1, help="Projection size with --pv-projection linear."
    ),
    alpha: float = typer.Option(0.95, "--alpha", help="Soft CCA: decay of the running covariance."),
    decorrelation_weight: float = typer.Option(
        1.0, "--decorrelation-weight", help="Soft CCA decorrelation weight."
    ),
    batch_size: int = typer.Option(8, "--batch-size", "-b", min=1, help="Documents per micro-batch."),
    gradient_checkpointing: bool = typer.Option(
        False, "--gradient-checkpointing", help="Trade compute for memory."
    ),
    freeze_embeddings: bool = typer.Option(
        False, "--freeze-embeddings", help="Keep the word/position embeddings fixed (train the layers only)."
    ),
    pairs_from: str = typer.Option(
        None,
        "--pairs-from",
        help="Documents (.jsonl/.txt/.tsv) to also train on contrastively: each step draws --pair-batch-size "
        "of them, first half -> second half or passage -> the page around it, against in-batch negatives.",
    ),
    pair_weight: float = typer.Option(1.0, "--pair-weight", min=0.0, help="Weight of the pair loss."),
    pair_batch_size: int = typer.Option(
        16, "--pair-batch-size", min=2, help="Pair documents per step (the in-batch negatives)."
    ),
    pair_groups: bool = typer.Option(
        True,
        "--pair-groups/--no-pair-groups",
        help="Draw each step's pair documents from one group, their id up to its last '/' "
        "(docs/git-doc/..., man1/...): pages of one manual are the hardest negatives.",
    ),
    limit: int = common.LIMIT,
    max_docs: int = common.hidden_alias("--max-docs", min=1),
    cache_dir: str = typer.Option(
        None, "--cache-dir", help="Teacher vector cache (default $DOCEMBED_HOME/cache/teachers)."
    ),
    format: str = common.INPUT_FORMAT,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    loop: LoopOptions = None,
) -> None:
    """Distil a long student: L = lambda(x) L_depth(student, sbert) + L_breadth(student, pv)
    [+ pair_weight L_pairs on --pairs-from documents].

    Example: docembed train-distill corpus.jsonl -o models/student --teacher sbert,pv
    """
    import itertools
    import json
    from pathlib import Path

    common.reader(corpus, format, id_field, text_field, False)  # before torch: a wrong file fails at once
    from docembed.encoding import EmbeddingCache
    from docembed.errors import UsageError
    from docembed.models.paragraph_vector import MODES as PV_MODES
    from docembed.runtime import log, models_home, resolve_device, seed_everything, settings
    from docembed.training.distill_recipe import (
        DistillRecipe,
        DistillSettings,
        student_to_train,
        teacher_vectors,
    )
    from docembed.training.loop import is_main_process, train

    seed_everything()  # torch is imported now: seed the model's initialisation too

    teachers = {t.strip() for t in teacher.split(",") if t.strip()}
    if not teachers or teachers - {"sbert", "pv"}:
        raise UsageError(f"--teacher takes sbert, pv or sbert,pv; got {teacher!r}")
    if corpus == "-":
        raise UsageError("train-distill reads its corpus more than once: give a file, not stdin")
    # every option checked before the student loads and the teachers encode
    distill_settings = DistillSettings(
        depth_loss=depth_loss,
        margin=margin,
        depth_weight=depth_weight,
        breadth_loss=breadth_loss,
        cca_dim=cca_dim,
        pv_projection=pv_projection,
        alpha=alpha,
        decorrelation_weight=decorrelation_weight,
        batch_size=batch_size,
        gradient_checkpointing=gradient_checkpointing,
        freeze_embeddings=freeze_embeddings,
        pair_weight=pair_weight,
        pair_batch_size=pair_batch_size,
        seed=settings.seed,
    )
    if pv_mode not in PV_MODES:
        raise UsageError(f"--pv-mode is one of {', '.join(PV_MODES)}, not {pv_mode!r}")
    if depth_target not in ("whole", "chunks"):
        raise UsageError(f"--depth-target must be whole or chunks, got {depth_target!r}")
    if pv_model is not None:
        common.resolve(pv_model)
    out = Path(output)
    loop.refuse_trained_output(output)
    out.mkdir(parents=True, exist_ok=True)
    reader = common.reader(corpus, format, id_field, text_field, False)
    texts = [doc.text for doc in itertools.islice(reader, limit or max_docs)]
    if len(texts) < 2:
        raise UsageError(f"{corpus}: need at least 2 documents, found {len(texts)}")
    pair_texts = groups = None
    if pairs_from:
        if pairs_from == "-":
            raise UsageError("--pairs-from takes a file (distill.json records its path), not stdin")
        pair_docs = list(common.reader(pairs_from, format, id_field, text_field, False))
        pair_texts = [doc.text for doc in pair_docs]
        groups = [doc.id.rpartition("/")[0] if pair_groups else "" for doc in pair_docs]
        if len(pair_texts) < 2:
            raise UsageError(f"--pairs-from {pairs_from}: need at least 2 documents, found {len(pair_texts)}")
    device = resolve_device()
    model = student_to_train(student, max_length, attention_window, settings.seed)
    log(
        f"student: {model.config.source or student}, {model.config.max_length} tokens, "
        f"window {model.config.attention_window}"
    )
    vectors = teacher_vectors(
        EmbeddingCache(cache_dir or models_home() / "cache" / "teachers"),
        texts,
        teachers,
        device,
        sbert_model=sbert_model,
        depth_weight=depth_weight,
        depth_target=depth_target,
        pv_model=pv_model,
        pv_corpus=common.reader(corpus, format, id_field, text_field, False),
        pv_dir=out / "pv-teacher",
        pv_mode=pv_mode,
        pv_dim=pv_dim,
        seed=settings.seed,
    )

    recipe = DistillRecipe(
        model,
        texts,
        distill_settings,
        sbert_vectors=vectors.sbert,
        sbert_weights=vectors.sbert_weights,
        pv_vectors=vectors.pv,
        pair_texts=pair_texts,
        pair_groups=groups,
    )
    summary = train(recipe, loop.train_config(out, settings.seed, device), validate=loop.validation(model))
    if not is_main_process():
        return
    (out / "distill.json").write_text(
        json.dumps(
            {
                "teachers": sorted(teachers),
                "sbert_model": sbert_model,
                "depth_target": depth_target,
                "pv_model": vectors.pv_model or pv_model,
                "documents": len(texts),
                "corpus": corpus,
                "pairs_from": pairs_from,
                "pair_documents": len(pair_texts or ()),
                "pair_weight": pair_weight if pairs_from else None,
                "pair_batch_size": pair_batch_size if pairs_from else None,
                "pair_groups": sorted(set(groups)) if pairs_from else None,
            },
            indent=2,
        )
        + "\n"
    )
    log(
        f"trained student: {summary['steps']} steps in {summary['seconds']}s "
        f"({summary['tokens_per_s']} tokens/s) -> {out}"
    )
