"""The evaluation/training data sets, read in place from a data root (never copied into the project).

The root is `--data-root`, else `$DOCEMBED_DATA`, else `../shared/data` beside the checkout. The manifest
`data/datasets.json` lists each set's file, format, fields, record count and sha256; `checksum(name)`
reports the file's hash so results can record exactly which data they measured.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from docembed.errors import DocembedError
from docembed.io.readers import Document, DocumentReader, iter_jsonl

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
MANIFEST = _PROJECT_ROOT / "data" / "datasets.json"


def data_root(override: str | Path | None = None) -> Path:
    root = Path(override or os.environ.get("DOCEMBED_DATA") or _PROJECT_ROOT.parent / "shared" / "data")
    if not root.is_dir():
        raise DocembedError(f"data root not found: {root} (set --data-root or DOCEMBED_DATA)")
    return root


@cache
def manifest() -> dict[str, dict]:
    if not MANIFEST.exists():
        return {}
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["datasets"]


def dataset_path(name: str, root: str | Path | None = None) -> Path:
    """Path of data set `name` (a manifest key such as 'imdb/train', or a path relative to the root)."""
    relative = manifest().get(name, {}).get("file", name)
    path = data_root(root) / relative
    if not path.exists():
        raise DocembedError(f"data set {name!r} not found at {path}")
    return path


def records(name: str, root: str | Path | None = None) -> Iterator[dict]:
    """Stream the JSON records of a .jsonl(.gz) data set."""
    yield from iter_jsonl(dataset_path(name, root))


def documents(name: str, root: str | Path | None = None, text_field: str = "text") -> DocumentReader:
    """A re-iterable stream of (id, text) documents of a data set."""
    path = dataset_path(name, root)
    fmt = manifest().get(name, {}).get("format")
    return DocumentReader(str(path), fmt, text_field=text_field)


def iter_texts(name: str, root: str | Path | None = None, limit: int | None = None) -> Iterator[str]:
    for i, doc in enumerate(documents(name, root)):
        if limit is not None and i >= limit:
            return
        yield doc.text


class Corpus:
    """The texts of training documents, streamed and re-iterable (each pass reads the sources again), like
    gensim's corpora: `source` is a file (.jsonl/.txt/.tsv, gzip), a data set name under the data root
    (such as imdb/train), or several of them read one after the other; `limit` caps each source."""

    def __init__(
        self,
        sources: str | list[str],
        format: str | None = None,
        text_field: str = "text",
        limit: int | None = None,
        root: str | Path | None = None,
        id_field: str = "id",
        skip_invalid: bool = False,
    ):
        self.sources = [sources] if isinstance(sources, str) else list(sources)
        self.format, self.text_field, self.id_field = format, text_field, id_field
        self.limit, self.root, self.skip_invalid = limit, root, skip_invalid

    def readers(self) -> Iterator[DocumentReader]:
        for source in self.sources:
            if self._is_data_set(source):
                yield documents(source, self.root, text_field=self.text_field)
            else:
                yield DocumentReader(source, self.format, self.id_field, self.text_field, self.skip_invalid)

    def check(self) -> Corpus:
        """Read each source's first record now (a missing file, a wrong format or field fails before a
        model loads or training starts); returns the corpus."""
        for reader in self.readers():
            if isinstance(reader, DocumentReader):
                reader.check()
        return self

    def _is_data_set(self, source: str) -> bool:
        if source == "-" or Path(source).exists():
            return False
        if source in manifest():
            return True
        try:  # a path relative to the data root
            return (data_root(self.root) / source).exists()
        except DocembedError:
            return False

    def __iter__(self) -> Iterator[str]:
        for reader in self.readers():
            for i, doc in enumerate(reader):
                if self.limit is not None and i >= self.limit:
                    break
                yield doc.text


def checksum(name: str, root: str | Path | None = None) -> str:
    digest = hashlib.sha256()
    with open(dataset_path(name, root), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = [
    "Corpus",
    "Document",
    "checksum",
    "data_root",
    "dataset_path",
    "documents",
    "iter_texts",
    "manifest",
    "records",
]
