"""Embedding containers and their files.

Dense embeddings are a `(n, dim)` float32 array. Multi-vector embeddings (a variable number of vectors per
document, as NUGGET or all-token SBERT produce) are stored flat: `vectors[total, dim]`, `offsets[n + 1]`
(document i owns rows offsets[i]:offsets[i+1]) and optionally `positions[total]` (the token index each
vector came from). Both travel with `ids[n]` and a metadata dict (model, config hash, dim, normalized,
docembed version) in every container: .npy (+ sidecars), .npz, .safetensors, .parquet, .jsonl.
All writes are all or nothing (io/outputs.py): every file complete before any is renamed into place.

A *shard directory* (what `docembed encode --engine ray` writes) holds `part-00000.parquet`, ... - each one
an ordinary .parquet embeddings file of a contiguous slice of the input - and `manifest.json`, which lists
them in input order; `load_embeddings(DIR)` reads the whole directory back as one set.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.io.outputs import OutputSet, check_companions, check_output, describe_os_error
from docembed.types import EmbeddingSet, MultiVectors, Vectors, concat_vectors

OUTPUT_FORMATS = ("npy", "npz", "safetensors", "parquet", "jsonl")
BINARY_FORMATS = ("npy", "npz", "safetensors", "parquet")
MANIFEST_NAME = "manifest.json"


def shard_file_name(index: int) -> str:
    """The file name of shard `index` in a shard directory."""
    return f"part-{index:05d}.parquet"


def format_from_path(path: str) -> str:
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in OUTPUT_FORMATS:
        return suffix
    raise UsageError(f"cannot tell the output format of {path!r}: use one of .{', .'.join(OUTPUT_FORMATS)}")


def check_output_path(
    path: str, overwrite: bool, inputs: Sequence[str] = (), format: str | None = None
) -> None:
    """Fail early, before any work, on an output that may not be written (the rule: io/outputs.py), sidecars
    included when `path` is an embeddings set (`format`, or its suffix)."""
    check_output(path, overwrite, inputs=inputs)
    suffix = Path(path).suffix.lower().lstrip(".")
    format = format or (suffix if suffix in OUTPUT_FORMATS else None)
    if path != "-" and format:
        refuse_sidecar_name(Path(path))
        companions = set_companions(Path(path), format)
        _check_name_lengths(Path(path), companions)
        check_companions(Path(path), companions, inputs)
        refuse_foreign_sidecars(Path(path), format)


# The sidecars of a .npy set that are themselves .npy files: `x.scales.npy` is read as part of x.npy.
NPY_SIDECARS = ("offsets", "positions", "scales")


def refuse_sidecar_name(path: Path) -> None:
    """An output named as a sidecar of an existing .npy set (x.offsets.npy, x.positions.npy, x.scales.npy
    beside x.npy) would replace that set's file, or be read as one of its files: x.npy would be lost."""
    stem, _, kind = path.name.removesuffix(".npy").rpartition(".")
    if path.name.endswith(".npy") and stem and kind in NPY_SIDECARS:
        owner = path.with_name(f"{stem}.npy")
        if owner.is_file():
            raise DocembedError(
                f"output {path} is a sidecar name of the set {owner} (read as its {kind}): choose another "
                "output name"
            )


def _check_name_lengths(path: Path, companions: Sequence[Path]) -> None:
    """Before the work: a sidecar whose name the file system cannot hold would fail the write at the end."""
    from docembed.io.outputs import name_max

    limit = name_max(path.absolute().parent)
    for companion in companions:
        if len(companion.name.encode("utf-8", "surrogateescape")) > limit:
            raise DocembedError(
                f"output name too long: {path} (its sidecar {companion.name} would be over the file system's "
                f"{limit} bytes): choose a shorter name"
            )


