"""`docembed encode --engine ray`: the same Encoder, run by Ray Data actors, writing Parquet shards.

The driver plans the shards (engines/manifest.py) and hands Ray Data one small row per shard; each actor
loads the model once, reads its rows with the local engine's reader (`DocumentReader.read_range`), encodes
them with the local engine's loop and writes the shard itself, so texts never travel through Ray's object
store and the driver never holds embeddings. The output layout, skip rule and logging choices are in
docs/ray-engine.md.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from docembed.engines.manifest import (
    Plan,
    finish,
    model_spec,
    plan_shards,
    prepare_output,
    resolve_input,
    write_manifest,
)
from docembed.engines.ray_cluster import RayOptions, connect, import_ray, pool_size
from docembed.errors import DocembedError, UsageError

MANIFEST_WRITE_INTERVAL_S = 2.0
# What the actors need to load models the way this process does (workers on a cluster do not inherit the
# driver's environment; DOCEMBED_HOME is where saved models and unpacked offline weights live).
FORWARDED_ENV = (
    "DOCEMBED_HOME",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "TRANSFORMERS_VERBOSITY",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS",
    "TOKENIZERS_PARALLELISM",
)
RESULT_KEYS = ("index", "rows", "skipped", "seconds", "metadata", "fragments", "error", "error_code")

__all__ = ["RayOptions", "encode_with_ray", "writes_lance"]


def _dataset(ray, todo: list[dict], plan: Plan, task: dict, workers: int, options: RayOptions):
    import inspect

    items = [
        {"index": s["index"], "start": s["start"], "stop": s["stop"], "offset": plan.offsets[s["index"]]}
        for s in todo
    ]
    # one shard per block, so idle actors can take any shard (the keyword was renamed in Ray 2.10)
    blocks = (
        "override_num_blocks"
        if "override_num_blocks" in inspect.signature(ray.data.from_items).parameters
        else "parallelism"
    )
    resources = {"num_cpus": options.cpus_per_worker}
    if options.gpus_per_worker:
        resources["num_gpus"] = options.gpus_per_worker
    return ray.data.from_items(items, **{blocks: len(items)}).map_batches(
        ShardEncoder,
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        fn_constructor_kwargs={"task": task},
        **resources,
    )


def _raise_failure(result: dict, shard: dict) -> None:
    code, message = int(result["error_code"]), str(result["error"])
    if code == UsageError.exit_code:
        raise UsageError(message)
    if code > 0:
        raise DocembedError(message)
    raise RuntimeError(f"encoding {shard['file']} failed in a Ray worker:\n{message}")


def writes_lance(output: str, output_format: str | None) -> bool:
    """Whether -o OUTPUT is a Lance collection: --output-format lance, or a name ending in .lance."""
    if output_format is not None:
        return output_format == "lance"
    return output.rstrip("/").endswith(".lance")


def encode_with_ray(
    input: str,
    output: str,
    model: str,
    *,
    format: str | None = None,
    id_field: str = "id",
    text_field: str = "text",
    skip_invalid: bool = False,
    batch_size: int = 32,
    ratio: float | None = None,
    overwrite: bool = False,
    options: RayOptions | None = None,
    long_documents: str | None = None,
    output_format: str | None = None,
    store_text: bool = False,
) -> dict:
    """Encode INPUT into the shard directory OUTPUT, or with `output_format` "lance" (or OUTPUT named
    *.lance) into a Lance collection (layout: docs/ray-engine.md); returns the manifest (a collection: its
    summary)."""
    options = options or RayOptions()
    lance = writes_lance(output, output_format)
    if output == "-":
        raise UsageError("--engine ray writes a directory of Parquet shards: pass -o DIR")
    if input == "-":
        raise UsageError("--engine ray reads a file or a URI (its workers read row ranges), not stdin")
    if output_format not in (None, "parquet", "lance"):
        raise UsageError(
            "--engine ray writes Parquet shards only, or a Lance collection (--output-format lance)"
        )
    if store_text and not lance:
        raise UsageError("--store-text keeps the texts in a Lance collection: add --output-format lance")
    ray = import_ray()
    spec = resolve_input(input, format, id_field, text_field, skip_invalid)
    plan = plan_shards(spec, options.rows_per_shard)
    task = _task(spec, plan, model_spec(model), ratio, long_documents, batch_size, options)
    if lance:
        return _encode_to_lance(
            ray, plan, {**task, "store_text": store_text}, output, overwrite, options, model
        )
    return _encode_to_shards(ray, plan, task, Path(output), overwrite, options, model)


def _task(spec, plan: Plan, model_source: str, ratio, long_documents, batch_size: int, options) -> dict:
    """What every actor needs: the input, the model and how to run it (the output is added by the sink)."""
    from docembed.runtime import settings

    return {
        "input": asdict(spec),
        "files": plan.files,
        "model": model_source,
        "ratio": ratio,
        "long_documents": long_documents,
        "batch_size": batch_size,
        "device": settings.device,
        "seed": settings.seed,
        "threads": max(1, int(options.cpus_per_worker)),
        "env": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
    }


def _encode_to_shards(ray, plan: Plan, task: dict, out: Path, overwrite: bool, options, model: str) -> dict:
    """Parquet shards and manifest.json in OUT; a re-run encodes only the shards not written."""
    from docembed.runtime import log

    spec = plan.input
    job = {
        # not skip_invalid: a run that stopped on a bad line resumes with --skip-invalid (see prepare_output)
        "input": {
            **{k: v for k, v in asdict(spec).items() if k != "skip_invalid"},
            "size": plan.size,
            "rows": plan.rows,
        },
        "model": task["model"],
        "ratio": task["ratio"],
        "long_documents": task["long_documents"],
        "rows_per_shard": options.rows_per_shard,
    }
    manifest = prepare_output(out, job, plan, overwrite)
    shards = manifest["shards"]
    todo = [s for s in shards if s["status"] != "done"]
    log(
        f"ray: {len(shards)} shard(s) of up to {options.rows_per_shard} rows; "
        f"{len(shards) - len(todo)} already written, {len(todo)} to encode"
    )
    write_manifest(out, manifest)
    fresh: dict[int, dict] = {}
    last_write = [time.perf_counter()]

    def record(shard: dict, result: dict) -> None:
        _mark_done(shard, result)
        fresh[shard["index"]] = json.loads(str(result["metadata"]))
        if time.perf_counter() - last_write[0] > MANIFEST_WRITE_INTERVAL_S:
            write_manifest(out, manifest)
            last_write[0] = time.perf_counter()

    if todo:
        try:
            _run_shards(ray, todo, plan, {**task, "sink": "parquet", "output": str(out.resolve())}, options,
                        model, record)  # fmt: skip
        finally:
            write_manifest(out, manifest)  # whatever finished stays done for the next run
    finish(out, manifest, fresh)
    if manifest["count"] == 0:
        raise DocembedError(f"no documents to encode: every line of {spec.path} was invalid")
    write_manifest(out, manifest)
    _log_done(manifest, spec.path, f"{out}/ ({len(shards)} shards, {len(todo)} new)")
    return manifest


def _encode_to_lance(ray, plan: Plan, task: dict, output: str, overwrite: bool, options, model: str) -> dict:
    """A Lance collection at OUTPUT: each actor writes its shard's rows as uncommitted Lance fragments, and
    this process commits them all at once, in input order (lance_index.commit_fragments). It is written in
    a staging folder swapped in at the end, so a failure leaves the previous collection, or none; a re-run
    encodes everything again (the output rule of `index build`: --overwrite, or an input newer than it)."""
    from docembed.io.outputs import directory_output
    from docembed.lance_index import ANY_INDEX_DIRECTORY, commit_fragments, require_pylance

    if "://" in output:
        raise UsageError("--output-format lance writes a local folder (shared by the workers on a cluster)")
    require_pylance()  # missing, it fails here in one line, not in every worker after its model loads
    out = Path(output)
    shards = [
        {"index": i, "file": f"input rows [{start}, {stop})", "start": start, "stop": stop}
        for i, (start, stop) in enumerate(plan.ranges)
    ]
    fragments: dict[int, list[str]] = {}
    fresh: dict[int, dict] = {}

    def record(shard: dict, result: dict) -> None:
        _mark_done(shard, result)
        fresh[shard["index"]] = json.loads(str(result["metadata"]))
        fragments[shard["index"]] = json.loads(str(result["fragments"]))

    with directory_output(out, ANY_INDEX_DIRECTORY, overwrite, inputs=[plan.input.path]) as staging:
        sink = {**task, "sink": "lance", "output": str(staging.resolve())}
        _run_shards(ray, shards, plan, sink, options, model, record)
        summary = {"shards": shards}
        finish(staging, summary, fresh)  # one model for every shard; its metadata, dim, kind and count
        if summary["count"] == 0:
            raise DocembedError(f"no documents to encode: every line of {plan.input.path} was invalid")
        metadata = {**summary["model"], "dim": summary["dim"], "kind": summary["kind"]}
        metadata.pop("coverage", None)  # the first shard's: not the collection's
        in_order = [fragment for index in sorted(fragments) for fragment in fragments[index]]
        index = commit_fragments(staging, in_order, metadata, text=task["store_text"])
    summary["version"] = index.version
    _log_done(
        summary, plan.input.path, f"{out} (Lance collection, {len(shards)} shards, version {index.version})"
    )
    return summary


def _mark_done(shard: dict, result: dict) -> None:
    shard.update(
        status="done",
        rows=int(result["rows"]),
        skipped_invalid=int(result["skipped"]),
        seconds=round(float(result["seconds"]), 3),
    )


def _log_done(summary: dict, input: str, where: str) -> None:
    from docembed.runtime import log

    skipped = sum(s["skipped_invalid"] or 0 for s in summary["shards"])
    if skipped:
        log(f"skipped {skipped} invalid line(s) of {input}")
    shape = f"dim {summary['dim']}" + (", multi-vector" if summary["kind"] == "multi" else "")
    log(f"encoded {summary['count']} documents with {summary['model'].get('model')} ({shape}) -> {where}")


def _run_shards(ray, todo: list[dict], plan: Plan, task: dict, options, model: str, record) -> None:
    """Encode the shards `todo` on an actor pool; `record(shard, result)` for each as it finishes. A failed
    shard ends the run with its error."""
    from docembed.runtime import progress_bar, settings

    by_index = {s["index"]: s for s in todo}
    started_ray = connect(ray, options, settings.verbose)
    try:
        workers = pool_size(ray, options, len(todo))
        results = iter(_dataset(ray, todo, plan, task, workers, options).iter_rows())
        total = sum(s["stop"] - s["start"] for s in todo)
        started = time.perf_counter()
        done_rows = 0
        with progress_bar(
            f"encode [{model} on {workers} Ray worker(s)]", total=total, unit="documents"
        ) as bar:
            try:
                for result in results:
                    shard = by_index[int(result["index"])]
                    if int(result["error_code"]):
                        _raise_failure(result, shard)
                    record(shard, result)
                    done_rows += shard["stop"] - shard["start"]
                    bar.advance(shard["stop"] - shard["start"])
                    bar.update(docs_per_s=done_rows / max(time.perf_counter() - started, 1e-9))
            finally:
                close = getattr(results, "close", None)
                if close is not None:  # stop the streaming executor now, not at garbage collection
                    close()
    finally:
        if started_ray:
            ray.shutdown()


# --- the actor --------------------------------------------------------------------------------------------
class ShardEncoder:
    """The `map_batches` class: Ray Data makes one per actor, so the model loads once per actor. Each input
    row names one shard; the actor reads, encodes and writes it, and returns a small status row."""

    def __init__(self, task: dict):
        self.task = task
        self.model = None
        self.failure: dict | None = None
        os.environ.update(task["env"])
        self.reader = _reader(task)
        try:
            self.model = _load_encoder(task)
        except Exception as error:  # reported with the first shard, where the driver turns it into one line
            self.failure = _failure(error)

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        results = [
            self._encode_shard(int(index), int(start), int(stop), int(offset))
            for index, start, stop, offset in zip(
                batch["index"], batch["start"], batch["stop"], batch["offset"], strict=True
            )
        ]
        return {key: np.array([r[key] for r in results]) for key in RESULT_KEYS}

    def _encode_shard(self, index: int, start: int, stop: int, offset: int) -> dict:
        from docembed.encoding import coverage_of, encode_documents

        result = {"index": index, "rows": 0, "skipped": 0, "seconds": 0.0, "metadata": "", "fragments": "[]"}
        result["error"] = ""
        if self.failure:
            return {**result, **self.failure}
        started = time.perf_counter()
        try:
            documents, skipped = self.reader.read_range(start, stop, offset)
            embeddings = encode_documents(
                self.model,
                documents,
                self.task["batch_size"],
                allow_empty=True,
                coverage=coverage_of(self.model),
            )
            fragments = self._write(index, embeddings, documents)
        except Exception as error:
            return {**result, **_failure(error)}
        metadata = dict(
            embeddings.metadata,
            dim=embeddings.dim,
            count=len(embeddings),
            kind="multi" if embeddings.is_multi else "dense",
        )
        return {
            **result,
            "rows": len(embeddings),
            "skipped": skipped,
            "seconds": time.perf_counter() - started,
            "metadata": json.dumps(metadata),
            "fragments": json.dumps(fragments),
            "error_code": 0,
        }

    def _write(self, index: int, embeddings, documents) -> list[str]:
        """Write the shard: a Parquet file, or uncommitted Lance fragments (returned, for the driver)."""
        output = self.task["output"]
        if self.task["sink"] == "lance":
            from docembed.lance_index import write_fragments

            texts = {d.id: d.text for d in documents} if self.task["store_text"] else None
            return write_fragments(output, embeddings, texts)
        from docembed.io.embeddings import save_embeddings, shard_file_name

        save_embeddings(embeddings, str(Path(output) / shard_file_name(index)), "parquet")
        return []


def _failure(error: Exception) -> dict:
    if isinstance(error, DocembedError):
        return {"error": str(error), "error_code": error.exit_code}
    return {"error": traceback.format_exc(), "error_code": -1}  # a bug: keep the whole remote traceback


def _load_encoder(task: dict):
    import torch

    from docembed.models.registry import load_model
    from docembed.runtime import resolve_device, seed_everything, settings

    # one actor per `cpus_per_worker` CPUs: more torch threads than that would only fight the other actors
    torch.set_num_threads(task["threads"])
    settings.device, settings.quiet = task["device"], True
    seed_everything(task["seed"])
    model = load_model(task["model"], device=resolve_device())
    if task["ratio"] is not None:
        model.set_ratio(task["ratio"])
    if task.get("long_documents") is not None:
        model.set_long_documents(task["long_documents"])
    return model


def _reader(task: dict):
    from docembed.io.readers import DocumentReader

    spec = task["input"]
    return DocumentReader(
        spec["path"],
        spec["format"],
        spec["id_field"],
        spec["text_field"],
        spec["skip_invalid"],
        files=[tuple(f) for f in task["files"]] or None,
    )
