"""Running texts through an Encoder: the one chunked encode loop (`encode`, the Ray actors, evaluation and
teacher vectors all use it) and the one embedding cache, keyed by one notion of model identity."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError
from docembed.io.readers import Document, batched
from docembed.runtime import (
    ChunkProgress,
    batches_reported_to,
    debug,
    log,
    progress_bar,
    raise_if_interrupted,
)
from docembed.types import EmbeddingSet, MultiVectors, Vectors, concat_vectors

CHUNK_SIZE = 1024


@dataclass
class Coverage:
    """What a model with a token limit read of the texts it encoded: nothing is cut silently."""

    max_tokens: int
    documents: int = 0
    documents_cut: int = 0
    tokens: int = 0
    tokens_not_read: int = 0

    def add(self, counts: Sequence[int]) -> None:
        for count in counts:
            self.documents += 1
            self.tokens += count
            if count > self.max_tokens:
                self.documents_cut += 1
                self.tokens_not_read += count - self.max_tokens

    @property
    def share_not_read(self) -> float:
        return self.tokens_not_read / self.tokens if self.tokens else 0.0

    def summary(self, model_name: str) -> str:
        return (
            f"{model_name} reads the first {self.max_tokens} tokens of a document: {self.documents_cut} of "
            f"{self.documents} documents were longer, {self.share_not_read:.1%} of all tokens not read"
        )

    def to_metadata(self) -> dict:
        return {**asdict(self), "share_not_read": round(self.share_not_read, 6)}


def coverage_of(model) -> Coverage | None:
    """An empty Coverage for a model that reads a limited number of tokens, else None."""
    max_tokens = getattr(model, "max_tokens", None)
    return Coverage(max_tokens) if isinstance(max_tokens, int) else None


def encode_texts(
    model,
    texts: Iterable[str],
    batch_size: int = 32,
    chunk_size: int = CHUNK_SIZE,
    total: int | None = None,
    label: str | None = None,
    coverage: Coverage | None = None,
    unit: str = "texts",
) -> Vectors:
    """`model.encode` over `texts`, `chunk_size` texts at a time: memory holds one chunk of text plus the
    output so far, Ctrl-C is honoured between chunks (and between batches, for a family that reports
    them), and no texts give a typed, empty result. `coverage`, if given, counts what the model does not
    read (see `coverage_of`). Progress counts `unit`s and moves with every batch a family reports
    (`runtime.report_batch`), else with every chunk."""
    parts = []
    done = 0
    with progress_bar(label or f"encode [{model.name}]", total=total, unit=unit) as bar:
        for chunk in batched(texts, chunk_size):
            raise_if_interrupted()
            if coverage is not None:
                coverage.add(model.token_counts(chunk) or [])
            # The whole chunk goes to the model in one call, as before: its batches, so its vectors, stay
            # the same; the progress within the call comes from the batches it reports.
            with batches_reported_to(ChunkProgress(bar, done, len(chunk))):
                parts.append(model.encode(capped(model, chunk), batch_size=batch_size))
            done += len(chunk)
            bar.set_completed(done)
            debug(f"encoded chunk {len(parts)} ({done} texts so far)")
    if not parts:
        return _empty_like(model.encode([""], batch_size=1))
    return _assemble(parts)


# A model that reads its first N tokens never needs more than N * CHARS_PER_TOKEN characters: a token is
# ~4 characters of text; the margin keeps every ordinary document whole (only runs of thousands of blanks
# could lose a word). Without the cap a 20 MB one-line document costs GBs in the tokenizer for 256 tokens.
CHARS_PER_TOKEN = 64


def text_cap(model) -> int | None:
    """How many characters of a text `model` can use (None: it reads the whole text, however long)."""
    max_tokens = getattr(model, "max_tokens", None)
    return max_tokens * CHARS_PER_TOKEN if isinstance(max_tokens, int) and max_tokens > 0 else None


def capped(model, texts: Sequence[str]) -> list[str]:
    """`texts` cut to what `model` can use (`text_cap`), what every encode path hands the model."""
    cap = text_cap(model)
    return [text[:cap] for text in texts] if cap else list(texts)


def encode_documents(
    model,
    documents: Iterable[Document],
    batch_size: int = 32,
    chunk_size: int = CHUNK_SIZE,
    total: int | None = None,
    allow_empty: bool = False,
    coverage: Coverage | None = None,
) -> EmbeddingSet:
    """Encode `documents` (streamed) into an EmbeddingSet with their ids and the model's metadata (with what
    the model did not read, when `coverage` is given)."""
    ids: list[str] = []

    def texts():
        for document in documents:
            ids.append(document.id)
            yield document.text

    data = encode_texts(model, texts(), batch_size, chunk_size, total, coverage=coverage, unit="documents")
    if not ids and not allow_empty:
        raise DocembedError("no documents to encode: the input is empty")
    metadata = model.metadata()
    if coverage is not None:
        metadata["coverage"] = coverage.to_metadata()
    return EmbeddingSet(data, ids, metadata)


def _empty_like(sample: Vectors) -> Vectors:
    if isinstance(sample, MultiVectors):
        positions = None if sample.positions is None else sample.positions[:0]
        return MultiVectors(sample.vectors[:0], np.zeros(1, dtype=np.int64), positions)
    return np.asarray(sample)[:0]


def _assemble(parts: list) -> Vectors:
    """Concatenate encoded chunks, freeing each once copied: peak memory is the output plus one chunk,
    not twice the output (as np.concatenate over a list that still holds every chunk would be); one
    chunk of sets (one huge document's, maybe) is the output as it is."""
    if isinstance(parts[0], MultiVectors):
        return MultiVectors.concat(parts, consume=True)
    out = np.empty((sum(len(p) for p in parts), parts[0].shape[1]), dtype=parts[0].dtype)
    row = 0
    parts.reverse()
    while parts:
        chunk = parts.pop()
        out[row : row + len(chunk)] = chunk
        row += len(chunk)
    return out


# --- the embedding cache ------------------------------------------------------------------------------------
def model_identity(model) -> str:
    """A key for 'this model with these weights and this fitted state': its metadata (name, family, config
    hash), where it was loaded from with the size and mtime of each file there (so retraining into the same
    folder changes it), what it was fitted on, and its maximum input length."""
    remote = getattr(model, "identity", None)  # a served model (remote.RemoteEncoder): the server's key
    if isinstance(remote, str):
        return remote
    parts = dict(model.metadata()) if hasattr(model, "metadata") else {"model": type(model).__qualname__}
    parts.pop("docembed_version", None)
    source = getattr(model, "source", None)
    parts["source"] = source
    if source and Path(source).is_dir():
        parts["files"] = sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(source).iterdir() if p.is_file()
        )
    parts["fitted_on"] = getattr(model, "fitted_on", None)
    parts["max_seq_length"] = getattr(model, "max_seq_length", None)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _cache_fits(stored: EmbeddingSet, model, path: Path, quiet: bool = False) -> bool:
    """Whether a cache entry holds this model's embeddings: written under this identity, of the model's
    kind and width. A mismatch (a copied or stale entry) is rebuilt with a warning (unless `quiet`), never
    used: vectors of another width would give wrong scores in silence."""
    owner = stored.metadata.get("model_identity")
    problem = None
    if owner not in (None, path.parent.name):
        problem = f"it was written for model identity {owner}"
    elif len(stored) and hasattr(model, "multi_vector") and stored.is_multi != bool(model.multi_vector):
        problem = "it holds " + ("multi-vector" if stored.is_multi else "dense") + " embeddings"
    elif len(stored) and _declared_dim(model) not in (None, stored.dim):
        problem = f"it holds {stored.dim}-d embeddings, the model makes {_declared_dim(model)}-d ones"
    if problem and not quiet:
        log(
            f"warning: embedding cache {path.parent} does not match {getattr(model, 'name', 'the model')}: "
            f"{problem}; rebuilding it"
        )
    return problem is None