def refuse_foreign_sidecars(path: Path, format: str) -> None:
    """A file at a sidecar name of an existing set that the set did not write (its meta.json says what it
    is: a dense set has no offsets/positions) is the user's: replacing the set must not delete it (a file
    at a sidecar name where there is no set at all: io.outputs.check_companions)."""
    if format != "npy" or not path.is_file():
        return
    try:
        metadata = _metadata(_sidecar(path, "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, DamagedSetError):
        return  # not a set docembed can read: the output rule alone decides
    if metadata.get("kind") not in ("dense", "multi"):
        return
    written = {"ids.txt", "meta.json"}
    if metadata["kind"] == "multi":
        written |= {"offsets.npy", "positions.npy"}
    if metadata.get("storage") == "int8":
        written.add("scales.npy")
    for kind in ("offsets.npy", "positions.npy", "scales.npy"):
        sidecar = _sidecar(path, kind)
        if kind not in written and os.path.lexists(sidecar):
            raise DocembedError(
                f"{sidecar} was not written by docembed with {path.name} (a {metadata['kind']} set): "
                "move it away or choose another output"
            )


def set_companions(path: Path, format: str) -> list[Path]:
    """Every file besides `path` that a set written there in `format` may have (its sidecars): a write
    checks them all and removes those of an old set it does not write again."""
    if format == "npy":
        sidecars = ("ids.txt", "meta.json", "offsets.npy", "positions.npy", "scales.npy")
        return [_sidecar(path, kind) for kind in sidecars]
    if format == "jsonl":
        return [_jsonl_meta(path)]
    return []


def _sidecar(path: Path, kind: str) -> Path:
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return path.with_name(f"{stem}.{kind}")


def _jsonl_meta(path: Path) -> Path:
    # not x.meta.json: that is the sidecar of x.npy, and the two may sit side by side
    return path.with_name(f"{path.name}.meta.json")


# Characters that end a line in x.ids.txt (a .npy set's ids, one per line) or in editors that read it.
LINE_BREAKS = ("\n", "\r", "\u2028", "\u2029", "\x85")


def check_ids(ids: Sequence[str], format: str) -> None:
    """Ids are strings; a .npy set stores them one per line, so there they may not hold a line break."""
    for position, doc_id in enumerate(ids):
        if not isinstance(doc_id, str):
            raise DocembedError(f"id #{position} is a {type(doc_id).__name__}, not a string")
        try:
            doc_id.encode("utf-8")
        except UnicodeEncodeError:  # no file format can hold it (and no reader of docembed makes one)
            raise DocembedError(f"id #{position} {doc_id!r} holds a lone surrogate: not text") from None
        if format == "npy" and any(c in doc_id for c in LINE_BREAKS):
            raise DocembedError(
                f"id #{position} {doc_id!r} holds a line break, which a .npy set cannot store "
                "(its ids are one per line): use .npz, .safetensors, .parquet or .jsonl"
            )


# How the binary formats may store vectors: float16 halves the bytes, int8 quarters them (one byte per value
# and one float32 scale per vector, symmetric: value * scale, largest magnitude at 127). Read back, every
# storage is float32 again, so search, rerank and index read any of them.
STORAGES = ("float32", "float16", "int8")


def stored_arrays(vectors: np.ndarray, storage: str) -> dict[str, np.ndarray]:
    """{"vectors"[, "scales"]} as `storage` keeps them, converted a block of rows at a time (each row on its
    own, so the result is that of one pass; a mapped output is never resident as a whole)."""
    from docembed.tensors import release_pages

    vectors = np.asarray(vectors, dtype=np.float32)
    if storage == "float32":
        return {"vectors": np.ascontiguousarray(vectors)}
    if storage not in ("float16", "int8"):
        raise UsageError(f"unknown storage {storage!r}; choose one of {', '.join(STORAGES)}")
    stored = np.empty(vectors.shape, dtype=np.float16 if storage == "float16" else np.int8)
    scales = np.empty(len(vectors), dtype=np.float32)
    for start in range(0, len(vectors), 65536):
        block, stop = vectors[start : start + 65536], min(start + 65536, len(vectors))
        if storage == "float16":
            stored[start:stop] = block
        else:
            scales[start:stop] = np.abs(block).max(axis=1, initial=0.0) / 127.0
            safe = np.where(scales[start:stop] > 0, scales[start:stop], 1.0)[:, None]
            stored[start:stop] = np.clip(np.rint(block / safe), -127, 127)
        release_pages(vectors)
    return {"vectors": stored} if storage == "float16" else {"vectors": stored, "scales": scales}


def restored_vectors(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The float32 vectors of `stored_arrays`' output (pops "scales")."""
    scales = arrays.pop("scales", None)
    if scales is None:
        return arrays["vectors"]
    vectors = arrays["vectors"]
    if vectors.dtype != np.int8 or scales.shape != (len(vectors),):
        raise DamagedSetError(f"int8 vectors {vectors.shape} do not match their scales {scales.shape}")
    return vectors.astype(np.float32) * scales.astype(np.float32)[:, None]


def check_storage(path: str, format: str | None, storage: str) -> str:
    """The output format of `path` (or `format`), refused when it cannot hold `storage`'s vectors."""
    format = format or ("jsonl" if path == "-" else format_from_path(path))
    if format not in OUTPUT_FORMATS:
        raise UsageError(f"unknown output format {format!r}; choose one of {', '.join(OUTPUT_FORMATS)}")
    if storage not in STORAGES:
        raise UsageError(f"unknown storage {storage!r}; choose one of {', '.join(STORAGES)}")
    suffix = Path(path).suffix.lower().lstrip(".")
    if path != "-" and suffix != format:  # a set is read back by its extension: x.npy holding parquet is lost
        raise UsageError(
            f"--output-format {format} does not match -o {path} (the format follows the extension): "
            f"name the output .{format}, or drop --output-format"
        )
    if storage != "float32" and format not in ("npy", "npz", "safetensors"):
        raise UsageError(f"--storage {storage} is for npy, npz and safetensors outputs, not {format}")
    return format


def first_non_finite_row(data, rows_at_once: int = 65536) -> int | None:
    """The first row of `data` holding a NaN or an infinity, looked for a block of rows at a time: a mask of
    the whole output would cost a quarter of its size again (400 MB for one 50 MB document's nuggets)."""
    from docembed.tensors import release_pages

    for start in range(0, len(data), rows_at_once):
        bad = ~np.isfinite(data[start : start + rows_at_once]).all(axis=1)
        release_pages(data)  # a spilled output is read a block at a time, never resident as a whole
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def save_embeddings(
    emb: EmbeddingSet,
    path: str,
    format: str | None = None,
    overwrite: bool = True,
    inputs: Sequence[str] = (),
    storage: str = "float32",
) -> list[Path]:
    """Write `emb` to `path` (format from the suffix unless given); '-' writes JSON Lines to stdout.
    All files of the set are written completely before any is renamed into place; with overwrite=False an
    output that appeared meanwhile (another process) is an error, not replaced. `storage` (npy, npz,
    safetensors): float32, float16 or int8 (STORAGES). Returns the files written."""
    format = check_storage(path, format, storage)
    check_ids(emb.ids, format)
    row = first_non_finite_row(emb.data.vectors if emb.is_multi else np.asarray(emb.data))
    if row is not None:  # `load_embeddings` refuses such a set: never written
        raise DocembedError(f"vector row {row} holds NaN or infinite values: nothing written to {path}")
    if path != "-":
        refuse_foreign_sidecars(Path(path), format)
    metadata = dict(emb.metadata, dim=emb.dim, count=len(emb), kind="multi" if emb.is_multi else "dense")
    metadata.pop("storage", None)  # a set read back (merge) carries its own: this write's is what it holds
    if storage != "float32":
        metadata["storage"] = storage
    if path == "-":
        if format in BINARY_FORMATS:
            if sys.stdout.isatty():
                raise UsageError(f"refusing to write binary {format} to a terminal: use -o FILE")
            raise UsageError(f"{format} cannot be streamed to stdout: use -o FILE or --format jsonl")
        _write_jsonl(emb, sys.stdout)
        sys.stdout.flush()
        return []
    target = Path(path)
    writers = {
        "npy": _save_npy,
        "npz": _save_npz,
        "safetensors": _save_safetensors,
        "parquet": _save_parquet,
        "jsonl": _save_jsonl,
    }
    refuse_sidecar_name(target)
    with OutputSet(target, overwrite, inputs, set_companions(target, format)) as output:
        try:
            writers[format](emb, target, metadata, output, storage)
        except OSError as error:  # named here: the writers' errors name a temporary file, or nothing
            raise DocembedError(f"cannot write {target}: {describe_os_error(error, path=False)}") from None
        return output.commit()


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_jsonl(emb: EmbeddingSet, handle) -> None:
    data = emb.data
    for i, doc_id in enumerate(emb.ids):
        if isinstance(data, MultiVectors):
            row = {"id": doc_id, "vectors": data[i].tolist()}
            if data.positions is not None:
                row["positions"] = data.positions[data.offsets[i] : data.offsets[i + 1]].tolist()
        else:
            row = {"id": doc_id, "vector": data[i].tolist()}
        handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _save_jsonl(emb: EmbeddingSet, target: Path, metadata: dict, output: OutputSet, storage: str) -> None:
    with open(output.temporary(target), "w", encoding="utf-8") as handle:
        _write_jsonl(emb, handle)
    _write_json(output.temporary(_jsonl_meta(target)), metadata)


def _save_npy(emb: EmbeddingSet, target: Path, metadata: dict, output: OutputSet, storage: str) -> None:
    # .npy holds one array, so ids, metadata, (multi-vector) offsets/positions and int8 scales go in
    # sidecar files
    output.temporary(_sidecar(target, "ids.txt")).write_text(
        "".join(f"{i}\n" for i in emb.ids), encoding="utf-8"
    )
    _write_json(output.temporary(_sidecar(target, "meta.json")), metadata)
    arrays = _arrays(emb, storage)
    for name, array in arrays.items():
        path = target if name == "vectors" else _sidecar(target, f"{name}.npy")
        with open(output.temporary(path), "wb") as handle:
            _write_npy(handle, array)


def _write_npy(handle, array: np.ndarray) -> None:
    """np.save's bytes, the rows written a block at a time (an output mapped from its spill file is never
    made resident as a whole: tensors.write_rows)."""
    from docembed.tensors import write_rows

    array = np.asanyarray(array)
    if array.ndim != 2 or array.dtype.hasobject:
        np.save(handle, array)
        return
    np.lib.format.write_array_header_1_0(handle, np.lib.format.header_data_from_array_1_0(array))
    write_rows(handle, array)


def _arrays(emb: EmbeddingSet, storage: str = "float32") -> dict[str, np.ndarray]:
    if isinstance(emb.data, MultiVectors):
        arrays = {**stored_arrays(emb.data.vectors, storage), "offsets": emb.data.offsets}
        if emb.data.positions is not None:
            arrays["positions"] = emb.data.positions
        return arrays
    return stored_arrays(emb.data, storage)


def _save_npz(emb: EmbeddingSet, target: Path, metadata: dict, output: OutputSet, storage: str) -> None:
    arrays = _arrays(emb, storage)
    # one JSON array, not a numpy string array: those drop an id's trailing NUL characters
    arrays["ids"] = np.array(json.dumps(emb.ids, ensure_ascii=False))
    arrays["metadata"] = np.array(json.dumps(metadata))
    with open(output.temporary(target), "wb") as handle:
        np.savez(handle, **arrays)


def _save_safetensors(
    emb: EmbeddingSet, target: Path, metadata: dict, output: OutputSet, storage: str
) -> None:
    from safetensors.numpy import save_file

    header = {"docembed": json.dumps(metadata), "ids": json.dumps(emb.ids, ensure_ascii=False)}
    save_file(_arrays(emb, storage), str(output.temporary(target)), metadata=header)


def _save_parquet(emb: EmbeddingSet, target: Path, metadata: dict, output: OutputSet, storage: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = _arrays(emb)
    flat = pa.array(arrays["vectors"].reshape(-1), type=pa.float32())
    vectors = pa.FixedSizeListArray.from_arrays(flat, emb.dim)
    columns = {"id": pa.array(emb.ids, type=pa.string())}
    if isinstance(emb.data, MultiVectors):
        offsets = pa.array(emb.data.offsets.astype(np.int32))
        columns["vectors"] = pa.ListArray.from_arrays(offsets, vectors)
        if emb.data.positions is not None:
            columns["positions"] = pa.ListArray.from_arrays(offsets, pa.array(emb.data.positions))
    else:
        columns["vector"] = vectors
    table = pa.table(columns).replace_schema_metadata({"docembed": json.dumps(metadata)})
    pq.write_table(table, output.temporary(target))


def load_embeddings(path: str) -> EmbeddingSet:
    """Read back any file that `save_embeddings` writes."""
    target = Path(path)
    if not target.exists():
        raise DocembedError(f"embeddings file not found: {path}")
    if target.is_dir():
        return load_embedding_shards(target)
    format = format_from_path(path)
    try:
        emb = {
            "npy": _load_npy,
            "npz": _load_npz,
            "safetensors": _load_safetensors,
            "parquet": _load_parquet,
            "jsonl": _load_jsonl,
        }[format](target)
        return _checked(emb)
    except RecursionError:  # json.loads of a deeply nested value
        raise DocembedError(f"cannot read embeddings from {path}: JSON nested too deeply") from None
    except READ_ERRORS as error:
        raise DocembedError(f"cannot read embeddings from {path}: {_read_error_reason(error)}") from None


def _read_error_reason(error: Exception) -> str:
    """What a read error says, in one line (a library's message may span several) a user can act on."""
    if isinstance(error, KeyError):  # an array or field the file should hold (npz: "ids", "metadata")
        return f"it holds no {error.args[0]!r}: not a set docembed wrote, or damaged"
    if isinstance(error, ValueError) and "allow_pickle" in str(error):  # numpy's advice is not ours to give
        return "it holds Python objects (a pickle), which docembed never loads: not a set docembed wrote"
    return " ".join(str(error).split()) or type(error).__name__


class DamagedSetError(ValueError):
    """What a loader found wrong in a file it could read (load_embeddings names the file)."""


# What reading a truncated, foreign or damaged file raises: numpy (ValueError, EOFError: a zero-byte .npy),
# zipfile (a truncated .npz), pyarrow (ArrowInvalid is a ValueError), json, safetensors (converted to a
# DamagedSetError in _load_safetensors), a str(int) of a 5,000-digit JSON number (ValueError).
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, zipfile.BadZipFile)


def _checked(emb: EmbeddingSet) -> EmbeddingSet:
    """Refuse what no writer of docembed produces: metadata that is not an object, ids that are not strings,
    vectors that are not a 2-D float array (or, multi-vector, offsets that do not fit them), a width or count
    other than the metadata's, NaN or infinite values."""
    if not isinstance(emb.metadata, dict):
        raise DamagedSetError(f"its metadata is a JSON {type(emb.metadata).__name__}, not an object")
    if not all(isinstance(doc_id, str) for doc_id in emb.ids):
        raise DamagedSetError("its ids are not all strings")
    multi = emb.data if isinstance(emb.data, MultiVectors) else None
    vectors = multi.vectors if multi is not None else emb.data
    if not isinstance(vectors, np.ndarray) or vectors.ndim != 2:
        raise DamagedSetError(f"expected a 2-D array of vectors, found shape {np.shape(vectors)}")
    if not np.issubdtype(vectors.dtype, np.floating):
        raise DamagedSetError(f"expected float vectors, found {vectors.dtype}")
    if multi is not None and not np.issubdtype(multi.offsets.dtype, np.integer):
        raise DamagedSetError(f"expected integer offsets, found {multi.offsets.dtype}")
    for key, found in (("dim", emb.dim), ("count", len(emb))):
        if emb.metadata.get(key) not in (None, found):
            raise DamagedSetError(f"its metadata says {key} {emb.metadata[key]!r}, the file holds {found}")
    if not np.isfinite(vectors).all():
        rows = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
        raise DamagedSetError(f"{len(rows)} vector(s) hold NaN or infinite values")
    if vectors.dtype != np.float32:
        emb.data = (
            MultiVectors(vectors.astype(np.float32), multi.offsets, multi.positions)
            if multi
            else (vectors.astype(np.float32))
        )
    return emb


def _read_meta(path: Path) -> dict:
    return _metadata(path.read_text(encoding="utf-8")) if path.exists() else {}


def _metadata(text: str | bytes) -> dict:
    metadata = json.loads(text)
    if not isinstance(metadata, dict):
        raise DamagedSetError(f"its metadata is a JSON {type(metadata).__name__}, not an object")
    return metadata


def _load_npy(target: Path) -> EmbeddingSet:
    vectors = np.load(target, allow_pickle=False)
    # split on \n only: str.splitlines would also split ids at \v, \f, U+2028 ...
    ids = _sidecar(target, "ids.txt").read_text(encoding="utf-8").split("\n")[:-1]
    offsets_path = _sidecar(target, "offsets.npy")
    positions_path = _sidecar(target, "positions.npy")
    scales_path = _sidecar(target, "scales.npy")
    if scales_path.exists():
        vectors = restored_vectors({"vectors": vectors, "scales": np.load(scales_path, allow_pickle=False)})
    data: Vectors = vectors
    if offsets_path.exists():
        positions = np.load(positions_path, allow_pickle=False) if positions_path.exists() else None
        data = MultiVectors(vectors, np.load(offsets_path, allow_pickle=False), positions)
    return EmbeddingSet(data, ids, _read_meta(_sidecar(target, "meta.json")))


def _assemble(arrays: dict, ids: list[str], metadata: dict) -> EmbeddingSet:
    arrays["vectors"] = restored_vectors(arrays)
    if "offsets" in arrays:
        data: Vectors = MultiVectors(arrays["vectors"], arrays["offsets"], arrays.get("positions"))
    else:
        data = arrays["vectors"]
    return EmbeddingSet(data, ids, metadata)


def _load_npz(target: Path) -> EmbeddingSet:
    with np.load(target, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files}
    stored = arrays.pop("ids")  # a JSON array (0-d), or one string per id (1-d: older files)
    ids = json.loads(str(stored)) if stored.ndim == 0 else [str(i) for i in stored]
    metadata = _metadata(str(arrays.pop("metadata")))
    return _assemble(arrays, ids, metadata)


def _load_safetensors(target: Path) -> EmbeddingSet:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(target), framework="numpy") as handle:
            header = handle.metadata() or {}
            arrays = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    except SafetensorError as error:  # a garbage or truncated file
        raise DamagedSetError(f"not a safetensors file ({error})") from None
    return _assemble(arrays, json.loads(header.get("ids", "[]")), _metadata(header.get("docembed", "{}")))


def _load_parquet(target: Path) -> EmbeddingSet:
    import pyarrow.parquet as pq

    table = pq.read_table(target)
    raw = (table.schema.metadata or {}).get(b"docembed", b"{}")
    metadata = _metadata(raw)
    ids = table.column("id").to_pylist()
    dim = metadata.get("dim")
    if "vectors" in table.column_names:
        column = table.column("vectors").combine_chunks()
        offsets = column.offsets.to_numpy().astype(np.int64)
        flat = column.values.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        vectors = flat.reshape(-1, dim or column.values.type.list_size)
        positions = None
        if "positions" in table.column_names:
            positions = table.column("positions").combine_chunks().values.to_numpy().astype(np.int64)
        return EmbeddingSet(MultiVectors(vectors, offsets - offsets[0], positions), ids, metadata)
    column = table.column("vector").combine_chunks()
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    # the list size, not -1: a shard with no rows (every line skipped as invalid) still has a width
    width = getattr(column.type, "list_size", -1)
    return EmbeddingSet(flat.reshape(len(ids), width), ids, metadata)


def load_embedding_shards(directory: str | Path) -> EmbeddingSet:
    """Every shard of a shard directory, concatenated in input order (the order manifest.json lists them).
    An unfinished directory is an error that says how to finish it."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.exists():
        raise DocembedError(
            f"{directory} is a directory without {MANIFEST_NAME}: not a docembed shard directory"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        shards = manifest["shards"]
        if not all(isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards):
            raise ValueError("every shard must be an object with a 'file'")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise DocembedError(f"cannot read {manifest_path}: {error}") from None
    from docembed.io.readers import inside

    files = [inside(directory, s["file"], manifest_path) for s in shards]  # never another folder's files
    missing = [
        s["file"] for s, f in zip(shards, files, strict=True) if s.get("status") != "done" or not f.exists()
    ]
    if missing:
        raise DocembedError(
            f"{directory} is incomplete: {len(missing)} of {len(shards)} shards not written "
            f"(first: {missing[0]}); re-run the same `docembed encode --engine ray` command to finish it"
        )
    if not shards:
        raise DocembedError(f"{directory} lists no shards")
    return concat_sets([load_embeddings(str(file)) for file in files])


# What must agree for two sets to be parts of one: the same model, config, kind and width.
SAME_MODEL_KEYS = ("model", "family", "config_hash", "dim", "kind", "normalized", "model_source")


def check_same_model(parts: list[EmbeddingSet], names: list[str]) -> None:
    """Parts of one set come from the same model: the metadata in SAME_MODEL_KEYS agree."""
    first = parts[0].metadata
    for name, part in zip(names, parts, strict=True):
        differs = [k for k in SAME_MODEL_KEYS if part.metadata.get(k) != first.get(k)]
        if differs:
            key = differs[0]
            raise DocembedError(
                f"{names[0]} and {name} come from different models ({key}: "
                f"{first.get(key)!r} vs {part.metadata.get(key)!r})"
            )


def order_shards(parts: list[EmbeddingSet], names: list[str]) -> list[int]:
    """The order in which `encode --shard i/n` outputs concatenate to their whole input, read from their
    provenance (metadata "shard": i, n, input, row range): whatever order they are given in (a shell glob
    puts part10 before part2). Refused, naming the parts: parts of different inputs (or another version of
    the input) or of different n, a shard given twice or overlapping rows, a missing shard (a gap), and a mix
    of parts with and without provenance. Parts without any provenance keep the order given."""
    shards = [part.metadata.get("shard") for part in parts]
    with_provenance = [i for i, shard in enumerate(shards) if isinstance(shard, dict)]
    if not with_provenance:
        return list(range(len(parts)))
    if len(with_provenance) != len(parts):
        plain = next(i for i, shard in enumerate(shards) if not isinstance(shard, dict))
        raise DocembedError(
            f"{names[plain]} records no shard (not written by `encode --shard`) but "
            f"{names[with_provenance[0]]} does: merge the parts of one sharded run"
        )
    try:
        first = shards[0]
        for name, shard in zip(names, shards, strict=True):
            if shard["input"] != first["input"]:
                raise DocembedError(
                    f"{names[0]} and {name} are shards of different inputs "
                    f"({first['input']} vs {shard['input']})"
                )
            for key in ("input_size", "input_mtime_ns", "rows"):
                if shard.get(key) != first.get(key):
                    raise DocembedError(
                        f"{names[0]} and {name} are shards of different versions of {first['input']} "
                        f"({key} {first.get(key)} vs {shard.get(key)}): re-encode the older shards"
                    )
            if shard["count"] != first["count"]:
                raise DocembedError(
                    f"{names[0]} is shard {first['index']}/{first['count']} but {name} is shard "
                    f"{shard['index']}/{shard['count']}: parts of different --shard N"
                )
        order = sorted(range(len(parts)), key=lambda i: (shards[i]["start"], shards[i]["index"]))
        count, rows, expected = first["count"], first["rows"], 0
        seen: dict[int, str] = {}
        for i in order:
            shard, name = shards[i], names[i]
            if shard["index"] in seen:
                raise DocembedError(
                    f"{seen[shard['index']]} and {name} are both shard {shard['index']}/{count}: "
                    "a shard given twice"
                )
            seen[shard["index"]] = name
        missing = sorted(set(range(count)) - set(seen))
        if missing:
            listed = ", ".join(f"{m}/{count}" for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise DocembedError(
                f"missing shard(s) {listed} of {first['input']}: the parts do not cover the input "
                f"({len(seen)} of {count} given)"
            )
        for i in order:
            shard = shards[i]
            if shard["start"] != expected:
                raise DocembedError(
                    f"{names[i]} starts at row {shard['start']}, the shards before it end at row {expected}: "
                    "a gap or an overlap"
                )
            expected = shard["stop"]
        if expected != rows:
            raise DocembedError(f"the shards cover rows 0-{expected} of {rows}: the last rows are missing")
    except (KeyError, TypeError) as error:
        raise DocembedError(f"unreadable shard provenance in the parts' metadata ({error!r})") from None
    return order


def concat_sets(parts: list[EmbeddingSet], names: list[str] | None = None) -> EmbeddingSet:
    """Parts of one set (shards, `--shard i/n` outputs) concatenated in order, after checking they come
    from the same model (the metadata in SAME_MODEL_KEYS agree)."""
    names = names or [f"part {i}" for i in range(len(parts))]
    check_same_model(parts, names)
    check_same_storage(parts, names)
    non_empty = [p for p in parts if len(p)] or parts[:1]
    metadata = dict(non_empty[0].metadata, count=sum(len(p) for p in parts))
    metadata.pop("text_hashes", None)
    hashes = _joined_text_hashes(non_empty)
    if hashes is not None:
        metadata["text_hashes"] = hashes
    metadata.pop("coverage", None)
    coverage = _joined_coverage(parts)
    if coverage is not None:
        metadata["coverage"] = coverage
    data = concat_vectors([p.data for p in non_empty])
    return EmbeddingSet(data, [i for p in non_empty for i in p.ids], metadata)


def check_same_storage(parts: list[EmbeddingSet], names: list[str]) -> None:
    """Parts stored in other precisions (int8 and float32) joined into one set: the rounder rows would pass
    for the finer ones, or the finer for the rounder, in silence."""
    kinds = [p.metadata.get("storage", "float32") for p in parts]
    for name, kind in zip(names, kinds, strict=True):
        if kind != kinds[0]:
            raise DocembedError(
                f"{names[0]} holds {kinds[0]} vectors and {name} {kind} ones: one set holds one precision; "
                "encode the parts with the same --storage"
            )


COVERAGE_COUNTS = ("documents", "documents_cut", "tokens", "tokens_not_read")


def _joined_coverage(parts: list[EmbeddingSet]) -> dict | None:
    """What the parts' model did not read (`encode`'s `coverage`), summed over the parts; None unless every
    part says it for the same token limit (one part's figures would pass for the whole set's)."""
    found = [p.metadata.get("coverage") for p in parts]
    if not found or not all(isinstance(c, dict) for c in found):
        return None
    if len({c.get("max_tokens") for c in found}) != 1:
        return None
    try:
        joined = {"max_tokens": found[0]["max_tokens"]}
        joined |= {key: sum(int(c[key]) for c in found) for key in COVERAGE_COUNTS}
    except (KeyError, TypeError, ValueError):
        return None
    share = joined["tokens_not_read"] / joined["tokens"] if joined["tokens"] else 0.0
    return {**joined, "share_not_read": round(share, 6)}


def _joined_text_hashes(parts: list[EmbeddingSet]) -> dict | None:
    """The parts' per-row text digests (what `encode --reuse` reads) joined in order; None unless every part
    has them in the same scheme (a row without one would be mistaken for another)."""
    import base64

    found = [p.metadata.get("text_hashes") for p in parts]
    if not found or not all(isinstance(h, dict) and len(h) == 1 for h in found):
        return None
    schemes = {next(iter(h)) for h in found}
    if len(schemes) != 1 or not all(isinstance(v, str) for h in found for v in h.values()):
        return None
    scheme = schemes.pop()
    try:
        joined = b"".join(base64.b64decode(h[scheme], validate=True) for h in found)
    except ValueError:
        return None
    return {scheme: base64.b64encode(joined).decode("ascii")}


def _load_jsonl(target: Path) -> EmbeddingSet:
    ids, dense, multi, positions = [], [], [], []
    with open(target, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            try:
                row = json.loads(line)
                ids.append(str(row["id"]))
                if "vectors" in row:
                    multi.append(np.asarray(row["vectors"], dtype=np.float32))
                    positions.append(np.asarray(row.get("positions", []), dtype=np.int64))
                else:
                    dense.append(np.asarray(row["vector"], dtype=np.float32))
            except (*READ_ERRORS, AttributeError) as error:
                raise DamagedSetError(f"line {line_number}: {type(error).__name__}: {error}") from None
    meta_path = _jsonl_meta(target)
    metadata = _read_meta(meta_path if meta_path.exists() else _sidecar(target, "meta.json"))  # older sets
    if multi:
        dim = metadata.get("dim") or max((m.shape[-1] for m in multi if m.size), default=0)
        multi = [m.reshape(len(m), dim) for m in multi]
        keep_positions = all(len(p) == len(m) for p, m in zip(positions, multi, strict=True))
        data: Vectors = MultiVectors.from_list(multi, positions if keep_positions else None)
    elif not ids and metadata.get("kind") == "multi":  # an empty multi-vector part (`encode --shard`)
        data = MultiVectors(np.zeros((0, int(metadata.get("dim") or 0)), np.float32), np.zeros(1, np.int64))
    else:  # no rows: the width the metadata says, as the binary formats keep it
        width = -1 if ids else int(metadata.get("dim") or 0)
        data = np.asarray(dense, dtype=np.float32).reshape(len(ids), width)
    return EmbeddingSet(data, ids, metadata)
