"""Streamed document readers: JSON Lines, plain text (one document per line), `id<TAB>text` and Parquet.

One source of rows for both engines: the local engine iterates a `DocumentReader`; the Ray engine's actors
call `read_range` on row ranges that the driver planned with `line_offsets` / `parquet_files`. Inputs are a
local file, '-' (stdin, text formats only) or any URI pyarrow's filesystems open (s3://, gs://, file://);
text inputs may be gzipped (.gz); a Parquet input may be a directory of files, read in path order.
Documents are yielded one at a time (gensim-style iterables that can be iterated again), so memory does
not grow with the corpus. Every malformed record is reported with its file and line (or row) number, or
skipped and counted with `skip_invalid=True`. Empty texts are kept so output rows always match input rows;
blank lines of JSON Lines and TSV (documents, pairs, tasks alike) hold no record and are skipped and counted.
A UTF-8 byte order mark at the start of a text input is dropped. Ids are strings or numbers.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from docembed.errors import DocembedError, InputFormatError, UsageError

TEXT_FORMATS = ("jsonl", "txt", "tsv")
FORMATS = (*TEXT_FORMATS, "parquet")
PARQUET_SUFFIXES = (".parquet", ".pq")
BOM = b"\xef\xbb\xbf"


class Document(NamedTuple):
    id: str
    text: str


@dataclass(frozen=True)
class Shard:
    """The `index`-th (0-based) of `count` contiguous slices of the input."""

    index: int
    count: int

    @classmethod
    def parse(cls, spec: str | None) -> Shard | None:
        if not spec:
            return None
        try:
            index, count = (int(part) for part in spec.split("/"))
        except ValueError:
            raise UsageError(f"--shard expects I/N (e.g. 0/4), got {spec!r}") from None
        if count < 1 or not 0 <= index < count:
            raise UsageError(f"--shard {spec}: I must be in 0..N-1 and N >= 1")
        return cls(index, count)

    def bounds(self, total: int) -> tuple[int, int]:
        """Contiguous [start, stop) so that the shards' outputs concatenate to the whole input in order."""
        return total * self.index // self.count, total * (self.index + 1) // self.count


def infer_format(path: str) -> str:
    name = path.lower().rstrip("/").removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".tsv"):
        return "tsv"
    if name.endswith(".txt"):
        return "txt"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise UsageError(f"cannot tell the format of {path!r} from its name: pass --format jsonl|txt|tsv|parquet")


