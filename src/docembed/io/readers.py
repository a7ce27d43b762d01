"""Streamed document readers: JSON Lines, plain text (one document per line) and `id<TAB>text`.

Documents are yielded one at a time (gensim-style iterables that can be iterated again), so memory does
not grow with the corpus. Every malformed record is reported with its file and line number, or skipped
and counted with `skip_invalid=True`. Empty texts are kept so output rows always match input rows.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from docembed.errors import DocembedError, InputFormatError, UsageError

FORMATS = ("jsonl", "txt", "tsv")


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
    name = path.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".tsv"):
        return "tsv"
    if name.endswith(".txt"):
        return "txt"
    raise UsageError(f"cannot tell the format of {path!r} from its name: pass --format jsonl|txt|tsv")


def _open_binary(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise DocembedError(f"input file not found: {path}")
    if p.is_dir():
        raise DocembedError(f"input is a directory, not a file: {path}")
    return gzip.open(p, "rb") if path.endswith(".gz") else open(p, "rb")  # noqa: SIM115


def count_lines(path: str) -> int:
    """Number of records a text input holds (a final line without a newline counts)."""
    n, last = 0, b"\n"
    with _open_binary(path) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


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
    ):
        if path == "-" and format is None:
            raise UsageError("reading from stdin ('-') needs an explicit --format jsonl|txt|tsv")
        if path == "-" and shard is not None:
            raise UsageError("--shard needs a file (it counts lines first), not stdin")
        self.path = path
        self.format = format or infer_format(path)
        if self.format not in FORMATS:
            raise UsageError(f"unknown input format {self.format!r}; choose one of {', '.join(FORMATS)}")
        self.id_field, self.text_field = id_field, text_field
        self.skip_invalid = skip_invalid
        self.shard = shard
        self.skipped = 0
        self.name = "<stdin>" if path == "-" else path
        self._bounds: tuple[int, int] | None = None

    def bounds(self) -> tuple[int, int | None]:
        if self.shard is None:
            return 0, None
        if self._bounds is None:
            self._bounds = self.shard.bounds(count_lines(self.path))
        return self._bounds

    def __len__(self) -> int:
        start, stop = self.bounds()
        return (stop if stop is not None else count_lines(self.path)) - start

    def __iter__(self) -> Iterator[Document]:
        self.skipped = 0
        start, stop = self.bounds()
        handle = _open_binary(self.path)
        try:
            for index, raw in enumerate(handle):
                if index < start:
                    continue
                if stop is not None and index >= stop:
                    break
                try:
                    yield self.parse_record(raw, index)
                except InputFormatError:
                    if not self.skip_invalid:
                        raise
                    self.skipped += 1
        except (OSError, EOFError, gzip.BadGzipFile) as error:
            raise DocembedError(f"{self.name}: cannot read: {error}") from None
        finally:
            if handle is not sys.stdin.buffer:
                handle.close()

    def parse_record(self, raw: bytes, index: int) -> Document:
        """One raw line (0-based `index` in the file) as a Document, or an InputFormatError. Public so the
        Ray engine, which reads line ranges itself, applies exactly these id and text rules."""
        line_number = index + 1
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
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputFormatError(self.name, line_number, f"malformed JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise InputFormatError(self.name, line_number, "expected a JSON object")
        text = record.get(self.text_field)
        if not isinstance(text, str):
            what = "missing" if text is None else "not a string"
            raise InputFormatError(self.name, line_number, f"text field {self.text_field!r} {what}")
        doc_id = record.get(self.id_field)
        return Document(str(index) if doc_id is None else str(doc_id), text)


def iter_jsonl_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-empty line of a (possibly gzipped) JSON Lines file, or '-' for
    stdin; a malformed line, invalid UTF-8 or a non-object is an InputFormatError naming file and line."""
    path = str(path)
    with _open_binary(path) as handle:
        for index, raw in enumerate(handle):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise InputFormatError(path, index + 1, f"invalid UTF-8 ({error.reason})") from None
            except json.JSONDecodeError as error:
                raise InputFormatError(path, index + 1, f"malformed JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise InputFormatError(path, index + 1, "expected a JSON object")
            yield index + 1, record


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