def _declared_dim(model) -> int | None:
    """The width a model declares without encoding anything (every family does); None for an Encoder
    that only has the base class's way, encoding a text (the cache then compares the next vectors it
    encodes, see _same_kind)."""
    from docembed.models.base import Encoder

    if isinstance(model, Encoder) and type(model).dim is Encoder.dim:
        return None
    return getattr(model, "dim", None)


def _same_kind(stored: Vectors, new: Vectors) -> bool:
    if isinstance(stored, MultiVectors) != isinstance(new, MultiVectors):
        return False
    width = new.dim if isinstance(new, MultiVectors) else new.shape[1]
    return (stored.dim if isinstance(stored, MultiVectors) else stored.shape[1]) == width


def _with_entry_written_meanwhile(path: Path, model, stored, new: Vectors, first: dict[str, int]):
    """(stored, new, first) against the entry as it is on disk now: another process (a second `evaluate`
    of the same model) may have saved texts while these were encoded, and saving ours over its file would
    lose them. Its entry becomes the base, and only our texts it lacks are added."""
    from docembed.io.embeddings import load_embeddings

    try:
        latest = load_embeddings(str(path)) if path.exists() else None
    except DocembedError:  # damaged meanwhile: ours replaces it
        return stored, new, first
    unchanged = latest is None or (stored is not None and latest.ids == stored.ids)
    if unchanged or not _cache_fits(latest, model, path, quiet=True) or not _same_kind(latest.data, new):
        return stored, new, first
    known = set(latest.ids)
    rows = [row for row, key in enumerate(first) if key not in known]
    new = new.select(rows) if isinstance(new, MultiVectors) else new[rows]
    return latest, new, {key: index for key, index in first.items() if key not in known}


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """`<root>/<model identity>/vectors.npy` (+ its ids/meta sidecars, written by save_embeddings): every
    text a model has embedded, keyed by the text's hash. Asking for texts encodes only those not cached yet,
    each distinct text once. Dense and multi-vector; never pickled; a damaged entry is recomputed."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def vectors(self, model, texts: Sequence[str], batch_size: int = 32, label: str | None = None) -> Vectors:
        """The embedding of every text, in order; `label` names the work in log lines (else debug only)."""
        from docembed.io.embeddings import load_embeddings, save_embeddings

        say = log if label else debug
        label = label or f"embed [{getattr(model, 'name', 'model')}]"
        if not texts:
            return encode_texts(model, [], batch_size, label=label)
        path = self.root / model_identity(model) / "vectors.npy"
        stored: EmbeddingSet | None = None
        if path.exists():
            try:
                stored = load_embeddings(str(path))
            except DocembedError as error:  # an interrupted or damaged write: start this entry afresh
                log(f"warning: embedding cache {path.parent} is damaged, rebuilding it ({error})")
                stored = None
        wanted = [text_key(t) for t in texts]
        if stored is not None and not _cache_fits(stored, model, path):
            stored = None
        row_of = {key: row for row, key in enumerate(stored.ids)} if stored else {}
        first: dict[str, int] = {}
        for i, key in enumerate(wanted):
            if key not in row_of and key not in first:
                first[key] = i
        if first:
            say(f"{label}: encoding {len(first)} of {len(texts)} texts (cache {path.parent})")
            new = encode_texts(
                model, (texts[i] for i in first.values()), batch_size, total=len(first), label=label
            )
            if stored is not None and len(stored) and not _same_kind(stored.data, new):
                log(
                    f"warning: embedding cache {path.parent} holds embeddings of another width; rebuilding it"
                )
                stored = None
                first = {key: wanted.index(key) for key in dict.fromkeys(wanted)}
                new = encode_texts(model, [texts[i] for i in first.values()], batch_size, label=label)
            stored, new, first = _with_entry_written_meanwhile(path, model, stored, new, first)
            new_set = EmbeddingSet(new, list(first), {"model_identity": path.parent.name})
            if stored is not None and len(stored):
                new_set = EmbeddingSet(
                    concat_vectors([stored.data, new]), stored.ids + list(first), new_set.metadata
                )
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                save_embeddings(new_set, str(path), overwrite=True)
            except (DocembedError, OSError) as error:  # a cache that cannot be written only costs time
                log(f"warning: embedding cache not updated ({error})")
            stored = new_set
            row_of = {key: row for row, key in enumerate(stored.ids)}
        else:
            say(f"{label}: all {len(texts)} texts cached ({path.parent})")
        rows = [row_of[key] for key in wanted]
        if isinstance(stored.data, MultiVectors):
            return stored.data.select(rows)
        return np.asarray(stored.data[rows], dtype=np.float32)


# --- encode --reuse: re-encode only what changed -----------------------------------------------------------
#: metadata an `encode` output carries so that a later `encode --reuse` can tell unchanged documents: the
#: identity of the model (model_identity) and one 8-byte BLAKE2b digest of each document's text, in row order
TEXT_HASHES = "text_hashes"
MODEL_IDENTITY = "model_identity"
DIGEST_BYTES = 8


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


class HashedDocuments:
    """`documents` passed through unchanged, each text's digest kept in order (what `encode` records in its
    output's metadata, see `reuse_metadata`)."""

    def __init__(self, documents: Iterable[Document]):
        self.documents = documents
        self.digests = bytearray()

    def __iter__(self):
        self.digests = bytearray()
        for document in self.documents:
            self.digests += text_digest(document.text)
            yield document