# --- opening local files and URIs -------------------------------------------------------------------------
def inside(folder: Path, name, source: Path) -> Path:
    """`folder / name` for a plain file or folder name read from the metadata file `source`: a name with a
    path separator, `..`, an absolute path or a link leading out of `folder` is refused in one line naming
    `source` (followed, it would read another folder's files as this one's)."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
    if not plain or not (folder / name).resolve().is_relative_to(folder.resolve()):
        raise DocembedError(f"{source}: {name!r} is not a name inside {folder}: refused")
    return folder / name


def filesystem_of(path: str):
    """(pyarrow filesystem, path within it) for a local path or a URI."""
    from pyarrow import fs

    if "://" not in path:
        return fs.LocalFileSystem(), os.path.abspath(path)
    try:
        return fs.FileSystem.from_uri(path)
    except (ValueError, OSError) as error:  # ArrowInvalid is a ValueError
        raise DocembedError(f"cannot open {path}: {error}") from None


def input_kind(path: str) -> str:
    """'file', 'dir' or 'missing' (local paths without importing pyarrow)."""
    if "://" not in path:
        p = Path(path)
        return "dir" if p.is_dir() else "file" if p.exists() else "missing"
    from pyarrow import fs

    filesystem, inner = filesystem_of(path)
    kind = filesystem.get_file_info(inner).type
    return {fs.FileType.Directory: "dir", fs.FileType.NotFound: "missing"}.get(kind, "file")


@contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """A binary reader of stdin ('-'), a local file or a URI, decompressed when the name ends in .gz.
    Local and URI readers are seekable (seeking in gzip decompresses from the start). OS errors on opening
    (missing, a directory, permission denied) are DocembedErrors naming the path."""
    if path == "-":
        if sys.stdin is None:  # started with stdin closed (`<&-`)
            raise DocembedError("cannot read the input from stdin: stdin is closed")
        yield sys.stdin.buffer
        return
    with ExitStack() as stack:
        try:
            if "://" in path:
                filesystem, inner = filesystem_of(path)
                raw = filesystem.open_input_file(inner)
                handle = stack.enter_context(io.BufferedReader(raw, 1 << 20))
            else:
                handle = stack.enter_context(open(path, "rb"))  # noqa: SIM115
            if path.endswith(".gz"):
                handle = stack.enter_context(gzip.GzipFile(fileobj=handle))
        except FileNotFoundError:
            raise DocembedError(f"input file not found: {path}") from None
        except IsADirectoryError:
            raise DocembedError(f"input is a directory, not a file: {path}") from None
        except OSError as error:
            raise DocembedError(f"cannot open {path}: {error.strerror or error}") from None
        yield handle


def peek_first_line(path: str) -> tuple[bytes, int] | None:
    """(the first non-blank line, its 0-based index) of a text input, or None when it has none. From stdin
    only the bytes already buffered are looked at and nothing is consumed."""
    if path == "-":
        if sys.stdin is None:
            return None
        buffer = getattr(sys.stdin, "buffer", None)
        try:
            data = buffer.peek(1 << 16) if hasattr(buffer, "peek") else b""
        except (OSError, ValueError):
            return None
        lines = data.split(b"\n")[:-1]  # the last piece may be an unfinished line
        return next(((raw, i) for i, raw in enumerate(lines) if raw.strip()), None)
    try:
        with open_input(path) as handle:
            for index, raw in enumerate(handle):
                if raw.strip():
                    return raw, index
                if index > 10_000:  # a file of blank lines: leave the rest to the reading itself
                    return None
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DocembedError(f"{path}: cannot read: {error}") from None
    return None


def require_regular_file(path: str, what: str) -> None:
    """`what` reads the input twice (it counts lines first): a pipe (a FIFO, /dev/stdin, a process
    substitution) would block for ever on the second read, so it is refused up front."""
    if "://" in path or path == "-":
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: opening it says so
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UsageError(
            f"{what} needs a regular file (it reads the input twice), but {path} is a pipe or device"
        )


def count_lines(path: str) -> int:
    """Number of records a text input holds (a final line without a newline counts)."""
    return line_offsets(path, 0)[0]


def line_offsets(path: str, every: int) -> tuple[int, list[int]]:
    """(line count, byte offset where lines 0, every, 2*every, ... start), in one pass of 4 MiB blocks.
    every=0: the count only."""
    import numpy as np

    if every:  # ranges are read again later, by seeking (the Ray engine's shards)
        require_regular_file(path, "--engine ray")
    offsets, lines, position, last = [0], 0, 0, b"\n"
    next_start = every  # the line that starts the next range
    try:
        with open_input(path) as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                # line L starts right after the L-th newline of the file: here, newline L - 1 - lines
                while every and next_start - 1 - lines < len(newlines):
                    offsets.append(position + int(newlines[next_start - 1 - lines]) + 1)
                    next_start += every
                lines += len(newlines)
                position += len(block)
                last = block[-1:]
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DocembedError(f"{path}: cannot read: {error}") from None
    rows = lines + (last != b"\n")
    n_ranges = -(-rows // every) if every else 0
    return rows, offsets[:n_ranges]


def parquet_files(path: str, text_field: str) -> tuple[list[tuple[str, int]], int]:
    """([(file, rows)] in path order, total bytes) of a Parquet file or directory, checking every file has
    a string column `text_field`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem, inner = filesystem_of(path)
    info = filesystem.get_file_info(inner)
    if info.type == fs.FileType.NotFound:
        raise DocembedError(f"input file not found: {path}")
    if info.type == fs.FileType.Directory:
        found = filesystem.get_file_info(fs.FileSelector(inner, recursive=True))
        infos = sorted(
            (i for i in found if i.type == fs.FileType.File and i.path.endswith(PARQUET_SUFFIXES)),
            key=lambda i: i.path,
        )
        # skip the _SUCCESS / .crc style bookkeeping files that writers leave beside the data
        infos = [
            i
            for i in infos
            if not any(p.startswith((".", "_")) for p in Path(i.path).relative_to(inner).parts)
        ]
        if not infos:
            raise DocembedError(f"{path}: no .parquet files in this directory")
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
        if text_field not in schema.names:
            raise DocembedError(
                f"{item.path}: no text column {text_field!r} (columns: {', '.join(schema.names)}); "
                "pass --text-field"
            )
        kind = schema.field(text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DocembedError(f"{item.path}: text column {text_field!r} holds {kind}, not strings")
        files.append((item.path, rows))
    return files, sum(i.size or 0 for i in infos)


# --- the reader -------------------------------------------------------------------------------------------
class DocumentReader:
    """Iterable over the documents of one input. Iterate again to re-read (not for stdin)."""

    def __init__(
        self,
        path: str,
        format: str | None = None,
        id_field: str = "id",
        text_field: str = "text",
        skip_invalid: bool = False,
        shard: Shard | None = None,
        files: list[tuple[str, int]] | None = None,
    ):
        if path == "-" and format is None:
            raise UsageError("reading from stdin ('-') needs an explicit --format jsonl|txt|tsv")
        if path == "-" and shard is not None:
            raise UsageError("--shard needs a file (it counts lines first), not stdin")
        if shard is not None:
            require_regular_file(path, "--shard")
        if format is None and path != "-" and input_kind(path) == "dir":
            format = "parquet"  # a directory is read as Parquet files
        self.path = path
        self.format = format or infer_format(path)
        if self.format not in FORMATS:
            raise UsageError(f"unknown input format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if path == "-" and self.format == "parquet":
            raise UsageError("Parquet cannot be read from stdin: pass a file")
        self.id_field, self.text_field = id_field, text_field
        self.skip_invalid = skip_invalid
        self.shard = shard
        self.skipped = 0
        self.blank = 0
        self.name = "<stdin>" if path == "-" else path
        self._files = files  # Parquet: (file, rows), planned once
        self._bounds: tuple[int, int] | None = None
        self._total: int | None = None

    def check(self) -> None:
        """Read the first record now, so that a missing or unreadable input, a wrong format or a missing
        field is reported before any model loads (stdin: only what has already arrived is looked at)."""
        if self.format == "parquet":
            self.files()
            return
        first = peek_first_line(self.path)
        if first is not None and not self.skip_invalid:
            self.parse_record(*first)

    def files(self) -> list[tuple[str, int]]:
        if self._files is None:
            self._files = parquet_files(self.path, self.text_field)[0]
        return self._files

    def total_rows(self) -> int:
        if self.format == "parquet":
            return sum(rows for _, rows in self.files())
        return count_lines(self.path)

    def bounds(self) -> tuple[int, int | None]:
        if self.shard is None:
            return 0, None
        if self._bounds is None:
            self._total = self.total_rows()
            self._bounds = self.shard.bounds(self._total)
        return self._bounds

    def shard_provenance(self) -> dict | None:
        """What an `encode --shard i/n` output records (metadata "shard") so that `docembed merge` can order
        parts and tell a gap, an overlap or a part of another input: i, n, the input (absolute path, size,
        mtime), its row count and the rows [start, stop) this shard holds. None without --shard."""
        if self.shard is None:
            return None
        start, stop = self.bounds()
        info = os.stat(self.path)
        return {
            "index": self.shard.index,
            "count": self.shard.count,
            "input": os.path.abspath(self.path),
            "input_size": info.st_size,
            "input_mtime_ns": info.st_mtime_ns,
            "rows": self._total,
            "start": start,
            "stop": stop,
        }

    def __len__(self) -> int:
        start, stop = self.bounds()
        return (stop if stop is not None else self.total_rows()) - start

    def __iter__(self) -> Iterator[Document]:
        self.skipped = self.blank = 0
        start, stop = self.bounds()
        if self.format == "parquet":
            yield from self._parquet_rows(start, stop)
            return
        try:
            with open_input(self.path) as handle:
                for index, raw in enumerate(handle):
                    if index < start:
                        continue
                    if stop is not None and index >= stop:
                        break
                    document = self._parse_or_skip(raw, index)
                    del raw  # not kept while the document is used: a 50 MB line would cost 50 MB more
                    if document is not None:
                        yield document
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            raise DocembedError(f"{self.name}: cannot read: {error}") from None

    def read_range(self, start: int, stop: int, offset: int = 0) -> tuple[list[Document], int]:
        """(documents, invalid records skipped) of input rows [start, stop); for a text input `offset` is the
        byte offset where line `start` begins (from `line_offsets`), so only that range is read."""
        self.skipped = self.blank = 0
        if self.format == "parquet":
            return list(self._parquet_rows(start, stop)), self.skipped
        documents = []
        try:
            with open_input(self.path) as handle:
                handle.seek(offset)
                for index in range(start, stop):
                    raw = handle.readline()
                    if not raw:
                        raise DocembedError(
                            f"{self.name}: ended before line {index + 1}; did it change mid-run?"
                        )
                    document = self._parse_or_skip(raw, index)
                    if document is not None:
                        documents.append(document)
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            raise DocembedError(f"{self.name}: cannot read: {error}") from None
        return documents, self.skipped

    def _parse_or_skip(self, raw: bytes, index: int) -> Document | None:
        if self.format != "txt" and not raw.strip():  # in txt an empty line is an empty document
            self.blank += 1
            return None
        try:
            return self.parse_record(raw, index)
        except InputFormatError:
            if not self.skip_invalid:
                raise
            self.skipped += 1
            return None

    def parse_record(self, raw: bytes, index: int) -> Document:
        """One raw line (0-based `index` in the file) as a Document, or an InputFormatError."""
        line_number = index + 1
        if index == 0 and raw.startswith(BOM):
            raw = raw[len(BOM) :]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputFormatError(self.name, line_number, f"invalid UTF-8 ({error.reason})") from None
        line = line.rstrip("\r\n")
        if self.format == "txt":
            return Document(str(index), line)
        if self.format == "tsv":
            doc_id, sep, text = line.partition("\t")
            if not sep:
                raise InputFormatError(self.name, line_number, "expected id<TAB>text")
            return Document(doc_id, text)
        record = _json_record(line, raw, self.name, line_number)
        text = record.get(self.text_field)
        if not isinstance(text, str):
            what = "missing" if text is None else "not a string"
            fields = ", ".join(f"{k!r}" for k in list(record)[:12]) or "none"
            raise InputFormatError(
                self.name,
                line_number,
                f"text field {self.text_field!r} {what} (fields: {fields}; choose one with --text-field)",
            )
        return Document(_document_id(record.get(self.id_field), index, self.name, line_number), text)

    def _parquet_rows(self, start: int, stop: int | None) -> Iterator[Document]:
        """Rows [start, stop) across the files, reading only the row groups that hold them."""
        filesystem, _ = filesystem_of(self.path)
        base = 0
        for path, count in self.files():
            low = max(start, base)
            high = base + count if stop is None else min(stop, base + count)
            if low < high:
                for offset, (doc_id, text) in _parquet_slice(
                    filesystem, path, low - base, high - base, self.id_field, self.text_field
                ):
                    row = base + offset
                    if text is None:
                        if not self.skip_invalid:
                            raise InputFormatError(
                                path, row - base + 1, f"text field {self.text_field!r} missing"
                            )
                        self.skipped += 1
                        continue
                    yield Document(_document_id(doc_id, row, path, row - base + 1), text)
            base += count
            if stop is not None and base >= stop:
                break


def _document_id(value, index: int, source: str, line_number: int) -> str:
    """The id of a record: its id field (a string or a number), else its 0-based line or row number."""
    if value is None:
        return str(index)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InputFormatError(source, line_number, f"id must be a string or a number, not {value!r:.40}")
    if isinstance(value, float) and value != value:  # NaN: no id that could be found again
        raise InputFormatError(source, line_number, "id must be a string or a number, not NaN")
    return str(value)  # a JsonNumber as written: 1.50 and 1e2, not Python's 1.5 and 100.0


class JsonNumber(float):
    """A JSON number with a fraction or an exponent: the float it is, whose str() is the text it was written
    as, so that an id (a document's, a rerank row's) comes back as it went in: str(float) would turn 1.50
    into 1.5, 1e2 into 100.0 and 1e999 into inf, and two ids into one."""

    __slots__ = ("literal",)

    def __new__(cls, literal: str) -> JsonNumber:
        number = super().__new__(cls, literal)
        number.literal = str(literal)
        return number

    def __str__(self) -> str:
        return self.literal


def json_record(raw: bytes, source: str, line_number: int) -> dict:
    """One raw JSON Lines line (UTF-8, a leading byte order mark dropped) as a dict (see _json_record)."""
    if line_number == 1 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputFormatError(source, line_number, f"invalid UTF-8 ({error.reason})") from None
    return _json_record(line, raw, source, line_number)


def _json_record(line: str, raw: bytes, source: str, line_number: int) -> dict:
    """One JSON Lines record as a dict, or an InputFormatError naming the line: malformed JSON, a number
    Python will not read (over 4,300 digits), nesting deeper than the parser's stack, not an object, or a
    lone surrogate escape (valid JSON, but no text: it cannot be encoded, tokenised or written back)."""
    try:
        record = json.loads(line, parse_float=JsonNumber)
    except json.JSONDecodeError as error:
        if line.lstrip().startswith("["):
            raise InputFormatError(source, line_number, _ARRAY_HINT) from None
        what = f"malformed JSON at column {error.colno} ({error.msg.removesuffix(' at')})"
        raise InputFormatError(source, line_number, what) from None
    except ValueError as error:  # int() of a number with too many digits
        raise InputFormatError(source, line_number, f"unreadable JSON ({error})") from None
    except RecursionError:
        raise InputFormatError(source, line_number, "JSON nested too deeply") from None
    if isinstance(record, list):
        raise InputFormatError(source, line_number, _ARRAY_HINT)
    if not isinstance(record, dict):
        raise InputFormatError(source, line_number, "expected a JSON object")
    if b"\\u" in raw and _has_lone_surrogate(record):  # only a \u escape can make one (raw is UTF-8)
        raise InputFormatError(
            source, line_number, "holds a lone surrogate escape (\\ud800-\\udfff without its pair): not text"
        )
    return record


_ARRAY_HINT = (
    "a JSON array, not one object per line: docembed reads JSON Lines (`jq -c '.[]' FILE` turns an array "
    "into them)"
)


def _has_lone_surrogate(value) -> bool:
    """Whether any string in a JSON value holds a lone surrogate (json.loads pairs valid ones up)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _parquet_slice(filesystem, path: str, low: int, high: int, id_field: str, text_field: str):
    """(row within the file, (id or None, text)) for rows [low, high) of one Parquet file, one row group
    in memory at a time."""
    try:
        yield from _read_parquet_slice(filesystem, path, low, high, id_field, text_field)
    except (OSError, ValueError) as error:  # a truncated or corrupt file (ArrowInvalid is a ValueError)
        raise DocembedError(f"{path}: cannot read: {' '.join(str(error).split())}") from None


def _read_parquet_slice(filesystem, path: str, low: int, high: int, id_field: str, text_field: str):
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        has_ids = id_field in parquet.schema_arrow.names
        columns = list(dict.fromkeys((id_field, text_field) if has_ids else (text_field,)))
        row = 0
        for group in range(parquet.num_row_groups):
            n = parquet.metadata.row_group(group).num_rows
            if row < high and row + n > low:
                table = parquet.read_row_group(group, columns=columns)
                lo, hi = max(low - row, 0), min(high - row, n)
                table = table.slice(lo, hi - lo)
                texts = table.column(text_field).to_pylist()
                ids = table.column(id_field).to_pylist() if has_ids else [None] * len(texts)
                for k, pair in enumerate(zip(ids, texts, strict=True)):
                    yield row + lo + k, pair
            row += n
            if row >= high:
                break


def iter_jsonl_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line of a (possibly gzipped) JSON Lines file, or '-' for
    stdin; a malformed line, invalid UTF-8 or a non-object is an InputFormatError naming file and line.
    Blank lines are skipped and counted in a log line, as DocumentReader does."""
    from docembed.runtime import log

    path = str(path)
    blank = 0
    with open_input(path) as handle:
        for index, raw in enumerate(handle):
            if index == 0 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            if not raw.strip():
                blank += 1
                continue
            yield index + 1, json_record(raw, path, index + 1)
    if blank:
        log(f"{path}: skipped {blank} blank line(s)")


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """The records of a JSON Lines file (see iter_jsonl_lines)."""
    for _, record in iter_jsonl_lines(path):
        yield record


def batched(iterable, size: int):
    """Lists of up to `size` items, streamed."""
    batch = []
    for item in iterable:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
