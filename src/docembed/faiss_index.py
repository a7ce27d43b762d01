"""faiss indexes over embeddings, saved as a directory (index.faiss, ids.json, meta.json). Loading checks
that ids, vectors and metadata agree and hold no NaN; ids.json is a JSON array, so any id comes back exactly
(indexes of older versions kept ids.txt, one id per line, still read).

Dense embeddings: inner product over L2-normalised vectors (cosine). Kinds: `flat` (exact),
`hnsw` (graph, approximate), `ivf` (inverted lists; nlist = ~sqrt(n), trained on the data).
Multi-vector embeddings (NUGGET nuggets, token vectors): every vector is indexed and remembers its
document; a query's vectors each fetch their nearest vectors, the documents they belong to become
candidates, and candidates are rescored exactly with mean-MaxSim over the vectors as faiss holds them (read
back from index.faiss at load time: stored once; indexes before 2026-11-25 kept a copy in vectors.npy).
On a machine with faiss-gpu and `--device cuda`, search runs on the GPU.

An index remembers what `index add` and `index remove` changed since it was built (changes.json, plus the
ids of the segments meta.json names), so that a rebuild from the embeddings file can tell it would undo
them (`changes_since_build`). meta.json is replaced on every change, so its stamp (`index_stamp`) tells a
reader such as `serve` that the index changed on disk.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.io.embeddings import STORAGES
from docembed.io.outputs import DirectoryKind, atomic_path, directory_output, output_lock
from docembed.scoring import long_query_rows, maxsim_one_to_many, passage_scoring
from docembed.types import EmbeddingSet, MultiVectors, Vectors, concat_vectors, l2_normalize

KINDS = ("flat", "hnsw", "ivf")
# what a new multi-vector IVF index records as its search settings (meta.json "search"; `search --nprobe
# --candidates --rescore` overrides them), chosen on validation queries by bench/bench_multivector.py over the
# shipped nugget's vectors of 50,000 IMDB half-reviews (bench/results/multivector.json): no setting reached
# recall@10 0.95 of exact mean-MaxSim, so the one of the highest recall (0.94; test 0.92 at 4.2x the queries/s
# of the settings before, whose recall was 0.89). Indexes built before keep nprobe = nlist / 8, max(4k, 64)
# candidates per query vector and every document hit rescored.
MULTI_VECTOR_IVF_SEARCH = {"nprobe": 16, "candidates": 512, "rescore": 400}


def is_index_dir(directory: Path) -> bool:
    """Whether `directory` holds an index docembed wrote: index.faiss and a meta.json naming its kind."""
    try:
        metadata = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(metadata, dict) or "index_kind" not in metadata:
        return False
    return (directory / ("index.faiss" if metadata["index_kind"] != "bm25" else "bm25_weights.npz")).is_file()


def _index_file(name: str) -> bool:
    """Whether `name` is one an index folder holds (what `save`, `append_saved` and older versions write)."""
    return name in _INDEX_FILES


#: what `index build -o DIR` may replace (io/outputs.py's rule for directory outputs)
INDEX_DIRECTORY = DirectoryKind("docembed index", "index.faiss and meta.json", is_index_dir, _index_file)


def _faiss():
    import faiss

    return faiss


def _build_faiss(vectors: np.ndarray, kind: str, storage: str = "float32"):
    """A faiss index of `kind` over `vectors`, holding them as `storage` says: float32 as they are,
    float16 / int8 through faiss' scalar quantizers (int8: a range per dimension, trained on `vectors`)."""
    faiss = _faiss()
    dim, ip = vectors.shape[1], faiss.METRIC_INNER_PRODUCT
    if storage not in STORAGES:
        raise UsageError(f"unknown storage {storage!r}; choose one of {', '.join(STORAGES)}")
    quantizer = {"float16": faiss.ScalarQuantizer.QT_fp16, "int8": faiss.ScalarQuantizer.QT_8bit}.get(storage)
    if kind == "flat" and quantizer is None:
        index = faiss.IndexFlatIP(dim)
    elif kind == "flat":
        index = faiss.IndexScalarQuantizer(dim, quantizer, ip)
    elif kind == "hnsw":
        if quantizer is None:
            index = faiss.IndexHNSWFlat(dim, 32, ip)
        else:
            index = faiss.IndexHNSWSQ(dim, quantizer, 32, ip)
        index.hnsw.efSearch = 128
    elif kind == "ivf":
        nlist = max(1, int(math.sqrt(len(vectors))))
        if quantizer is None:
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, ip)
        else:
            index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist, quantizer, ip)
        index.nprobe = max(1, nlist // 8)
    else:
        raise UsageError(f"unknown index type {kind!r}; choose one of {', '.join(KINDS)}")
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    return index


def _without_rows(index, keep: np.ndarray, vectors: np.ndarray | None = None):
    """`index` without the rows where `keep` is False (rows stay in order). `vectors`: the kept vectors when
    the caller has them (multi-vector indexes keep theirs), else they are read back from the index."""
    faiss = _faiss()
    if isinstance(index, faiss.IndexFlat):
        index.remove_ids(faiss.IDSelectorBatch(np.flatnonzero(~keep).astype(np.int64)))
        return index
    if vectors is None:
        vectors = _held(index)[keep]
    fresh = faiss.clone_index(index)  # IVF: the trained centroids stay; HNSW: its settings
    fresh.reset()
    fresh.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return fresh


def _held(index, start: int = 0) -> np.ndarray:
    """The vectors faiss holds from row `start` on, as float32 (a scalar quantizer's rounding included):
    what MaxSim reads, so an index in memory scores exactly as the same index saved and loaded."""
    if hasattr(index, "make_direct_map"):  # IVF: reconstruct needs the id -> list map
        index.make_direct_map()
    return index.reconstruct_n(start, index.ntotal - start).astype(np.float32)


@dataclass
class IndexChanges:
    """What `add` and `remove` did to an index since it was built: the ids added (in order) and the ids
    removed. An id removed and added again counts as added; one added and removed again as removed (a
    rebuild from a file still holding it would bring it back)."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def record_added(self, ids: Sequence[str]) -> None:
        back = set(ids)
        if self.removed and back & set(self.removed):
            self.removed = [i for i in self.removed if i not in back]
        self.added.extend(ids)

    def record_removed(self, ids: Iterable[str]) -> None:
        gone = list(dict.fromkeys(ids))
        dropped = set(gone)
        self.added = [i for i in self.added if i not in dropped]
        known = set(self.removed)
        self.removed.extend(i for i in gone if i not in known)

    def undone_by(self, ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """What a rebuild from a set holding `ids` would undo: (added ids it lacks, removed ids it holds)."""
        have = set(ids)
        return [i for i in self.added if i not in have], [i for i in self.removed if i in have]


CHANGES_NAME = "changes.json"


class VectorIndex:
    def __init__(
        self,
        index,
        ids: list[str],
        metadata: dict,
        multi: MultiVectors | None = None,
        changes: IndexChanges | None = None,
    ):
        self.index, self.ids, self.metadata, self.multi = index, ids, metadata, multi
        self.changes = changes if changes is not None else IndexChanges()
        self._doc_of_vector = None
        self._rows: dict[str, int] | None = None  # id -> row, built when first needed (scores_of)
        self._tuning: dict[str, int] = {}  # search settings for this process (`tune`), never saved
        if multi is not None:
            self._doc_of_vector = np.repeat(np.arange(len(multi)), multi.counts)

    @property
    def passage_temperature(self) -> float:
        """How a document's vectors pool when scored, as its model pools them (recorded by encode)."""
        return float(self.metadata.get("passage_temperature", 0.0))

    @property
    def long_queries(self) -> str:
        """How a long query is scored, as its model scores it (recorded by encode)."""
        return str(self.metadata.get("long_queries", "passages"))

    @property
    def passage_group_tokens(self) -> int:
        """Token vectors scored by windows of this many tokens, as their model scores them (0: not)."""
        return int(self.metadata.get("passage_group_tokens", 0))

    @classmethod
    def build(cls, embeddings: EmbeddingSet, kind: str = "flat", storage: str = "float32") -> VectorIndex:
        """`storage` (float32 | float16 | int8, io.embeddings.STORAGES): how faiss holds the vectors (its
        scalar quantizers); a multi-vector index's MaxSim reads them as held (docs/nugget_baselines.md)."""
        if len(embeddings) == 0:
            raise DocembedError("cannot build an index over zero embeddings")
        metadata = dict(embeddings.metadata, index_kind=kind, count=len(embeddings))
        metadata.pop("text_hashes", None)  # the rows' text digests (encode --reuse): not the index's
        metadata.update(storage=storage, dim=embeddings.dim, kind="multi" if embeddings.is_multi else "dense")
        _refuse_non_finite(embeddings)
        if embeddings.is_multi:
            if kind == "ivf":
                metadata["search"] = dict(MULTI_VECTOR_IVF_SEARCH)
            multi = embeddings.data
            index = _build_faiss(l2_normalize(multi.vectors.astype(np.float32)), kind, storage)
            multi = MultiVectors(_held(index), multi.offsets, multi.positions)
            return cls(index, list(embeddings.ids), metadata, multi)
        vectors = l2_normalize(np.asarray(embeddings.data, dtype=np.float32))
        return cls(_build_faiss(vectors, kind, storage), list(embeddings.ids), metadata)

    def to_gpu(self) -> VectorIndex:
        faiss = _faiss()
        if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            self.index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, self.index)
        return self

    def search(
        self,
        queries: Vectors,
        k: int = 10,
        nprobe: int | None = None,
        candidates: int | None = None,
        rescore: int | None = None,
    ) -> list[list[tuple[str, float]]]:
        """Top-k (id, score) per query, best first. An IVF index scans `nprobe` of its lists per query
        vector; a multi-vector index takes `candidates` hits per query vector and rescores exactly the
        `rescore` documents whose hits promise most (`_shortlist`; 0: every document hit). All default to
        what the index recorded at build (`search_settings`)."""
        k = min(k, len(self.ids))
        self._check_queries(queries)
        settings = self.search_settings(k, nprobe, candidates, rescore)
        if "nprobe" in settings:
            self._ivf().nprobe = min(settings["nprobe"], self.nlist)
        if self.multi is None:
            if isinstance(queries, MultiVectors):
                raise UsageError("this index holds dense embeddings; encode queries with a dense model")
            scores, rows = self.index.search(l2_normalize(np.asarray(queries, dtype=np.float32)), k)
            return [
                [(self.ids[r], float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
                for row_ids, row_scores in zip(rows, scores, strict=True)
            ]
        if not isinstance(queries, MultiVectors):
            raise UsageError("this index holds multi-vector embeddings; encode queries with the same model")
        results = []
        per_vector = min(settings["candidates"], len(self.multi.vectors))
        # one faiss call for every query vector of the batch: matrix products instead of a call per query
        flat = l2_normalize(queries.vectors.astype(np.float32))
        every_sim, every_hit = self.index.search(flat, per_vector) if len(flat) else (None, None)
        for i in range(len(queries)):
            start, stop = queries.offsets[i], queries.offsets[i + 1]
            query = flat[start:stop]
            if len(query) == 0:
                results.append([])
                continue
            found = self._shortlist(every_hit[start:stop], every_sim[start:stop], settings["rescore"])
            scores = maxsim_one_to_many(query, _gather(self.multi, found), *passage_scoring(self))
            order = np.argsort(-scores, kind="stable")[:k]
            results.append([(self.ids[found[j]], float(scores[j])) for j in order])
        return results

    def _shortlist(self, hits: np.ndarray, sims: np.ndarray, depth: int) -> np.ndarray:
        """The documents to rescore for one query, from its vectors' hits (rows: query vectors; columns:
        their nearest stored vectors and similarities). Every document hit when `depth` is 0 or covers them;
        else the `depth` documents with the highest estimate of mean-MaxSim: per query vector, the best
        similarity among the document's hits, or, where none of its vectors was hit, that query vector's
        lowest retrieved similarity (the most it can be; as XTR imputes what was not retrieved)."""
        valid = hits >= 0
        documents = self._doc_of_vector[hits[valid]]
        unique, column = np.unique(documents, return_inverse=True)
        if depth <= 0 or len(unique) <= depth:
            return unique
        floor = np.where(valid, sims, np.inf).min(axis=1)
        best = np.repeat(floor[:, None], len(unique), axis=1)
        np.maximum.at(best, (np.nonzero(valid)[0], column), sims[valid])
        estimate = best.sum(axis=0)
        return np.sort(unique[np.argpartition(-estimate, depth - 1)[:depth]])

    def tune(
        self, nprobe: int | None = None, candidates: int | None = None, rescore: int | None = None
    ) -> VectorIndex:
        """Search with these settings from now on (`search --nprobe/--candidates/--rescore`), instead of
        those recorded at build; the index on disk keeps its own."""
        given = (("nprobe", nprobe), ("candidates", candidates), ("rescore", rescore))
        self._tuning.update({key: value for key, value in given if value is not None})
        return self

    def search_settings(
        self,
        k: int = 10,
        nprobe: int | None = None,
        candidates: int | None = None,
        rescore: int | None = None,
    ) -> dict:
        """The search settings a query gets: the arguments, else `tune`'s, else those recorded at build
        (meta.json "search"), else those of indexes built before they were recorded (nprobe as faiss saved
        it, max(4k, 64) candidates per query vector, every document hit rescored)."""
        recorded = {**(self.metadata.get("search") or {}), **self._tuning}
        settings = {}
        if self.nlist:
            settings["nprobe"] = int(nprobe or recorded.get("nprobe") or self._ivf().nprobe)
        if self.multi is not None:
            settings["candidates"] = int(candidates or recorded.get("candidates") or max(4 * k, 64))
            chosen = rescore if rescore is not None else recorded.get("rescore", 0)
            settings["rescore"] = max(int(chosen), k) if chosen else 0
        return settings

    @property
    def nlist(self) -> int:
        """The number of inverted lists of an IVF index (0 for flat and HNSW ones)."""
        return int(getattr(self._ivf(), "nlist", 0))

    def _ivf(self):
        try:
            return _faiss().extract_index_ivf(self.index)
        except (RuntimeError, AttributeError):  # not an IVF index
            return None

    # --- collections: add, remove, more like this ---------------------------------------------------------
    def add(self, embeddings: EmbeddingSet) -> None:
        """Append `embeddings` (same model, same width, ids new to the index): faiss adds the new vectors
        only (an IVF index keeps its trained centroids, an HNSW graph links the new nodes in), so the cost
        is the new vectors', not a rebuild."""
        if len(embeddings) == 0:
            return
        _check_addition(embeddings, self.ids, self.metadata, self.index.d, self.multi is not None)
        self._append(_normalized(embeddings), list(embeddings.ids))
        self.changes.record_added(list(embeddings.ids))

    def _append(self, data: Vectors, ids: list[str]) -> None:
        """faiss adds the (normalised) vectors; ids and the multi-vector rows follow."""
        if self.multi is not None:
            before = self.index.ntotal
            self.index.add(data.vectors)
            vectors = _held(self.index, before)
            added = MultiVectors(vectors, data.offsets, data.positions)
            self.multi = MultiVectors.concat([self.multi, added])  # positions kept while every part has them
            self._doc_of_vector = np.repeat(np.arange(len(self.multi)), self.multi.counts)
        else:
            self.index.add(data)
        self.ids.extend(ids)
        self.metadata["count"] = len(self.ids)
        self._rows = None

    @classmethod
    def append_saved(
        cls, directory: str | Path, embeddings: EmbeddingSet, compact_share: float = 0.1
    ) -> bool:
        """Add `embeddings` to the index saved in `directory` without rewriting it: they are written as a
        segment (`added/NNNN/`) that `load` adds to the index, so the cost is the new vectors', not the
        collection's. meta.json, replaced last, is the commit point: a failed append leaves the index as it
        was. Once the segments hold more than `compact_share` of the documents, the whole index is loaded and
        saved again as one file instead (returns True then), so loading never adds more than that share."""
        directory = Path(directory)
        if len(embeddings) == 0:
            return False
        if not (directory / "index.faiss").exists():
            raise DocembedError(f"{directory} is not a docembed index (no index.faiss)")
        with output_lock(directory, INDEX_DIRECTORY):
            metadata = read_index_meta(directory / "meta.json")
            appended = [i for folder in _segment_folders(directory, metadata) for i in read_ids(folder)]
            ids = read_ids(directory) + appended
            described = "dim" in metadata and metadata.get("kind") in ("dense", "multi")
            if described:
                _check_addition(embeddings, ids, metadata, int(metadata["dim"]), metadata["kind"] == "multi")
            share = (len(appended) + len(embeddings)) / (len(ids) + len(embeddings))
            compact = not described or share > compact_share
            if not compact:
                cls._write_segment(directory, metadata, embeddings, len(ids))
        if compact:  # the whole index rewritten, all or nothing, as `index remove` writes it
            # loaded under the lock: an add committed by another process meanwhile is kept, not overwritten
            with directory_output(directory, INDEX_DIRECTORY, overwrite=True) as staging:
                index = cls.load(directory)
                index.add(embeddings)
                index.save(staging)
        return compact

    @classmethod
    def remove_saved(
        cls, directory: str | Path, ids: Iterable[str], inputs: Sequence[str | Path] = ()
    ) -> tuple[int, int]:
        """Remove the documents with these ids from the index saved in `directory` (unknown ids are
        ignored), rewriting it all or nothing; returns (how many went, how many are left). Loaded under the
        write lock, so an add committed by another process meanwhile is not lost."""
        directory = Path(directory)
        if not (directory / "index.faiss").exists():
            raise DocembedError(f"{directory} is not a docembed index (no index.faiss)")
        wanted = list(ids)
        try:
            with directory_output(directory, INDEX_DIRECTORY, overwrite=True, inputs=inputs) as staging:
                index = cls.load(directory)
                removed = index.remove(wanted)
                if not removed:  # leave the folder untouched: no swap for nothing
                    raise _Unchanged(len(index.ids))
                index.save(staging)
        except _Unchanged as unchanged:
            return 0, unchanged.left
        return removed, len(index.ids)

    @staticmethod
    def _write_segment(directory: Path, metadata: dict, embeddings: EmbeddingSet, count: int) -> None:
        """The segment's files first, then meta.json naming it: the commit, replaced in one rename."""
        segments = metadata.get("segments", [])
        name = f"{len(segments) + 1:04d}"
        folder = directory / SEGMENTS / name
        shutil.rmtree(folder, ignore_errors=True)  # left by an append that failed before its commit
        folder.mkdir(parents=True)
        data = _normalized(embeddings)
        np.save(folder / "vectors.npy", data.vectors if isinstance(data, MultiVectors) else data)
        if isinstance(data, MultiVectors):
            np.save(folder / "offsets.npy", data.offsets)
            if data.positions is not None:
                np.save(folder / "positions.npy", data.positions)
        write_ids(folder, list(embeddings.ids))
        metadata.update(segments=[*segments, name], count=count + len(embeddings))
        with atomic_path(directory / "meta.json") as tmp:
            tmp.write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")

    def remove(self, ids: Iterable[str]) -> int:
        """Drop the documents with these ids (unknown ids are ignored); returns how many went. A flat index
        removes in place; IVF keeps its trained centroids and re-adds the rest; HNSW, whose graph cannot
        lose nodes, is rebuilt from its stored vectors."""
        gone = set(ids)
        keep = np.array([i not in gone for i in self.ids], dtype=bool)
        removed = int((~keep).sum())
        if removed == 0:
            return 0
        if keep.sum() == 0:
            raise DocembedError("removing every document would leave an empty index")
        if self.multi is not None:
            rows = np.repeat(keep, self.multi.counts)
            kept = self.multi.select(np.flatnonzero(keep))
            self.multi = MultiVectors(kept.vectors, kept.offsets, kept.positions)
            self._doc_of_vector = np.repeat(np.arange(len(self.multi)), self.multi.counts)
            vectors = kept.vectors
        else:
            rows = keep
            vectors = None
        self.index = _without_rows(self.index, rows, vectors)
        self.changes.record_removed(i for i, k in zip(self.ids, keep, strict=True) if not k)
        self.ids = [i for i, k in zip(self.ids, keep, strict=True) if k]
        self.metadata["count"] = len(self.ids)
        self._rows = None
        return removed

    def stored(self, doc_id: str) -> Vectors:
        """The stored (normalised) embedding of document `doc_id`, shaped as a query batch of one."""
        row = self._row(doc_id)
        if self.multi is not None:
            return self.multi.select([row])
        if hasattr(self.index, "make_direct_map"):
            self.index.make_direct_map()
        return self.index.reconstruct(row).reshape(1, -1)

    def vectors_of(self, doc_ids: Sequence[str]) -> Vectors:
        """The vectors the index holds for each of `doc_ids`, in order: a MultiVectors for a multi-vector
        index (each document's passages, for `search --passages`), else one row each."""
        rows = [self._row(doc_id) for doc_id in doc_ids]
        if self.multi is not None:
            return self.multi.select(rows)
        if not rows:
            return np.zeros((0, self.index.d), dtype=np.float32)
        return concat_vectors([self.stored(doc_id) for doc_id in doc_ids])

    def scores_of(self, query: Vectors, doc_ids: Sequence[str]) -> np.ndarray:
        """The exact score of one query (a batch of one) against each of `doc_ids`, as `search` scores a
        hit: cosine to the vector faiss holds, or mean-MaxSim over the vectors it holds."""
        rows = np.asarray([self._row(doc_id) for doc_id in doc_ids], dtype=np.int64)
        if self.multi is not None:
            vectors = l2_normalize(query.vectors.astype(np.float32))
            return (
                maxsim_one_to_many(vectors, self.multi.select(rows), *passage_scoring(self))
                if len(vectors)
                else np.zeros(len(rows))
            )
        if len(rows) == 0:
            return np.zeros(0)
        if hasattr(self.index, "make_direct_map"):
            self.index.make_direct_map()
        held = np.stack([self.index.reconstruct(int(row)) for row in rows])
        return held @ l2_normalize(np.asarray(query, dtype=np.float32)).ravel()

    def embeddings(self) -> EmbeddingSet:
        """The indexed documents as an embedding set (what `index migrate` moves): ids, the vectors as faiss
        holds them (added segments included) and the embeddings' metadata, without the index's own keys."""
        data = self.multi if self.multi is not None else _held(self.index)
        own = ("index_kind", "count", "storage", "dim", "kind", "segments", "search")
        return EmbeddingSet(data, list(self.ids), {k: v for k, v in self.metadata.items() if k not in own})

    def recorded_model(self) -> str | None:
        """The model the index was built with, as its metadata records it (a saved model's path first)."""
        return _model_in(self.metadata)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._row_of()

    def __len__(self) -> int:
        return len(self.ids)

    def _row_of(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {doc_id: row for row, doc_id in enumerate(self.ids)}
        return self._rows

    def _row(self, doc_id: str) -> int:
        try:
            return self._row_of()[doc_id]
        except KeyError:
            raise DocembedError(f"id {doc_id!r} is not in the index") from None

    def more_like(self, doc_ids: Sequence[str], k: int = 10) -> list[list[tuple[str, float]]]:
        """Top-k documents nearest each stored document `doc_ids[i]`, the document itself left out."""
        if not doc_ids:
            return []
        found = self.search(concat_vectors([self.stored(doc_id) for doc_id in doc_ids]), k + 1)
        return [
            [hit for hit in hits if hit[0] != doc_id][:k] for doc_id, hits in zip(doc_ids, found, strict=True)
        ]

    def save(self, directory: str | Path) -> None:
        faiss = _faiss()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        index = self.index
        if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(index).__name__:
            index = faiss.index_gpu_to_cpu(index)
        with atomic_path(directory / "index.faiss") as tmp:
            faiss.write_index(index, str(tmp))
        write_ids(directory, self.ids)
        if self.multi is not None:  # the vectors themselves are index.faiss's (`_held` at load time)
            np.save(directory / "offsets.npy", self.multi.offsets)
            # each vector's token position: what scoring by windows groups by (NUGGET's passage_windows)
            if self.multi.positions is not None:
                np.save(directory / "positions.npy", self.multi.positions)
            else:
                (directory / "positions.npy").unlink(missing_ok=True)
        shutil.rmtree(directory / SEGMENTS, ignore_errors=True)  # index.faiss holds their vectors now
        if self.changes:
            changes = {"added": self.changes.added, "removed": self.changes.removed}
            # ASCII with escapes, as ids.json: every id comes back exactly
            (directory / CHANGES_NAME).write_text(json.dumps(changes) + "\n", encoding="ascii")
        else:
            (directory / CHANGES_NAME).unlink(missing_ok=True)
        metadata = {key: value for key, value in self.metadata.items() if key != "segments"}
        (directory / "meta.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> VectorIndex:
        """The index saved in `directory`, checked: ids, vectors and metadata must agree, and hold no NaN."""
        directory = Path(directory)
        if not (directory / "index.faiss").exists():
            raise DocembedError(f"{directory} is not a docembed index (no index.faiss)")
        index = _read_faiss(directory / "index.faiss")
        ids = read_ids(directory)
        metadata = read_index_meta(directory / "meta.json")
        multi = _read_multi(directory, index) if (directory / "offsets.npy").exists() else None
        _check_counts(directory, index, ids, metadata, multi)
        _check_stored_vectors(directory, index, multi)
        loaded = cls(index, ids, metadata, multi, _read_changes(directory))
        # appended by `append_saved`: faiss adds them now
        for folder in _segment_folders(directory, metadata):
            data, added = _read_segment(folder, multi is not None, index.d)
            loaded._append(data, added)
            loaded.changes.record_added(added)
        return loaded

    def _check_queries(self, queries: Vectors) -> None:
        check_queries(queries, self.index.d, self.metadata)


class _Unchanged(Exception):
    """`remove_saved` found none of the ids: nothing to write."""

    def __init__(self, left: int):
        super().__init__(left)
        self.left = left


# --- what changed since the build, and whether the index changed on disk -------------------------------
def _read_changes(directory: Path) -> IndexChanges:
    path = directory / CHANGES_NAME
    if not path.exists():  # built and never changed, or saved before the index kept its changes
        return IndexChanges()
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        added, removed = recorded["added"], recorded["removed"]
        if not all(isinstance(i, str) for i in [*added, *removed]):
            raise ValueError("expected lists of ids")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DocembedError(f"cannot read {path}: {error}") from None
    return IndexChanges(list(added), list(removed))


def changes_since_build(directory: str | Path) -> IndexChanges | None:
    """What `index add` / `index remove` changed in the vector index saved in `directory` since it was
    built, read without loading its vectors; None where `directory` holds no vector index."""
    directory = Path(directory)
    if not (directory / "index.faiss").is_file() or is_bm25_dir(directory):
        return None
    metadata = read_index_meta(directory / "meta.json")
    changes = _read_changes(directory)
    for folder in _segment_folders(directory, metadata):
        changes.record_added(read_ids(folder))
    return changes


def _model_in(metadata: dict) -> str | None:
    return metadata.get("model_source") or metadata.get("model")


def recorded_model_of(directory: str | Path) -> str | None:
    """The model the index saved in `directory` was built with, read from its meta.json alone."""
    directory = Path(directory)
    if not (directory / "index.faiss").exists():
        raise DocembedError(f"{directory} is not a docembed index (no index.faiss)")
    return _model_in(read_index_meta(directory / "meta.json"))


def index_stamp(directory: str | Path) -> tuple[int, int, int] | None:
    """A cheap stamp of the index saved in `directory` (None: no meta.json, e.g. mid-swap): every change
    (build, add, remove, compaction) replaces meta.json last, so a new stamp means another index."""
    try:
        info = (Path(directory) / "meta.json").stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


# --- appended segments ----------------------------------------------------------------------------------
SEGMENTS = "added"  # folder of the segments `append_saved` writes, one numbered folder each


def _normalized(embeddings: EmbeddingSet) -> Vectors:
    """The vectors as faiss is given them: float32, L2-normalised (cosine as inner product)."""
    if embeddings.is_multi:
        data = embeddings.data
        return MultiVectors(l2_normalize(data.vectors.astype(np.float32)), data.offsets, data.positions)
    return l2_normalize(np.asarray(embeddings.data, dtype=np.float32))


def _check_addition(embeddings: EmbeddingSet, ids: list[str], metadata: dict, dim: int, multi: bool) -> None:
    """What `add` refuses: another model, NaN, ids already present or repeated, another kind or width."""
    for key in ("model", "config_hash"):
        mine, theirs = metadata.get(key), embeddings.metadata.get(key)
        if mine is not None and theirs is not None and mine != theirs:
            raise DocembedError(
                f"the new embeddings come from another model ({key}: {theirs!r}, the index: {mine!r})"
            )
    _refuse_non_finite(embeddings)
    have = set(ids)
    if len(have) != len(ids):
        raise DocembedError("the index holds duplicate ids (--allow-duplicate-ids): rebuild it instead")
    present = next((i for i in embeddings.ids if i in have), None)
    if present is not None:
        raise DocembedError(
            f"id {present!r} is already in the index: ids stay unique (to replace a document, "
            "`docembed index remove` it first)"
        )
    if len(set(embeddings.ids)) != len(embeddings.ids):
        repeated = next(i for i, n in Counter(embeddings.ids).items() if n > 1)
        raise DocembedError(f"id {repeated!r} is repeated in the new embeddings: ids stay unique")
    if embeddings.is_multi != multi:
        kind = "multi-vector" if multi else "dense"
        raise DocembedError(f"the index holds {kind} embeddings; the new ones are not")
    if embeddings.dim != dim:
        raise DocembedError(f"the new embeddings are {embeddings.dim}-d, the index's {dim}-d")


def _segment_folders(directory: Path, metadata: dict) -> list[Path]:
    """The folders of the segments meta.json names, each a plain name inside `added/`: followed, a name like
    ../../other.index/added/0001 or /etc would add another folder's vectors and ids to this index."""
    from docembed.io.readers import inside

    names = metadata.get("segments", [])
    if not isinstance(names, list):
        raise DocembedError(f"{directory / 'meta.json'}: segments is not a list of names: rebuild the index")
    return [inside(directory / SEGMENTS, name, directory / "meta.json") for name in names]


def _read_segment(folder: Path, multi: bool, dim: int) -> tuple[Vectors, list[str]]:
    try:
        vectors = np.load(folder / "vectors.npy", allow_pickle=False)
        offsets = np.load(folder / "offsets.npy", allow_pickle=False) if multi else None
        positions = _read_positions(folder, len(vectors)) if multi else None
    except (OSError, ValueError, EOFError) as error:
        raise DocembedError(f"{folder} is a damaged segment of its index: {error}") from None
    ids = read_ids(folder)
    data = MultiVectors(vectors, offsets, positions) if multi else vectors
    shape_ok = vectors.ndim == 2 and vectors.shape[1] == dim and len(data) == len(ids)
    if not shape_ok or not np.isfinite(vectors).all():
        raise DocembedError(f"{folder} is a damaged segment of its index: rebuild the index")
    return data, ids


# --- ids: a JSON array, so that any string (line breaks, \v, U+2028 ...) comes back exactly ---------------
IDS_NAME = "ids.json"
OLD_IDS_NAME = "ids.txt"  # indexes written before ids.json: one id per line


def write_ids(directory: Path, ids: list[str]) -> None:
    # ASCII with escapes: any Python string comes back exactly, a lone surrogate included
    (directory / IDS_NAME).write_text(json.dumps(ids) + "\n", encoding="ascii")


def read_ids(directory: Path) -> list[str]:
    path = directory / IDS_NAME
    try:
        if path.exists():
            ids = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ValueError("expected a JSON array of strings")
            return ids
        path = directory / OLD_IDS_NAME
        # split on \n only: str.splitlines would also split an id at \v, \f, U+2028 ...
        return path.read_text(encoding="utf-8").split("\n")[:-1]
    except FileNotFoundError:
        raise DocembedError(f"{directory} is a damaged index: no {IDS_NAME}") from None
    except (OSError, ValueError) as error:
        raise DocembedError(f"cannot read {path}: {error}") from None


# --- what load checks ---------------------------------------------------------------------------------------
def _read_faiss(path: Path):
    try:
        return _faiss().read_index(str(path))
    except RuntimeError as error:  # faiss reports a truncated or foreign file as a RuntimeError
        # faiss prefixes its reason with the C++ function and source line: keep the reason only
        reason = str(error).rpartition("Error: ")[2].strip() or "unreadable"
        raise DocembedError(f"cannot read {path}: not a faiss index or damaged ({reason})") from None


def read_index_meta(path: Path) -> dict:
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DocembedError(f"cannot read {path}: {error}") from None
    if not isinstance(metadata, dict):
        raise DocembedError(f"{path} holds a JSON {type(metadata).__name__}, not an object: a damaged index")
    return metadata


def _read_multi(directory: Path, index) -> MultiVectors:
    try:
        if (directory / "vectors.npy").exists():  # an index saved before 2026-11-25 kept a copy
            vectors = np.load(directory / "vectors.npy", allow_pickle=False)
        else:
            vectors = _held(index)
        offsets = np.load(directory / "offsets.npy", allow_pickle=False)
        if vectors.ndim != 2 or offsets.ndim != 1 or len(offsets) == 0:
            raise ValueError(f"vectors of shape {vectors.shape} and offsets of shape {offsets.shape}")
        return MultiVectors(vectors, offsets, _read_positions(directory, len(vectors)))
    except (OSError, ValueError, EOFError) as error:
        raise DocembedError(f"{directory} is a damaged index: {error}") from None


def _read_positions(folder: Path, count: int) -> np.ndarray | None:
    """The vectors' token positions, when saved (an index built before 2026-11-27 has none)."""
    if not (folder / "positions.npy").exists():
        return None
    positions = np.load(folder / "positions.npy", allow_pickle=False)
    if positions.shape != (count,):
        raise ValueError(f"{count} vectors and positions of shape {positions.shape}")
    return positions


def _check_counts(directory: Path, index, ids: list[str], metadata: dict, multi: MultiVectors | None) -> None:
    documents = len(multi) if multi is not None else index.ntotal
    vectors = len(multi.vectors) if multi is not None else len(ids)
    problem = None
    if len(ids) != documents:
        problem = f"{len(ids)} ids for {documents} documents"
    elif index.ntotal != vectors:
        problem = f"index.faiss holds {index.ntotal} vectors, the documents {vectors}"
    elif multi is not None and multi.dim != index.d:
        problem = f"vectors.npy is {multi.dim}-d, index.faiss {index.d}-d"
    elif metadata.get("dim") not in (None, index.d):
        problem = f"meta.json says {metadata.get('dim')}-d, index.faiss holds {index.d}-d vectors"
    if problem:
        raise DocembedError(
            f"{directory} is a damaged index ({problem}): rebuild it with `docembed index build`"
        )


def _check_stored_vectors(directory: Path, index, multi: MultiVectors | None, chunk: int = 65536) -> None:
    """NaN vectors make every search answer nothing; an index holding them is refused (checked in chunks,
    so a large index costs no second copy in memory). Kinds that cannot give back vectors are skipped."""
    if multi is not None:
        finite = np.isfinite(multi.vectors).all()
    else:
        try:
            if hasattr(index, "make_direct_map"):  # IVF: reconstruct needs the id -> list map
                index.make_direct_map()
            finite = all(
                np.isfinite(index.reconstruct_n(start, min(chunk, index.ntotal - start))).all()
                for start in range(0, index.ntotal, chunk)
            )
        except RuntimeError:
            return
    if not finite:
        raise DocembedError(f"{directory} holds NaN or infinite vectors: rebuild it from finite embeddings")


def check_queries(queries: Vectors, dim: int, metadata: dict, multi: bool | None = None) -> None:
    """Queries an index of `dim`-d vectors (built as `metadata` says) cannot answer are refused in one line:
    another width (a query model other than the index's), NaN, and with `multi` given, the other kind."""
    is_multi = isinstance(queries, MultiVectors)
    if multi is not None and is_multi != multi:
        kind = "multi-vector" if multi else "dense"
        raise UsageError(f"this index holds {kind} embeddings; encode queries with the index's model")
    width = queries.dim if is_multi else np.asarray(queries).shape[-1]
    if width != dim:
        model = metadata.get("model") or "the index's model"
        raise DocembedError(
            f"the queries are {width}-d embeddings but the index holds {dim}-d ones: "
            f"encode the queries with the model the index was built with ({model})"
        )
    values = queries.vectors if is_multi else np.asarray(queries)
    if not np.isfinite(values).all():
        raise DocembedError("a query embedding holds NaN or infinite values")


def _gather(multi: MultiVectors, documents: np.ndarray) -> MultiVectors:
    """The vectors of `documents` (rows of `multi`), in one fancy-indexing copy rather than a slice each."""
    starts, counts = multi.offsets[documents], multi.counts[documents]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    rows = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
    return MultiVectors(
        multi.vectors[rows], offsets, None if multi.positions is None else multi.positions[rows]
    )


def _refuse_non_finite(embeddings: EmbeddingSet) -> None:
    data = embeddings.data
    values = data.vectors if isinstance(data, MultiVectors) else np.asarray(data)
    bad_rows = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if bad_rows.any():
        row = int(np.flatnonzero(bad_rows)[0])
        document = (
            int(np.searchsorted(data.offsets, row, side="right") - 1)
            if isinstance(data, MultiVectors)
            else row
        )
        raise DocembedError(
            f"{int(bad_rows.sum())} embedding vector(s) hold NaN or infinite values (first: id "
            f"{embeddings.ids[document]!r}): an index over them would answer every search with nothing"
        )


# --- BM25 as a first stage: a sparse index, not faiss ------------------------------------------------------
BM25_KIND = "bm25"
BM25_WEIGHTS = "bm25_weights.npz"
BM25_TERMS = "bm25_terms.json"
# Every name an index folder may hold: a rebuild keeps no other file, so a folder with one is refused.
_INDEX_FILES = frozenset(
    ("index.faiss", "meta.json", "offsets.npy", "vectors.npy", IDS_NAME, OLD_IDS_NAME, SEGMENTS, CHANGES_NAME)
    + ("positions.npy", BM25_WEIGHTS, BM25_TERMS)
)


def is_bm25_dir(directory: str | Path) -> bool:
    """Whether `directory` holds a BM25 index docembed wrote (`index build CORPUS --type bm25`)."""
    directory = Path(directory)
    try:
        metadata = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(metadata, dict) and metadata.get("index_kind") == BM25_KIND


class BM25Index:
    """Okapi BM25 over a corpus, for `search`: the scores of models/baselines.BM25Scorer (its tokenizer,
    k1, b and idf, fitted on the same corpus) precomputed as a sparse documents x terms matrix of each
    term's weight in each document, so a query costs one sparse column sum, not a pass over the texts."""

    def __init__(self, weights, terms: list[str], ids: list[str], metadata: dict):
        self.weights, self.terms, self.ids, self.metadata = weights, terms, ids, metadata
        self._column = {term: j for j, term in enumerate(terms)}
        self._rows: dict[str, int] | None = None  # id -> row, built when first needed (scores_of)
        self._tuning: dict[str, int] = {}  # search settings for this process (`tune`), never saved

    @classmethod
    def build(
        cls,
        documents: Iterable,
        k1: float = 1.2,
        b: float = 0.75,
        lowercase: bool = True,
        analyzer: str = "plain",
    ) -> BM25Index:
        """From (id, text) documents (anything with .id and .text), streamed once."""
        from scipy import sparse

        from docembed.models.baselines import bm25_idf, bm25_weight
        from docembed.text import term_counts

        column: dict[str, int] = {}
        ids, rows, cols, counts, lengths = [], [], [], [], []
        for document in documents:
            tf = term_counts(document.text, analyzer, lowercase)  # a long text block by block
            rows.extend([len(ids)] * len(tf))
            cols.extend(column.setdefault(term, len(column)) for term in tf)
            counts.extend(tf.values())
            lengths.append(sum(tf.values()))
            ids.append(document.id)
        if not ids:
            raise DocembedError("cannot build an index over zero documents")
        rows_a, cols_a = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        tf_a, lengths_a = np.asarray(counts, dtype=np.float64), np.asarray(lengths, dtype=np.float64)
        n = len(ids)
        idf = bm25_idf(np.bincount(cols_a, minlength=len(column)), n)
        values = bm25_weight(tf_a, lengths_a[rows_a], idf[cols_a], lengths_a.mean(), k1, b)
        weights = sparse.csc_matrix((values, (rows_a, cols_a)), shape=(n, len(column)))
        metadata = {
            "index_kind": BM25_KIND,
            "model": BM25_KIND,
            "config": {"k1": k1, "b": b, "lowercase": lowercase, "analyzer": analyzer},
            "count": n,
            "terms": len(column),
        }
        return cls(weights, list(column), ids, metadata)

    def search_texts(self, queries: Sequence[str], k: int = 10) -> list[list[tuple[str, float]]]:
        """Top-k (id, score) per query text, best first (ties: input order); documents sharing no term
        with the query are left out."""

        results = []
        for query in queries:
            columns = self._columns(query)
            if not columns:
                results.append([])
                continue
            scores = np.asarray(self.weights[:, columns].sum(axis=1)).ravel()
            matched = np.flatnonzero(scores > 0)
            order = matched[np.lexsort((matched, -scores[matched]))][:k]
            results.append([(self.ids[r], float(np.float32(scores[r]))) for r in order])
        return results

    def _columns(self, query: str) -> list[int]:
        """The columns of the query's terms that the corpus has (each term once, as BM25 sums them)."""
        from docembed.text import analyze

        config = self.metadata.get("config", {})  # indexes from before analyzers were plain
        terms = analyze(query, config.get("analyzer", "plain"), config.get("lowercase", True))
        return sorted({self._column[t] for t in terms if t in self._column})

    def scores_of(self, query: str, doc_ids: Sequence[str]) -> np.ndarray:
        """The BM25 score of `query` for each of `doc_ids` (0 where they share no term)."""
        if self._rows is None:
            self._rows = {doc_id: row for row, doc_id in enumerate(self.ids)}
        missing = next((i for i in doc_ids if i not in self._rows), None)
        if missing is not None:
            raise DocembedError(
                f"id {missing!r} is not in the bm25 index: build both indexes from one corpus"
            )
        columns = self._columns(query)
        rows = [self._rows[i] for i in doc_ids]
        if not columns or not rows:
            return np.zeros(len(rows))
        return np.asarray(self.weights[rows][:, columns].sum(axis=1), dtype=np.float64).ravel()

    def save(self, directory: str | Path) -> None:
        from scipy import sparse

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        sparse.save_npz(directory / BM25_WEIGHTS, self.weights, compressed=False)
        (directory / BM25_TERMS).write_text(json.dumps(self.terms) + "\n", encoding="ascii")
        write_ids(directory, self.ids)
        (directory / "meta.json").write_text(json.dumps(self.metadata, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path) -> BM25Index:
        from scipy import sparse

        directory = Path(directory)
        metadata = read_index_meta(directory / "meta.json")
        try:
            weights = sparse.load_npz(directory / BM25_WEIGHTS).tocsc()
            terms = json.loads((directory / BM25_TERMS).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise DocembedError(f"{directory} is a damaged bm25 index: {error}") from None
        ids = read_ids(directory)
        if weights.shape != (len(ids), len(terms)):
            raise DocembedError(
                f"{directory} is a damaged bm25 index ({weights.shape} weights for {len(ids)} ids, "
                f"{len(terms)} terms): rebuild it with `docembed index build CORPUS --type bm25`"
            )
        return cls(weights, terms, ids, metadata)


# --- hybrid search: a fusion's two parts, each from its own index -----------------------------------------
def fused_search(
    vectors: VectorIndex,
    lexical: BM25Index,
    query_texts: Sequence[str],
    query_vectors: Vectors,
    fusion,
    k: int = 10,
    depth: int = 100,
) -> list[list[tuple[str, float]]]:
    """Top-k (id, fused score) per query for a fusion (models.fusion: weight, normalisation): the union of
    each index's top `depth` hits becomes the query's candidates, both parts score every candidate exactly
    (a document the other index did not return still gets its real score), and the scores are normalised
    over the candidates and combined as `rerank -m LEXICAL+MODEL` combines them."""
    from docembed.models.fusion import fuse

    config = fusion.config
    dense = vectors.search(query_vectors, depth)
    words = lexical.search_texts(query_texts, depth)
    results = []
    for i, text in enumerate(query_texts):
        candidates = list(dict.fromkeys([doc for doc, _ in dense[i]] + [doc for doc, _ in words[i]]))
        if not candidates:
            results.append([])
            continue
        query = (
            query_vectors.select([i]) if isinstance(query_vectors, MultiVectors) else query_vectors[i : i + 1]
        )
        model_scores = vectors.scores_of(query, candidates)
        lexical_scores = lexical.scores_of(text, candidates)
        weight = fusion.query_weights(long_query_rows(query))[0]  # the weight of the query's kind
        fused = fuse(lexical_scores[None], model_scores[None], weight, config.normalization, config.rrf_k)[0]
        order = np.argsort(-fused, kind="stable")[:k]
        results.append([(candidates[j], float(fused[j])) for j in order])
    return results


# --- what `search` and `serve` share: the hybrid checks, one search call, texts beside the hits -----------
def hybrid_fusion(encoder, lexical: BM25Index | None):
    """The fusion to search with (None: a plain vector search), after the checks that make a hybrid search
    mean what it says: `encoder` is the loaded -m model, `lexical` the --lexical-index. The query vectors
    come from the fusion's model part (`fusion.model`); the lexical scores from `lexical`."""
    if lexical is None:
        if getattr(encoder, "scorer_only", False):  # bm25, or a fusion without its lexical index
            raise UsageError(
                f"{encoder.name} scores query/document pairs: search with its model part (or, for a fusion, "
                "give --lexical-index BM25_INDEX for hybrid search), or `docembed rerank -m` the hits with it"
            )
        return None
    if encoder.family != "fusion":
        raise UsageError(HYBRID_NEEDS_FUSION)
    encoder.require_lexical("hybrid search")
    if encoder.lexical.family != "bm25":
        raise _not_bm25(encoder.name, encoder.lexical.family)
    return encoder


HYBRID_NEEDS_FUSION = "--lexical-index needs -m LEXICAL+MODEL (e.g. bm25+sbert) or a fitted fusion folder"


def _not_bm25(name: str, family: str) -> UsageError:
    return UsageError(f"hybrid search fuses a bm25 index: {name}'s lexical part is {family}")


def refuse_hybrid_spec(resolved) -> None:
    """hybrid_fusion's refusals that a model spec (registry.resolve_model's answer) shows before it loads:
    a built-in or hub model that is no fusion, a fusion whose lexical part is the built-in tf-idf. A folder
    is checked once loaded."""
    if resolved is None:  # --server: the served model is checked
        return
    if resolved.kind in ("builtin", "hub"):
        raise UsageError(HYBRID_NEEDS_FUSION)
    if resolved.kind == "fusion" and resolved.parts[0].name in ("tfidf", "tfidf-bigrams"):
        raise _not_bm25(resolved.spec, "tfidf")


def search_queries(
    vectors: VectorIndex,
    query_texts: Sequence[str],
    query_vectors: Vectors,
    k: int = 10,
    lexical: BM25Index | None = None,
    fusion=None,
    depth: int = 100,
) -> list[list[tuple[str, float]]]:
    """Top-k (id, score) per query: fused with `lexical` (each index's top max(depth, k) hits) when a
    fusion is given (`hybrid_fusion`), else the vector index's own search."""
    if fusion is None:
        return vectors.search(query_vectors, k)
    return fused_search(vectors, lexical, query_texts, query_vectors, fusion, k, max(depth, k))


def corpus_texts(
    corpus: str | Path, wanted: set[str] | None = None, id_field: str = "id", text_field: str = "text"
) -> dict[str, str]:
    """id -> text of the documents of `corpus` (.jsonl/.tsv/.txt/parquet), read once; only the `wanted`
    ids when given. An id that repeats keeps its last text."""
    from docembed.io.readers import DocumentReader

    texts = {}
    for document in DocumentReader(str(corpus), None, id_field, text_field, False):
        if wanted is None or document.id in wanted:
            texts[document.id] = document.text
    return texts


def attach_texts(rows: list[dict], texts: Mapping[str, str]) -> set[str]:
    """Give every hit of `rows` (search rows: {"results": [{"id", "score"}]}) its "text" (None where
    `texts` lacks its id); returns the ids without a text."""
    missing = set()
    for row in rows:
        for hit in row["results"]:
            hit["text"] = texts.get(hit["id"])
            if hit["text"] is None:
                missing.add(hit["id"])
    return missing