def reuse_metadata(model, digests: bytes) -> dict:
    """The metadata keys `encode --reuse` reads back: the model's identity and the texts' digests."""
    encoded = base64.b64encode(bytes(digests)).decode("ascii")
    return {MODEL_IDENTITY: model_identity(model), TEXT_HASHES: {"blake2b-64": encoded}}


def _stored_digests(old: EmbeddingSet, name: str) -> list[bytes]:
    hashes = old.metadata.get(TEXT_HASHES)
    raw = None
    if isinstance(hashes, dict) and isinstance(hashes.get("blake2b-64"), str):
        try:
            raw = base64.b64decode(hashes["blake2b-64"], validate=True)
        except ValueError:
            raw = None
    if raw is None or len(raw) != DIGEST_BYTES * len(old):
        raise DocembedError(
            f"{name} holds no text hashes for its {len(old)} rows (written by `docembed encode` before "
            "--reuse existed, merged, or by another tool): encode without --reuse once"
        )
    return [raw[i : i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES)]


def encode_documents_reusing(
    model,
    documents: Iterable[Document],
    old: EmbeddingSet,
    old_name: str,
    batch_size: int = 32,
    chunk_size: int = CHUNK_SIZE,
    total: int | None = None,
    coverage: Coverage | None = None,
    allow_empty: bool = False,
) -> tuple[EmbeddingSet, int]:
    """`encode_documents`, taking from `old` (an earlier `encode` output of the same model) the embedding
    of every document whose id and text are unchanged; only new or changed texts are encoded. Returns the
    set (the same rows and metadata a full encode gives) and how many documents were encoded. Refused
    when `old` came from another model identity (other weights, settings or fitted state). `allow_empty`:
    no documents give an empty set shaped as `old` (an empty `--shard`), not an error."""
    identity = model_identity(model)
    if old.metadata.get(MODEL_IDENTITY) != identity:
        raise DocembedError(
            f"--reuse {old_name}: it was encoded by another model or other settings "
            f"({old.metadata.get('model')!r}, identity {old.metadata.get(MODEL_IDENTITY)}; now "
            f"{getattr(model, 'name', '?')!r}, identity {identity}): encode without --reuse"
        )
    digests = _stored_digests(old, old_name)
    seen = Counter(old.ids)
    row_of = {doc_id: row for row, doc_id in enumerate(old.ids) if seen[doc_id] == 1}
    ids: list[str] = []
    new_digests = bytearray()
    parts = []
    encoded = 0
    done = 0
    with progress_bar(f"encode --reuse [{model.name}]", total=total, unit="documents") as bar:
        for chunk in batched(documents, chunk_size):
            raise_if_interrupted()
            texts = [document.text for document in chunk]
            if coverage is not None:
                coverage.add(model.token_counts(texts) or [])
            reused, fresh = [], []
            for position, document in enumerate(chunk):
                digest = text_digest(document.text)
                ids.append(document.id)
                new_digests += digest
                row = row_of.get(document.id)
                if row is not None and digests[row] == digest:
                    reused.append((position, row))
                else:
                    fresh.append(position)
            new = None
            if fresh:
                # the reused rows count at once, the fresh ones as the model reports its batches
                with batches_reported_to(ChunkProgress(bar, done + len(reused), len(fresh))):
                    new = model.encode(capped(model, [texts[p] for p in fresh]), batch_size=batch_size)
                encoded += len(fresh)
            parts.append(_merge_rows(len(chunk), old.data, reused, fresh, new))
            done += len(chunk)
            bar.set_completed(done)
    if not ids and not allow_empty:
        raise DocembedError("no documents to encode: the input is empty")
    metadata = model.metadata()
    if coverage is not None:
        metadata["coverage"] = coverage.to_metadata()
    metadata.update(reuse_metadata(model, new_digests))
    return EmbeddingSet(_assemble(parts) if parts else _empty_like(old.data), ids, metadata), encoded


def _merge_rows(size: int, old: Vectors, reused: list, fresh: list[int], new: Vectors | None) -> Vectors:
    """One chunk's embeddings in input order: rows `reused` [(position, old row)] from `old`, the rest
    (`fresh` positions) from `new`."""
    if isinstance(old, MultiVectors):
        items: list = [None] * size
        positions: list = [None] * size
        sources = [(old, row, p) for p, row in reused]
        if new is not None:
            sources += [(new, i, p) for i, p in enumerate(fresh)]
        for source, row, p in sources:
            items[p] = source[row]
            if source.positions is not None:
                positions[p] = source.positions[source.offsets[row] : source.offsets[row + 1]]
        has_positions = all(p is not None for p in positions)
        return MultiVectors.from_list(items, positions if has_positions else None)
    out = np.empty((size, old.shape[1]), dtype=old.dtype)
    if reused:
        where, rows = zip(*reused, strict=True)
        out[list(where)] = old[list(rows)]
    if new is not None:
        out[fresh] = new
    return out
