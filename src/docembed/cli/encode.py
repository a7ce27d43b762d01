"""docembed encode: the main job."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("encode")(encode)


def encode(
    input: str = typer.Argument(
        ..., help="Documents: .jsonl, .txt (one per line), .tsv (id<TAB>text), .parquet, or - for stdin."
    ),
    output: str = typer.Option(
        "-",
        "--output",
        "-o",
        help="Output file (.npy .npz .safetensors .parquet .jsonl); - is JSONL on stdout. "
        "With --engine ray: a directory of Parquet shards, or a Lance collection (DIR.lance or "
        "--output-format lance) that search and index commands open as it is.",
    ),
    model: str = common.MODEL,
    format: str = common.INPUT_FORMAT,
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    skip_invalid: bool = common.SKIP_INVALID,
    shard: str = typer.Option(
        None, "--shard", help="I/N: encode only the I-th (0-based) of N contiguous slices."
    ),
    batch_size: int = common.BATCH_SIZE,
    output_format: str = typer.Option(
        None,
        "--output-format",
        help="Override the format implied by -o. --engine ray: parquet (shards, the default) | lance (a "
        "Lance collection, as `index build --store lance` writes, committed once by the driver).",
    ),
    storage: str = typer.Option(
        "float32",
        "--storage",
        help="npy/npz/safetensors: how vectors are stored, float32 | float16 (half the bytes) | int8 (a "
        "quarter: one byte per value and a scale per vector). Read back as float32 by every command.",
    ),
    overwrite: bool = common.OVERWRITE,
    ratio: float = typer.Option(None, "--ratio", help="NUGGET: compression ratio r at encode time."),
    selector: str = typer.Option(
        None,
        "--selector",
        help="NUGGET: which token vectors it keeps: scorer (learned, the default) or a rule: idf (the k of "
        "highest IDF), prune (all but the 1,000 most frequent vocabulary entries; k varies), pool "
        "(hierarchical pooling into k clusters), chunk. See docs/nugget_baselines.md.",
    ),
    max_vectors: int = typer.Option(
        None,
        "--max-vectors",
        min=1,
        help="NUGGET: at most N vectors per 256-token window (with --ratio 1: a fixed N, as ConstBERT's 32).",
    ),
    long: str = typer.Option(
        None,
        "--long",
        help="sbert, nugget, student: a document longer than the model reads is cut (truncate) or read whole "
        "in windows (windows); student also late-chunks (one vector per 256 tokens of its long passes, "
        "multi-vector). Default: the model's (docembed models; encode reports what it did not read).",
    ),
    max_length: int = typer.Option(
        None,
        "--max-length",
        help="student: tokens one pass reads (default 2,048; more, e.g. 8192, tiles its positions as it was "
        "built; the sliding window keeps time and memory linear).",
    ),
    passage_temperature: float = typer.Option(
        None,
        "--passage-temperature",
        min=0.0,
        max=10.0,
        help="sbert-windows, student --long late-chunks: how a document's passages pool when it is scored "
        "(0: the best passage; larger: smoother, towards their mean); nugget: score by windows, its nuggets "
        "grouped by the window that read them, pooled so; recorded for search and indexes.",
    ),
    long_queries: str = typer.Option(
        None,
        "--long-queries",
        help="sbert-windows, student --long late-chunks: how a long query (6 passages or more, a half) "
        "is scored, passages (each of its passages) | whole (the two texts' passage means, sbert-windows' "
        "default, chosen on the long-document val tasks); recorded for search and indexes.",
    ),
    backend: str = typer.Option(
        None,
        "--backend",
        help="sbert, nugget, student: engine on the CPU, auto | torch | openvino | onnx (default: auto).",
    ),
    precision: str = typer.Option(
        None,
        "--precision",
        help="sbert, nugget, student: the arithmetic the model runs in, fp32 | int8 (int8: 2.4-5x docs/s "
        "with OpenVINO for sbert, STS-B within 0.1; nugget: its encoder, selection unchanged; student: its "
        "Longformer, 1.7x, see README; needs the openvino or onnx extra; converted once, cached "
        "under $DOCEMBED_HOME/inference). The embeddings stay float32: for int8/binary embeddings see "
        "docembed.quantize_embeddings.",
    ),
    workers: int = typer.Option(
        None,
        "--workers",
        min=1,
        help="Encode in N local processes, each loading the model once and running --threads threads "
        "(1 each by default): one output in input order, the same bytes for every N. pv: its own "
        "inference processes (default: the model's).",
    ),
    threads: int = typer.Option(
        None, "--threads", min=1, help="Torch threads per process (default: 1 with --workers, else torch's)."
    ),
    engine: str = typer.Option(
        "local",
        "--engine",
        help="local (this process) | ray (Ray Data actors; -o is a directory of Parquet shards, or with "
        "--output-format lance a Lance collection the actors write).",
    ),
    store_text: bool = typer.Option(
        False,
        "--store-text",
        help="Ray with a Lance output: keep each document's text in the collection (full-text index; "
        "search --hybrid).",
    ),
    address: str = typer.Option(None, "--address", help="Ray: cluster address (default: a local instance)."),
    num_workers: int = typer.Option(
        None, "--num-workers", min=1, help="Ray: encoder actors, each loading the model once (default 1)."
    ),
    cpus_per_worker: float = typer.Option(
        None, "--cpus-per-worker", min=0.01, help="Ray: CPUs (and torch threads) per actor (default 1)."
    ),
    gpus_per_worker: float = typer.Option(
        None, "--gpus-per-worker", min=0, help="Ray: GPUs per actor; fractions share a GPU (default 0)."
    ),
    rows_per_shard: int = typer.Option(
        None, "--rows-per-shard", min=1, help="Ray: input rows per output shard (default 10000)."
    ),
    fit: bool = typer.Option(
        False, "--fit", help="pv/setenc/tfidf/bm25: fit on INPUT first, keep the model in OUTPUT.model/."
    ),
    reuse: str = typer.Option(
        None,
        "--reuse",
        help="An earlier output of the same model (-o OUTPUT itself is fine): only documents whose id is new "
        "or whose text changed (a hash kept in its metadata) are encoded; the rest are copied. The output is "
        "the one a full encode writes. Refused for another model or other settings.",
    ),
) -> None:
    """Embed every document of INPUT (one output row per input row, empty texts included).

    INPUT may be Parquet (a file, a directory of files, or any URI pyarrow opens) with either engine. With
    --engine ray, -o DIR receives part-NNNNN.parquet shards plus manifest.json; a re-run skips the shards
    written. With --engine ray -o DIR.lance (or --output-format lance), the actors write a Lance collection,
    committed at once: `docembed search DIR.lance` and `index add/remove/update` work on it.

    Example: docembed encode docs.jsonl -m glove-avg -o docs.npy
    """
    from docembed.errors import UsageError

    if long_queries is not None:
        from docembed.models.base import check_long_queries

        check_long_queries(long_queries)
    resolved = None if fit else common.resolve(model)  # a model that is nothing fails now (--fit makes it)
    _check_server_use(fit, workers, engine, ratio, long, backend, precision, selector, max_vectors,
                      max_length, passage_temperature, long_queries)  # fmt: skip
    ray_flags = {
        "address": address,
        "num_workers": num_workers,
        "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker,
        "rows_per_shard": rows_per_shard,
    }
    if engine == "ray":
        if shard:
            raise UsageError("--shard is for the local engine; --engine ray shards by --rows-per-shard")
        if workers is not None or threads is not None:
            raise UsageError(
                "--workers/--threads are for the local engine; with --engine ray use --num-workers and "
                "--cpus-per-worker"
            )
        local_only = (backend, precision, selector, max_vectors, max_length, passage_temperature,
                      long_queries)  # fmt: skip
        if any(v is not None for v in local_only) or storage != "float32":
            raise UsageError(
                "--backend/--precision/--selector/--max-vectors/--max-length/--passage-temperature/"
                "--long-queries/--storage are for the local engine"
            )
        if output_format not in (None, "parquet", "lance"):
            raise UsageError(
                "--engine ray writes Parquet shards only, or a Lance collection (--output-format lance)"
            )
        if reuse:
            raise UsageError("--reuse is for the local engine (a re-run of --engine ray skips done shards)")
        lance_output = output_format == "lance" or str(output).endswith(".lance")
        if lance_output and resolved is not None and resolved.scores_by_token_windows():
            raise UsageError(
                f"{model} scores its nuggets by windows of their token positions, which a Lance collection "
                "does not keep: write Parquet shards (then `index build --store faiss`), or use nugget"
            )
        from docembed.engines.ray_engine import RayOptions, encode_with_ray

        encode_with_ray(
            input,
            output,
            model,
            format=format,
            id_field=id_field,
            text_field=text_field,
            skip_invalid=skip_invalid,
            batch_size=batch_size,
            ratio=ratio,
            long_documents=long,
            overwrite=overwrite,
            options=RayOptions(**{k: v for k, v in ray_flags.items() if v is not None}),
            output_format=output_format,
            store_text=store_text,
        )
        return
    if engine != "local":
        raise typer.BadParameter(f"expected local or ray, got {engine!r}", param_hint="--engine")
    given = [name for name, value in ray_flags.items() if value is not None]
    given += ["store_text"] if store_text else []
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --engine ray")

    from docembed.encoding import HashedDocuments, coverage_of, encode_documents, reuse_metadata
    from docembed.io.embeddings import check_output_path, check_storage, save_embeddings
    from docembed.io.outputs import check_not_inside
    from docembed.models.base import EncodeSettings
    from docembed.runtime import log

    if reuse and output != "-" and _same_file(reuse, output):
        overwrite = True  # `--reuse docs.npy -o docs.npy` updates the file it reads: that is the point
    check_output_path(output, overwrite, inputs=[input])
    check_not_inside(output, [model, reuse])  # a model folder's or a --reuse shard folder's own files
    check_storage(output, output_format, storage)
    if reuse and (fit or workers is not None):
        raise UsageError("--reuse goes without --fit (a refitted model is another model) and --workers")
    if fit:  # the corpus-fitted families in one step, with their commands' default settings
        model = _fit_beside(model, input, output, format, id_field, text_field, skip_invalid, overwrite)
    documents = common.reader(input, format, id_field, text_field, skip_invalid, shard)
    if workers is not None or threads is not None:  # before the model: a runner takes torch's threads then
        _set_torch_threads(threads or 1)
    settings = EncodeSettings(
        ratio, long, backend, precision, selector, max_vectors, max_length, passage_temperature, long_queries
    )
    settings.check()
    reused = _reused_set(reuse, storage) if reuse else None
    encoder = settings.apply(common.load(model))
    in_processes = workers is not None and not encoder.supports("workers")
    if workers is not None and not in_processes:
        encoder.set_workers(workers)
    total = len(documents) if input != "-" and _progress_wanted() else None
    coverage = coverage_of(encoder)
    hashed = None if reuse else HashedDocuments(documents)  # each text's hash, for a later --reuse
    # a shard may hold no rows (--shard 7/10 of 3 lines): an empty part that `merge` joins
    empty_ok = (documents.shard_provenance() or {}).get("rows", 0) > 0  # rows of the whole input
    if reuse:
        embeddings = _encode_reusing(encoder, documents, reused, reuse, batch_size, total, coverage, empty_ok)
    elif in_processes:
        from docembed.parallel import WorkerModel, encode_documents_in_processes
        from docembed.runtime import resolve_device
        from docembed.runtime import settings as runtime

        spec = WorkerModel(model, threads or 1, resolve_device(), runtime.seed, settings)
        embeddings = encode_documents_in_processes(
            spec, encoder, hashed, workers, batch_size, total, coverage, allow_empty=empty_ok
        )
    else:
        embeddings = encode_documents(
            encoder, hashed, batch_size=batch_size, total=total, coverage=coverage, allow_empty=empty_ok
        )
    if hashed is not None:
        embeddings.metadata.update(reuse_metadata(encoder, hashed.digests))
    if coverage is not None and coverage.documents_cut:
        log(f"note: {coverage.summary(encoder.name)}")
    if documents.skipped:
        log(f"skipped {documents.skipped} invalid line(s) of {documents.name}")
    if documents.blank:
        log(f"skipped {documents.blank} blank line(s) of {documents.name}")
    duplicates = len(embeddings.ids) - len(set(embeddings.ids))
    if duplicates:
        log(f"warning: {duplicates} duplicate id(s) in {documents.name} (`index build` refuses them)")
    refuse_non_finite(embeddings, encoder.name)
    provenance = documents.shard_provenance()  # --shard i/n: what `docembed merge` orders and checks by
    if provenance is not None:
        embeddings.metadata["shard"] = provenance
    save_embeddings(embeddings, output, output_format, overwrite=overwrite, inputs=[input], storage=storage)
    shape = f"dim {embeddings.dim}"
    if embeddings.is_multi and len(embeddings):  # (an empty shard has no mean)
        shape = f"multi-vector, {embeddings.data.counts.mean():.1f} vectors/doc, " + shape
    where = "stdout" if output == "-" else output
    log(f"encoded {len(embeddings)} documents with {encoder.name} ({shape}) -> {where}")


def _reused_set(reuse: str, storage: str):
    """`encode --reuse OLD`'s set, read (and a storage it cannot be copied into refused) before the model
    loads; whether the model is the one that wrote it is checked once it has."""
    from docembed.errors import UsageError
    from docembed.io.embeddings import STORAGES, load_embeddings

    old = load_embeddings(reuse)
    kept = old.metadata.get("storage", "float32")
    # STORAGES runs from the most precise: rows copied from a rounder set would pass for `storage` ones,
    # and rows rounded once already round again to other values (float16, then int8) than a fresh encode's
    if kept in STORAGES and kept not in ("float32", storage):
        raise UsageError(
            f"--reuse {reuse} holds {kept} vectors: copied into a {storage} output they would not be the "
            f"{storage} values a fresh encode writes; give --storage {kept}, or encode without --reuse"
        )
    return old


def _encode_reusing(encoder, documents, old, reuse, batch_size, total, coverage, allow_empty):
    """`encode --reuse OLD`: the embeddings of unchanged documents come from OLD, the rest are encoded."""
    from docembed.encoding import encode_documents_reusing
    from docembed.runtime import log

    embeddings, encoded = encode_documents_reusing(
        encoder, documents, old, reuse, batch_size, total=total, coverage=coverage, allow_empty=allow_empty
    )
    log(f"--reuse: encoded {encoded} new or changed of {len(embeddings)} documents, the rest from {reuse}")
    return embeddings


def _check_server_use(fit, workers, engine, *settings) -> None:
    """With --server the served model encodes as it was loaded: what would change it here is refused."""
    from docembed.errors import UsageError
    from docembed.runtime import settings as runtime

    if not runtime.server:
        return
    if fit or workers is not None or engine != "local":
        raise UsageError("--fit, --workers and --engine ray run the model here: leave out --server")
    if any(value is not None for value in settings):
        raise UsageError(
            "--ratio/--long/--backend/--precision/--selector/--max-vectors/--max-length/"
            "--passage-temperature/--long-queries change how the model encodes: the served model encodes as "
            "it was loaded; leave out --server"
        )


def _same_file(a: str, b: str) -> bool:
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_non_finite(embeddings, model: str) -> None:
    """NaN or infinite vectors (damaged weights, an overflow) score nothing: never written as an output."""
    import numpy as np

    from docembed.errors import DocembedError
    from docembed.io.embeddings import first_non_finite_row

    data = embeddings.data.vectors if embeddings.is_multi else embeddings.data
    row = first_non_finite_row(data)
    if row is None:
        return
    document = int(np.searchsorted(embeddings.data.offsets, row, "right") - 1) if embeddings.is_multi else row
    first = embeddings.ids[document]
    raise DocembedError(
        f"{model} made vectors that are not finite (NaN or infinite; first: document {first!r}): nothing "
        "written; are its weights damaged?"
    )


def fit_model_dir(output: str) -> str:
    """Where `encode --fit -o OUTPUT` keeps the model it fits: OUTPUT without its suffix + `.model/`."""
    from pathlib import Path

    path = Path(output)
    stem = path.name
    for suffix in reversed(path.suffixes):
        stem = stem.removesuffix(suffix)
    return str(path.with_name(f"{stem or path.name}.model"))


def _fit_beside(name, input, output, format, id_field, text_field, skip_invalid, overwrite) -> str:
    """`encode --fit`: fit the corpus-fitted family `name` on INPUT with its default settings (those of the
    command `docembed models` lists), save it beside OUTPUT, and return that directory for --model."""
    from pathlib import Path

    from docembed.errors import UsageError
    from docembed.io.outputs import check_output
    from docembed.models.base import MODEL_DIRECTORY
    from docembed.models.registry import FIT_COMMANDS
    from docembed.runtime import log, settings
    from docembed.training.fitting import fit_family

    if name not in FIT_COMMANDS:
        raise UsageError(
            f"--fit applies to the corpus-fitted families ({', '.join(FIT_COMMANDS)}), not {name!r}"
        )
    if input == "-" or output == "-":
        raise UsageError("--fit reads the input twice and saves the model beside -o: give files, not -")
    target = Path(fit_model_dir(output))
    # the one output rule: an existing model is refitted with --overwrite or when INPUT is newer (make), and
    # only if it is a docembed model (fit_family swaps the new one in, all or nothing)
    check_output(target, overwrite, directory=True, inputs=[input], kind=MODEL_DIRECTORY)
    command = FIT_COMMANDS[name].replace("CORPUS", input).replace("DIR", str(target))
    log(f"--fit: fitting {name} on {input}, as `{command}` does")
    corpus = common.reader(input, format, id_field, text_field, skip_invalid)
    fit_family(name, corpus, target, seed=settings.seed, device=settings.device)
    return str(target)


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _progress_wanted() -> bool:
    from docembed.runtime import progress_enabled

    return progress_enabled()
