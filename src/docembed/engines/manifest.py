"""The shard plan and manifest of a `--engine ray` output directory (design: docs/ray-engine.md).

Shard i holds input rows [i*R, (i+1)*R) (R = --rows-per-shard), so a re-run maps the same rows to the same
file. A shard is skipped on a re-run when manifest.json describes the same job, lists the shard as done with
the same row range, its file holds that many rows and - without --skip-invalid - it dropped no invalid line.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from docembed.errors import DocembedError, UsageError
from docembed.io.readers import FORMATS, filesystem_of, infer_format, input_kind, line_offsets, parquet_files

DEFAULT_ROWS_PER_SHARD = 10_000


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


def resolve_input(
    path: str, format: str | None, id_field: str, text_field: str, skip_invalid: bool
) -> InputSpec:
    canonical = path if "://" in path else os.path.abspath(os.path.expanduser(path))
    kind = input_kind(canonical)
    if kind == "missing":
        raise DocembedError(f"input file not found: {path}")
    if format is None:
        format = "parquet" if kind == "dir" else infer_format(path)
    if format not in FORMATS:
        raise UsageError(f"unknown input format {format!r}; choose one of {', '.join(FORMATS)}")
    if kind == "dir" and format != "parquet":
        raise DocembedError(
            f"input is a directory, not a file: {path} (a directory is read as Parquet files)"
        )
    return InputSpec(canonical, format, id_field, text_field, skip_invalid)


def _shard_ranges(rows: int, rows_per_shard: int) -> list[tuple[int, int]]:
    return [(start, min(start + rows_per_shard, rows)) for start in range(0, rows, rows_per_shard)]


def plan_shards(spec: InputSpec, rows_per_shard: int) -> Plan:
    """Row ranges per shard: one pass over a text input (lines and where each shard starts), or the
    footers of a Parquet input."""
    if spec.format == "parquet":
        files, size = parquet_files(spec.path, spec.text_field)
        rows = sum(n for _, n in files)
        ranges = _shard_ranges(rows, rows_per_shard)
        offsets = [0] * len(ranges)
    else:
        filesystem, inner = filesystem_of(spec.path)
        size = filesystem.get_file_info(inner).size or 0
        rows, offsets = line_offsets(spec.path, rows_per_shard)
        files = []
        ranges = _shard_ranges(rows, rows_per_shard)
    if rows == 0:
        raise DocembedError("no documents to encode: the input is empty")
    return Plan(spec, size, rows, ranges, offsets, files)


def model_spec(model: str) -> str:
    """A saved model's directory as an absolute path: actors may run in another working directory."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def read_manifest(out: Path) -> dict | None:
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
    from docembed.io.embeddings import MANIFEST_NAME
    from docembed.io.outputs import atomic_path

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
    from docembed.io.embeddings import MANIFEST_NAME, shard_file_name
    from docembed.io.outputs import check_output
    from docembed.version import __version__

    # the shared rule for what may be written; whether an existing directory is resumed is decided below
    check_output(out, True, directory=True, inputs=[plan.input.path])
    old = None if overwrite else read_manifest(out)
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
            # its own file, never one the manifest names elsewhere (../outside.parquet, /etc/...)
            and done.get("file") == entry["file"]
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


def finish(out: Path, manifest: dict, fresh: dict[int, dict]) -> None:
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
