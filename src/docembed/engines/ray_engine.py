"""`docembed encode --engine ray`: the same Encoder, run by Ray Data actors, writing Parquet shards.

The output (-o DIR) is a directory:

    part-00000.parquet ...  one file per shard, in input order. Each is exactly what the local engine writes
                            for `-o x.parquet` on those rows: `id` + `vector` (dense) or `id` + `vectors`
                            [+ `positions`] (multi-vector), with the same `docembed` metadata. So
                            `load_embeddings(shard)` reads one shard and `load_embeddings(DIR)` all of them.
    manifest.json           the job (input path, format, size and rows; id/text fields; model spec and
                            ratio; rows per shard), the model's metadata, dim, kind, count, docembed version,
                            and for each shard: file, input row range [start, stop), rows written, invalid
                            lines skipped, seconds and status (pending | done). `complete` once all are done.

Sharding is deterministic: shard i holds input rows [i*R, (i+1)*R) (R = --rows-per-shard, default 10,000;
a row is a line of a text input or a row of a Parquet input), so a re-run maps the same rows to the same file.
Skip rule: a shard is skipped when manifest.json describes the same job, lists the shard as done with the
same row range, and its file exists with that many rows (read from the Parquet footer) - and, without
--skip-invalid, it dropped no invalid line (the job leaves --skip-invalid out, so a run that stopped on a
malformed line resumes with it). A manifest of a different job is an error unless --overwrite, which
re-encodes every shard. Shards are written atomically (a temporary file renamed when complete), so a killed
run leaves whole shards and a manifest that says which; run one job per directory at a time.

How it runs: the driver plans the shards (one pass over a text input to count lines and note the byte offset
where each shard starts; the footers of a Parquet input) and hands Ray Data one small row per shard. A
stateful `map_batches` class - one instance per actor, `ActorPoolStrategy(size=--num-workers)`, each actor
with --cpus-per-worker CPUs (also its torch threads) and --gpus-per-worker GPUs - loads the model once, then
for each shard reads its rows straight from the input, encodes them with the local engine's
`encode_documents` and writes the shard itself. Texts never travel through Ray's object store and the
driver never holds embeddings, so it is no bottleneck. Every worker must reach the input (a local path, or
any URI pyarrow's filesystems open: s3://, gs://, hdfs://, file://) and the output directory (a shared
filesystem on a multi-node cluster), and have docembed installed.

Ids follow the local reader exactly: text lines go through `DocumentReader.parse_record` (the id field,
else the 0-based line number); Parquet rows take the --id-field column, else the 0-based row number across
the files. Inputs: .jsonl/.txt/.tsv (optionally .gz), or Parquet (`.parquet`/`.pq`, a directory of them read
in path order, or `--format parquet`) with a string column --text-field.

Ray's own chatter stays off stderr: Ray and Ray Data log at ERROR (INFO with -v), Ray Data's progress bars
are off (docembed's bar counts rows), and worker output reaches the terminal only with -v (log_to_driver).
Ray 2.5x prints one "constructor arguments in the object store" line from its C++ core for any actor pool
(ray-project/ray#57733); it is harmless. Errors a user can cause (a malformed line, an unknown model) are
caught in the actor and returned as that shard's result, so the run ends with one clear line instead of a
remote traceback, and the shards finished before it stay done.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from docembed.errors import DocembedError, InputFormatError, UsageError

DEFAULT_ROWS_PER_SHARD = 10_000
INSTALL_HINT = "pip install 'docembed[ray]'"
PARQUET_SUFFIXES = (".parquet", ".pq")
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


@dataclass
class RayOptions:
    address: str | None = None
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD


@dataclass(frozen=True)
class InputSpec:
    path: str  # absolute local path, or a URI
    format: str  # jsonl | txt | tsv | parquet
    id_field: str
    text_field: str
    skip_invalid: bool


@dataclass
class Plan:
    input: InputSpec
    size: int  # bytes (compressed size for .gz)
    rows: int  # lines of a text input, rows of a Parquet input
    ranges: list[tuple[int, int]]  # [start, stop) input rows of each shard
    offsets: list[int]  # text: byte offset of each shard's first line (0 for Parquet)
    files: list[tuple[str, int]]  # Parquet: (path within the filesystem, rows) in reading order


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401  (the [data] extra: pyarrow, pandas and the Data library)
    except ImportError:
        raise DocembedError(
            f"--engine ray needs Ray, which is not installed: install it with: {INSTALL_HINT}"
        ) from None
    return ray


# --- input: resolving, planning, reading row ranges (driver and actors) -------------------------------------
def _filesystem(path: str):
    """(pyarrow filesystem, path within it) for a local path or a URI."""
    from pyarrow import fs

    if "://" not in path:
        return fs.LocalFileSystem(), path
    try:
        return fs.FileSystem.from_uri(path)
    except (ValueError, OSError) as error:  # ArrowInvalid is a ValueError
        raise DocembedError(f"cannot open {path}: {error}") from None


def resolve_input(
    path: str, format: str | None, id_field: str, text_field: str, skip_invalid: bool
) -> InputSpec:
    from pyarrow import fs

    from docembed.io.readers import FORMATS, infer_format

    canonical = path if "://" in path else os.path.abspath(os.path.expanduser(path))
    filesystem, inner = _filesystem(canonical)
    info = filesystem.get_file_info(inner)
    if info.type == fs.FileType.NotFound:
        raise DocembedError(f"input file not found: {path}")
    is_dir = info.type == fs.FileType.Directory
    if format is None:
        format = "parquet" if is_dir or path.lower().endswith(PARQUET_SUFFIXES) else infer_format(path)
    if format not in (*FORMATS, "parquet"):
        raise UsageError(f"unknown input format {format!r}; choose one of {', '.join(FORMATS)}, parquet")
    if is_dir and format != "parquet":
        raise DocembedError(
            f"input is a directory, not a file: {path} (a directory is read as Parquet files)"
        )
    return InputSpec(canonical, format, id_field, text_field, skip_invalid)


@contextmanager
def open_input(path: str) -> Iterator[io.BufferedIOBase]:
    """A seekable binary reader of a local file or URI, decompressed when the name ends in .gz (seeking in
    gzip decompresses from the start: fine for moderate files, slow for huge ones)."""
    with ExitStack() as stack:
        if "://" in path:
            filesystem, inner = _filesystem(path)
            handle = stack.enter_context(io.BufferedReader(filesystem.open_input_file(inner), 1 << 20))
        else:
            handle = stack.enter_context(open(path, "rb"))  # noqa: SIM115
        if path.endswith(".gz"):
            handle = stack.enter_context(gzip.GzipFile(fileobj=handle))
        yield handle


def _shard_ranges(rows: int, rows_per_shard: int) -> list[tuple[int, int]]:
    return [(start, min(start + rows_per_shard, rows)) for start in range(0, rows, rows_per_shard)]


def _plan_text(spec: InputSpec, rows_per_shard: int) -> tuple[int, list[int]]:
    """(line count, byte offset where each shard's first line starts), in one pass of 4 MiB blocks."""
    import numpy as np

    offsets, lines, position, last = [0], 0, 0, b"\n"
    next_start = rows_per_shard  # the line that starts the next shard
    try:
        with open_input(spec.path) as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                # line L starts right after the L-th newline of the file: here, newline L - 1 - lines
                while next_start - 1 - lines < len(newlines):
                    offsets.append(position + int(newlines[next_start - 1 - lines]) + 1)
                    next_start += rows_per_shard
                lines += len(newlines)
                position += len(block)
                last = block[-1:]
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DocembedError(f"{spec.path}: cannot read: {error}") from None
    rows = lines + (last != b"\n")  # a last line without a newline counts, as in count_lines
    return rows, offsets[: len(_shard_ranges(rows, rows_per_shard))]


def _plan_parquet(spec: InputSpec) -> tuple[list[tuple[str, int]], int]:
    """([(file, rows)] in path order, total bytes), checking every file has a string text column."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem, inner = _filesystem(spec.path)
    info = filesystem.get_file_info(inner)
    if info.type == fs.FileType.Directory:
        found = filesystem.get_file_info(fs.FileSelector(inner, recursive=True))
        # skip the _SUCCESS / .crc style bookkeeping files that writers leave beside the data
        infos = sorted(
            (i for i in found if i.type == fs.FileType.File and i.path.endswith(PARQUET_SUFFIXES)),
            key=lambda i: i.path,
        )
        infos = [
            i
            for i in infos
            if not any(p.startswith((".", "_")) for p in Path(i.path).relative_to(inner).parts)
        ]
        if not infos:
            raise DocembedError(f"{spec.path}: no .parquet files in this directory")
    else:
        infos = [info]
    files = []
    for item in infos:
        try:
            with filesystem.open_input_file(item.path) as handle:
                parquet = pq.ParquetFile(handle)
                schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
        except (OSError, ValueError) as error:
            raise DocembedError(f"{item.path}: not a readable Parquet file: {error}") from None
        if spec.text_field not in schema.names:
            raise DocembedError(
                f"{item.path}: no text column {spec.text_field!r} (columns: {', '.join(schema.names)}); "
                "pass --text-field"
            )
        kind = schema.field(spec.text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DocembedError(f"{item.path}: text column {spec.text_field!r} holds {kind}, not strings")
        files.append((item.path, rows))
    return files, sum(i.size or 0 for i in infos)


def plan_shards(spec: InputSpec, rows_per_shard: int) -> Plan:
    if spec.format == "parquet":
        files, size = _plan_parquet(spec)
        rows = sum(n for _, n in files)
        ranges = _shard_ranges(rows, rows_per_shard)
        offsets = [0] * len(ranges)
    else:
        filesystem, inner = _filesystem(spec.path)
        size = filesystem.get_file_info(inner).size or 0
        rows, offsets = _plan_text(spec, rows_per_shard)
        files = []
        ranges = _shard_ranges(rows, rows_per_shard)
    if rows == 0:
        raise DocembedError("no documents to encode: the input is empty")
    return Plan(spec, size, rows, ranges, offsets, files)


def read_rows(task: dict, start: int, stop: int, offset: int):
    """(documents, invalid rows skipped) of input rows [start, stop)."""
    if task["input"]["format"] == "parquet":
        return _read_parquet_rows(task["input"], task["files"], start, stop)
    return _read_text_rows(task["input"], start, stop, offset)


def _read_text_rows(spec: dict, start: int, stop: int, offset: int):
    from docembed.io.readers import DocumentReader

    reader = DocumentReader(spec["path"], spec["format"], spec["id_field"], spec["text_field"])
    documents, skipped = [], 0
    try:
        with open_input(spec["path"]) as handle:
            handle.seek(offset)
            for index in range(start, stop):
                raw = handle.readline()
                if not raw:
                    raise DocembedError(
                        f"{spec['path']}: ended before line {index + 1}; did it change mid-run?"
                    )
                try:
                    documents.append(reader.parse_record(raw, index))
                except InputFormatError:
                    if not spec["skip_invalid"]:
                        raise
                    skipped += 1
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DocembedError(f"{spec['path']}: cannot read: {error}") from None
    return documents, skipped


def _read_parquet_rows(spec: dict, files: list, start: int, stop: int):
    from docembed.io.readers import Document

    filesystem, _ = _filesystem(spec["path"])
    documents, skipped, base = [], 0, 0
    for path, count in files:
        low, high = max(start, base), min(stop, base + count)
        if low < high:
            table = _parquet_slice(filesystem, path, low - base, high - base, spec)
            texts = table.column(spec["text_field"]).to_pylist()
            has_ids = spec["id_field"] in table.column_names
            ids = table.column(spec["id_field"]).to_pylist() if has_ids else [None] * len(texts)
            for k, (doc_id, text) in enumerate(zip(ids, texts, strict=True)):
                row = low + k
                if text is None:
                    if not spec["skip_invalid"]:
                        raise InputFormatError(
                            path, row - base + 1, f"text field {spec['text_field']!r} missing"
                        )
                    skipped += 1
                    continue
                documents.append(Document(str(row) if doc_id is None else str(doc_id), text))
        base += count
        if base >= stop:
            break
    return documents, skipped


def _parquet_slice(filesystem, path: str, low: int, high: int, spec: dict):
    """Rows [low, high) of one Parquet file, reading only the row groups that hold them."""
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        columns = [
            c
            for c in dict.fromkeys((spec["id_field"], spec["text_field"]))
            if c in parquet.schema_arrow.names
        ]
        groups, first, row = [], None, 0
        for group in range(parquet.num_row_groups):
            n = parquet.metadata.row_group(group).num_rows
            if row < high and row + n > low:
                groups.append(group)
                first = row if first is None else first
            row += n
        table = parquet.read_row_groups(groups, columns=columns)
    return table.slice(low - first, high - low)


# --- the actor --------------------------------------------------------------------------------------------
class ShardEncoder:
    """The `map_batches` class: Ray Data makes one per actor, so the model loads once per actor. Each input
    row names one shard; the actor reads, encodes and writes it, and returns a small status row."""

    def __init__(self, task: dict):
        self.task = task
        self.model = None
        self.failure: dict | None = None
        os.environ.update(task["env"])
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
        from docembed.io.embeddings import save_embeddings, shard_file_name

        result = {"index": index, "rows": 0, "skipped": 0, "seconds": 0.0, "metadata": "", "error": ""}
        if self.failure:
            return {**result, **self.failure}
        started = time.perf_counter()
        try:
            documents, skipped = read_rows(self.task, start, stop, offset)
            embeddings = _encode(self.model, documents, self.task["batch_size"])
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
        if not hasattr(model, "set_ratio"):
            raise UsageError(f"model {task['model']!r} has no compression ratio (--ratio)")
        model.set_ratio(task["ratio"])
    return model


def _encode(model, documents: list, batch_size: int):
    """The local engine's encode_documents; a shard left empty by --skip-invalid still gets a typed file."""
    import numpy as np

    from docembed.encoding import encode_documents
    from docembed.io.embeddings import EmbeddingSet, MultiVectors

    if documents:
        return encode_documents(model, documents, batch_size=batch_size)
    sample = model.encode([""], batch_size=1)
    if isinstance(sample, MultiVectors):
        positions = None if sample.positions is None else sample.positions[:0]
        data = MultiVectors(sample.vectors[:0], np.zeros(1, dtype=np.int64), positions)
    else:
        data = sample[:0]
    return EmbeddingSet(data, [], model.metadata())


# --- the output directory ---------------------------------------------------------------------------------
def _model_spec(model: str) -> str:
    """A saved model's directory as an absolute path: actors may run in another working directory."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def _read_manifest(out: Path) -> dict | None:
    from docembed.io.embeddings import MANIFEST_NAME

    path = out / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest.get("shards"), list):
            raise ValueError("no shard list")
        return manifest
    except (OSError, ValueError, AttributeError) as error:
        raise DocembedError(f"{path} is corrupt ({error}): pass --overwrite to start the job again") from None


def write_manifest(out: Path, manifest: dict) -> None:
    from docembed.io.embeddings import MANIFEST_NAME, atomic_path

    with atomic_path(out / MANIFEST_NAME) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _shard_rows(path: Path) -> int | None:
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except (OSError, ValueError):  # missing or truncated
        return None


def _first_difference(old: dict, new: dict, prefix: str = "") -> str:
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = _first_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: {a!r} then, {b!r} now"
    return ""


def prepare_output(out: Path, job: dict, plan: Plan, overwrite: bool) -> dict:
    """The manifest to run with: shards that the skip rule keeps are 'done', the others 'pending'."""
    from docembed import __version__
    from docembed.io.embeddings import MANIFEST_NAME, shard_file_name

    if out.exists() and not out.is_dir():
        raise DocembedError(f"output exists and is a file: {out} (--engine ray writes a directory of shards)")
    if not out.absolute().parent.exists():
        raise DocembedError(f"output folder does not exist: {out.absolute().parent}")
    old = None if overwrite else _read_manifest(out)
    if old is None and not overwrite and out.is_dir() and any(out.iterdir()):
        raise DocembedError(
            f"output directory {out} is not empty and has no {MANIFEST_NAME}: "
            "pass --overwrite to write into it, or choose another directory"
        )
    if old is not None and old.get("job") != job:
        difference = _first_difference(old.get("job") or {}, job)
        raise DocembedError(
            f"{out} holds the shards of a different job ({difference}): "
            "pass --overwrite to re-encode it, or choose another directory"
        )
    out.mkdir(exist_ok=True)
    previous = {s.get("index"): s for s in old["shards"]} if old else {}
    shards = []
    for index, (start, stop) in enumerate(plan.ranges):
        entry = {
            "index": index,
            "file": shard_file_name(index),
            "start": start,
            "stop": stop,
            "status": "pending",
            "rows": None,
            "skipped_invalid": None,
            "seconds": None,
        }
        done = previous.get(index)
        if (
            done
            and done.get("status") == "done"
            and (done.get("start"), done.get("stop")) == (start, stop)
            and _shard_rows(out / entry["file"]) == done.get("rows")
            # a shard that dropped invalid lines is not what a run without --skip-invalid would write
            and (plan.input.skip_invalid or not done.get("skipped_invalid"))
        ):
            entry = dict(done)
        shards.append(entry)
    _remove_leftovers(out, len(shards))
    kept = old or {}
    return {
        "engine": "ray",
        "docembed_version": __version__,
        "job": job,
        "model": kept.get("model"),
        "kind": kept.get("kind"),
        "dim": kept.get("dim"),
        "count": None,
        "num_shards": len(shards),
        "rows_per_shard": job["rows_per_shard"],
        "complete": False,
        "shards": shards,
    }


def _remove_leftovers(out: Path, num_shards: int) -> None:
    """Temporary files of a killed run, and shards past the end of this job's range (after --overwrite)."""
    for path in out.iterdir():
        name = path.name
        if re.fullmatch(r"\.(part-\d+\.parquet|manifest\.json)\.tmp\d+", name):
            path.unlink(missing_ok=True)
        match = re.fullmatch(r"part-(\d+)\.parquet", name)
        if match and int(match.group(1)) >= num_shards:
            path.unlink(missing_ok=True)


def _shard_metadata(out: Path, shard: dict) -> dict:
    import pyarrow.parquet as pq

    raw = (pq.read_schema(out / shard["file"]).metadata or {}).get(b"docembed", b"{}")
    return json.loads(raw)


def _finish(out: Path, manifest: dict, fresh: dict[int, dict]) -> None:
    """Check every shard came from the same model, then fill in the manifest's model, dim, kind and count."""
    shards = manifest["shards"]
    metadata = {s["index"]: fresh.get(s["index"]) or _shard_metadata(out, s) for s in shards}
    keys = ("model", "family", "config_hash", "dim", "kind")
    first = metadata[0]
    for index, meta in metadata.items():
        if any(meta.get(k) != first.get(k) for k in keys):
            raise DocembedError(
                f"{out}: {shards[0]['file']} and {shards[index]['file']} come from different models "
                f"({first.get('model')} {first.get('config_hash')} vs {meta.get('model')} "
                f"{meta.get('config_hash')}): re-run with --overwrite"
            )
    manifest["model"] = {k: v for k, v in first.items() if k not in ("dim", "count", "kind")}
    manifest["dim"], manifest["kind"] = first.get("dim"), first.get("kind")
    manifest["count"] = sum(s["rows"] for s in shards)
    manifest["complete"] = True


# --- the driver -------------------------------------------------------------------------------------------
def _connect(ray, options: RayOptions, verbose: bool) -> bool:
    """Join the cluster at --address (or the one this process already joined), else start a local instance
    sized for the workers. Returns whether this call started Ray (and so must shut it down)."""
    level = logging.INFO if verbose else logging.ERROR
    logging.getLogger("ray.data").setLevel(level)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    if ray.is_initialized():
        return False
    common = {"log_to_driver": verbose, "logging_level": level}
    # ray.init installs a SIGTERM handler of its own that exits on the spot; keep docembed's, which unwinds
    # like Ctrl-C so the manifest records the finished shards and Ray is shut down.
    on_term = signal.getsignal(signal.SIGTERM)
    try:
        if options.address:
            ray.init(address=options.address, **common)
        else:
            cpus = max(1, math.ceil(options.num_workers * options.cpus_per_worker))
            ray.init(num_cpus=cpus, include_dashboard=False, **common)
    except ConnectionError as error:
        raise DocembedError(f"cannot reach the Ray cluster at {options.address}: {error}") from None
    finally:
        if on_term is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
    return True


def _pool_size(ray, options: RayOptions, shards: int) -> int:
    """--num-workers, capped by the shards to do and by what the cluster holds (a fixed-size actor pool that
    can never be placed would wait for ever)."""
    from docembed.runtime import log

    resources = ray.cluster_resources()
    fits = [options.num_workers, shards]
    for name, need in (("CPU", options.cpus_per_worker), ("GPU", options.gpus_per_worker)):
        if need:
            have = resources.get(name, 0)
            if have < need:
                flag = "--cpus-per-worker" if name == "CPU" else "--gpus-per-worker"
                raise DocembedError(f"{flag} {need:g}, but the Ray cluster has {have:g} {name}(s)")
            fits.append(int(have // need))
    size = min(fits)
    if size < min(options.num_workers, shards):
        log(f"ray: the cluster has room for {size} of the {options.num_workers} workers asked for")
    return size


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
) -> dict:
    """Encode INPUT into the shard directory OUTPUT (see the module docstring); returns the manifest."""
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
    model_spec = _model_spec(model)
    job = {
        # not skip_invalid: a run that stopped on a bad line resumes with --skip-invalid (see prepare_output)
        "input": {
            **{k: v for k, v in asdict(spec).items() if k != "skip_invalid"},
            "size": plan.size,
            "rows": plan.rows,
        },
        "model": model_spec,
        "ratio": ratio,
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
            "model": model_spec,
            "ratio": ratio,
            "batch_size": batch_size,
            "device": settings.device,
            "seed": settings.seed,
            "threads": max(1, int(options.cpus_per_worker)),
            "env": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
            "output": str(out.resolve()),
        }
        started_ray = _connect(ray, options, settings.verbose)
        try:
            workers = _pool_size(ray, options, len(todo))
            results = iter(_dataset(ray, todo, plan, task, workers, options).iter_rows())
            total = sum(s["stop"] - s["start"] for s in todo)
            started = last_write = time.perf_counter()
            done_rows = 0
            with progress_bar(f"encode [{model} on {workers} Ray worker(s)]", total=total) as bar:
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
    _finish(out, manifest, fresh)
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
