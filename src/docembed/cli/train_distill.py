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
    """Distil a long student: L = lambda(x) L_depth(student, sbert) + L_breadth(student, pv).

    Example: docembed train-distill corpus.jsonl -o models/student --teacher sbert,pv
    """
    import itertools
    import json
    from pathlib import Path

    from docembed.encoding import EmbeddingCache
    from docembed.errors import UsageError
    from docembed.models.registry import models_home
    from docembed.models.student import StudentEncoder, convert_long
    from docembed.runtime import log, resolve_device, seed_everything, settings
    from docembed.training.distill_recipe import DistillRecipe, DistillSettings
    from docembed.training.loop import is_main_process, main_process_first, train

    seed_everything()  # torch is imported now: seed the model's initialisation too

    teachers = {t.strip() for t in teacher.split(",") if t.strip()}
    if not teachers or teachers - {"sbert", "pv"}:
        raise UsageError(f"--teacher takes sbert, pv or sbert,pv; got {teacher!r}")
    if corpus == "-":
        raise UsageError("train-distill reads its corpus more than once: give a file, not stdin")
    out = Path(output)
    if (out / "config.json").exists() and not loop.resume:
        # A finished student is someone's result: don't train over it.
        raise UsageError(f"{output} already holds a model (use another -o, or --resume)")
    out.mkdir(parents=True, exist_ok=True)
    reader = common.reader(corpus, format, id_field, text_field, False)
    texts = [doc.text for doc in itertools.islice(reader, limit or max_docs)]
    if len(texts) < 2:
        raise UsageError(f"{corpus}: need at least 2 documents, found {len(texts)}")
    device = resolve_device()

    if Path(student).is_dir() and (Path(student) / "config.json").exists():
        model = StudentEncoder.load(student)
        if max_length:
            model.config.max_length = min(max_length, model.config.max_length)
    else:
        model = convert_long(student, max_length or 4096, attention_window)
    log(
        f"student: {model.config.source or student}, {model.config.max_length} tokens, "
        f"window {model.config.attention_window}"
    )

    cache = EmbeddingCache(cache_dir or models_home() / "cache" / "teachers")
    sbert_vectors = sbert_weights = pv_vectors = None
    with main_process_first(device):  # under torchrun, rank 0 fills the cache and the others read it
        if "sbert" in teachers:
            sbert_vectors, sbert_weights = _sbert_teacher(
                cache, sbert_model, texts, depth_weight, device, depth_target
            )
        if "pv" in teachers:
            pv_model, pv_vectors = _pv_teacher(
                cache,
                pv_model,
                texts,
                out,
                common.reader(corpus, format, id_field, text_field, False),
                pv_mode,
                pv_dim,
            )

    recipe = DistillRecipe(
        model,
        texts,
        DistillSettings(
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
            seed=settings.seed,
        ),
        sbert_vectors=sbert_vectors,
        sbert_weights=sbert_weights,
        pv_vectors=pv_vectors,
    )
    summary = train(recipe, loop.train_config(out, settings.seed, device))
    if not is_main_process():
        return
    (out / "distill.json").write_text(
        json.dumps(
            {
                "teachers": sorted(teachers),
                "sbert_model": sbert_model,
                "depth_target": depth_target,
                "pv_model": pv_model,
                "documents": len(texts),
                "corpus": corpus,
            },
            indent=2,
        )
        + "\n"
    )
    log(
        f"trained student: {summary['steps']} steps in {summary['seconds']}s "
        f"({summary['tokens_per_s']} tokens/s) -> {out}"
    )


def _sbert_teacher(
    cache, sbert_model: str, texts: list[str], depth_weight: float, device: str, depth_target: str = "whole"
):
    """The depth teacher's vectors of `texts` (cached) and each text's depth-loss weight lambda(x)."""
    import numpy as np

    from docembed.errors import UsageError
    from docembed.models.registry import load_model
    from docembed.runtime import log
    from docembed.training.distill_recipe import depth_weights

    sbert = load_model(sbert_model, device=device)
    if not hasattr(sbert, "tokenizer") or not hasattr(sbert, "max_seq_length"):
        raise UsageError(f"--sbert-model {sbert_model!r} is not an SBERT model")
    if depth_target not in ("whole", "chunks"):
        raise UsageError(f"--depth-target must be whole or chunks, got {depth_target!r}")
    if depth_target == "chunks":
        # a target for every document: the teacher averaged over consecutive windows it reads whole
        sbert.config.output = "chunks"
        vectors = cache.vectors(sbert, texts, label=f"sbert-chunks teacher ({sbert.name})")
        log(
            f"depth loss applies to all {len(texts)} documents (targets: {sbert.name} over 256-token windows)"
        )
        return vectors, np.full(len(texts), depth_weight, dtype=np.float32)
    vectors = cache.vectors(sbert, texts, label=f"sbert teacher ({sbert.name})")
    weights = depth_weights(sbert, texts, depth_weight)
    log(
        f"depth loss applies to {int((weights > 0).sum())} of {len(texts)} documents "
        f"(<= {sbert.max_seq_length} {sbert.name} tokens)"
    )
    return vectors, weights


def _pv_teacher(cache, pv_model: str | None, texts: list[str], out, documents, mode: str, dim: int):
    """The breadth teacher's path and its vectors of `texts` (cached). Without --pv-model, a PV teacher is
    first trained on `documents` (the whole corpus) into OUTPUT/pv-teacher (kept, so a resumed run reuses
    it)."""
    from pathlib import Path

    from docembed.cli.train_pv import train_and_save
    from docembed.models.paragraph_vector import PVConfig
    from docembed.models.registry import load_model
    from docembed.runtime import log, settings

    if pv_model is None:
        pv_model = str(out / "pv-teacher")
        if not (Path(pv_model) / "config.json").exists():
            log(f"no --pv-model: training a PV teacher ({mode}, dim {dim}) on {documents.name} -> {pv_model}")
            # train-pv's defaults, one worker thread so the teacher is reproducible
            config = PVConfig(mode=mode, vector_size=dim, workers=1, seed=settings.seed)
            train_and_save(documents, config, pv_model)
    pv = load_model(pv_model)
    return pv_model, cache.vectors(pv, texts, label=f"pv teacher ({pv.name})")
