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
RESULT_KEYS = ("index", "rows", "skipped", "seconds", "metadata", "error", "error_code")

__all__ = ["RayOptions", "encode_with_ray"]


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
) -> dict:
    """Encode INPUT into the shard directory OUTPUT (layout: docs/ray-engine.md); returns the manifest."""
    from docembed.runtime import log, progress_bar, settings

    options = options or RayOptions()
    if output == "-":
        raise UsageError("--engine ray writes a directory of Parquet shards: pass -o DIR")
    if input == "-":
        raise UsageError("--engine ray reads a file or a URI (its workers read row ranges), not stdin")
    ray = import_ray()
    spec = resolve_input(input, format, id_field, text_field, skip_invalid)
    plan = plan_shards(spec, options.rows_per_shard)
    out = Path(output)
    model_source = model_spec(model)
    job = {
        # not skip_invalid: a run that stopped on a bad line resumes with --skip-invalid (see prepare_output)
        "input": {
            **{k: v for k, v in asdict(spec).items() if k != "skip_invalid"},
            "size": plan.size,
            "rows": plan.rows,
        },
        "model": model_source,
        "ratio": ratio,
        "long_documents": long_documents,
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
    if todo:
        task = {
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
            "output": str(out.resolve()),
        }
        started_ray = connect(ray, options, settings.verbose)
        try:
            workers = pool_size(ray, options, len(todo))
            results = iter(_dataset(ray, todo, plan, task, workers, options).iter_rows())
            total = sum(s["stop"] - s["start"] for s in todo)
            started = last_write = time.perf_counter()
            done_rows = 0
            with progress_bar(
                f"encode [{model} on {workers} Ray worker(s)]", total=total, unit="documents"
            ) as bar:
                try:
                    for result in results:
                        shard = shards[int(result["index"])]
                        if int(result["error_code"]):
                            _raise_failure(result, shard)
                        shard.update(
                            status="done",
                            rows=int(result["rows"]),
                            skipped_invalid=int(result["skipped"]),
                            seconds=round(float(result["seconds"]), 3),
                        )
                        fresh[shard["index"]] = json.loads(str(result["metadata"]))
                        done_rows += shard["stop"] - shard["start"]
                        bar.advance(shard["stop"] - shard["start"])
                        bar.update(docs_per_s=done_rows / max(time.perf_counter() - started, 1e-9))
                        if time.perf_counter() - last_write > MANIFEST_WRITE_INTERVAL_S:
                            write_manifest(out, manifest)
                            last_write = time.perf_counter()
                finally:
                    close = getattr(results, "close", None)
                    if close is not None:  # stop the streaming executor now, not at garbage collection
                        close()
        finally:
            write_manifest(out, manifest)  # whatever finished stays done for the next run
            if started_ray:
                ray.shutdown()
    finish(out, manifest, fresh)
    if manifest["count"] == 0:
        raise DocembedError(f"no documents to encode: every line of {input} was invalid")
    write_manifest(out, manifest)
    skipped = sum(s["skipped_invalid"] or 0 for s in shards)
    if skipped:
        log(f"skipped {skipped} invalid line(s) of {input}")
    shape = f"dim {manifest['dim']}" + (", multi-vector" if manifest["kind"] == "multi" else "")
    log(
        f"encoded {manifest['count']} documents with {manifest['model'].get('model')} ({shape}) -> {out}/ "
        f"({len(shards)} shards, {len(todo)} new)"
    )
    return manifest


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
        from docembed.io.embeddings import save_embeddings, shard_file_name

        result = {"index": index, "rows": 0, "skipped": 0, "seconds": 0.0, "metadata": "", "error": ""}
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
            save_embeddings(embeddings, str(Path(self.task["output"]) / shard_file_name(index)), "parquet")
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
            "error_code": 0,
        }


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
