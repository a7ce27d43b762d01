"""Collections in an embedded database: a LanceDB folder holding one Lance table, `documents`.

Columns: `id` (string, the key), `vector` (one L2-normalised vector per document, or for multi-vector
embeddings a list of them, searched by LanceDB's MaxSim), and optionally `text` (searchable through a
full-text index with English stemming) and scalar metadata fields from the corpus rows (SQL filters).
What docembed needs to know (the model, its pooling, the kind of index) is written once at build, both in
`docembed.json` beside the table (read without opening it) and in the table's schema metadata (so another
tool reading the table sees it too); an index never changes model, so it never needs rewriting.

Every change (add, update, remove, compact) is a Lance commit: a new version, written atomically, that
readers pick up while older versions stay readable (`open(version=N)`) until compaction prunes them.
docembed's own write lock (io/outputs.output_lock) keeps one writer at a time, so the checks a writer makes
(ids new to the table, say) still hold when it commits; a second writer fails at once in one line.

Scores are those of docembed.scoring: cosine for dense vectors (1 - LanceDB's cosine distance) and
mean-MaxSim for multi-vector ones (LanceDB's MaxSim sums the query vectors' maxima: divided by their
count). Approximate index kinds, or a model that smooths its passages' maxima (passage_temperature > 0)
or reads a long query whole (long_queries), fetch more candidates and rescore them exactly, as the faiss
index does.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.faiss_index import INDEX_DIRECTORY, _refuse_non_finite, check_queries
from docembed.io.outputs import DirectoryKind, output_lock
from docembed.scoring import long_query_rows, maxsim_one_to_many, passage_scoring, reads_whole
from docembed.types import EmbeddingSet, MultiVectors, Vectors, l2_normalize

TABLE = "documents"
MARKER = "docembed.json"
STORE = "lance"
RESERVED = ("id", "vector", "text")
# docembed's kinds -> LanceDB's index types (flat: none, an exact scan); hnsw and ivf as faiss names them
KINDS = {
    "flat": None,
    "ivf": "IVF_FLAT",
    "hnsw": "IVF_HNSW_SQ",
    "ivf_flat": "IVF_FLAT",
    "ivf_sq": "IVF_SQ",
    "ivf_pq": "IVF_PQ",
    "ivf_hnsw_sq": "IVF_HNSW_SQ",
    "ivf_hnsw_pq": "IVF_HNSW_PQ",
    "ivf_hnsw_flat": "IVF_HNSW_FLAT",
}
# a quantized index ranks by approximate distances: its candidates are re-read in full (refine) by default.
# PQ codes of one byte per 4 dimensions (LanceDB's default: per 16). Chosen on `static` vectors of 100,000
# IMDB half-reviews, 100 held-out validation documents as queries, one thread: recall@10 0.46 with LanceDB's
# codes and refine 10 (no nprobes helped), 0.83 / 0.96 / 0.99 per 8 dimensions (refine 10 / 30 / 100),
# 1.0 per 4 with refine 30 at 190 queries/s; bench/results/lance_dense.json has the rows at these defaults.
REFINE = {"IVF_PQ": 30, "IVF_HNSW_PQ": 30, "IVF_SQ": 2, "IVF_HNSW_SQ": 2}
PQ_DIMS_PER_CODE = 4
# the HNSW candidate list searched, as faiss' efSearch in faiss_index (LanceDB's default is far smaller:
# recall@10 0.19 against 0.62-0.90 at 100-300 on random 384-d vectors)
HNSW_EF = 128
STORAGES = ("float32", "float16")
_CHUNK = 8192  # rows per record batch written: memory stays flat however large the set
_IN_LIST = 1000  # ids per SQL IN list


def is_lance_dir(directory: str | Path) -> bool:
    """Whether `directory` holds a Lance index docembed wrote (its docembed.json names the store)."""
    directory = Path(directory)
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict) and marker.get("store") == STORE and (directory / f"{TABLE}.lance").is_dir()
    )


def _any_index(directory: Path) -> bool:
    return is_lance_dir(directory) or INDEX_DIRECTORY.recognise(directory)


def _owned(name: str) -> bool:
    return name in (MARKER, f"{TABLE}.lance") or (
        INDEX_DIRECTORY.owns is not None and INDEX_DIRECTORY.owns(name)
    )


#: what `index build -o DIR` may replace, either store: a rebuild may switch a folder from faiss to Lance
ANY_INDEX_DIRECTORY = DirectoryKind(
    "docembed index", "index.faiss and meta.json, or docembed.json and documents.lance", _any_index, _owned
)


def _lancedb():
    import os

    # the engine logs deprecation notices about its own query plans (hybrid queries cannot avoid them):
    # not the user's business; errors still show
    os.environ.setdefault("LANCEDB_LOG", "error")
    import lancedb

    return lancedb


def _pa():
    import pyarrow

    return pyarrow


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def sql_string(value: str) -> str:
    """`value` as an SQL string literal (quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _id_lists(ids: Sequence[str]) -> Iterator[str]:
    for start in range(0, len(ids), _IN_LIST):
        yield "id IN (" + ", ".join(sql_string(i) for i in ids[start : start + _IN_LIST]) + ")"


class LanceIndex:
    """An open Lance index: `table` is the LanceDB table (at `version` when one was asked for)."""

    def __init__(self, directory: Path, table, metadata: dict, pinned: bool = False):
        self.directory, self.table, self.metadata, self.pinned = Path(directory), table, metadata, pinned
        self._tuning: dict[str, int] = {}  # search settings for this process (`tune`)

    # --- what it holds ----------------------------------------------------------------------------------
    @property
    def is_multi(self) -> bool:
        return self.metadata.get("kind") == "multi"

    @property
    def dim(self) -> int:
        return int(self.metadata["dim"])

    @property
    def columns(self) -> list[str]:
        return list(self.table.schema.names)

    @property
    def has_text(self) -> bool:
        return "text" in self.columns

    @property
    def fields(self) -> list[str]:
        return [name for name in self.columns if name not in RESERVED]

    @property
    def version(self) -> int:
        return int(self.table.version)

    @property
    def passage_temperature(self) -> float:
        return float(self.metadata.get("passage_temperature", 0.0))

    @property
    def long_queries(self) -> str:
        return str(self.metadata.get("long_queries", "passages"))

    @property
    def passage_group_tokens(self) -> int:
        return 0  # build refuses vectors scored by windows: a collection keeps no token positions

    @property
    def lance_type(self) -> str | None:
        return KINDS.get(self.metadata.get("index_kind", "flat"))

    def __len__(self) -> int:
        return int(self.table.count_rows())

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and bool(self.rows_of([doc_id], []))

    def recorded_model(self) -> str | None:
        """The model the index was built with (a saved model's path first), as faiss indexes record it."""
        return self.metadata.get("model_source") or self.metadata.get("model")

    def ids(self) -> list[str]:
        count = len(self)
        if count == 0:
            return []
        return self.table.search().select(["id"]).limit(count).to_arrow()["id"].to_pylist()

    def versions(self) -> list[dict]:
        """(version, timestamp, rows) of every version still on disk, oldest first."""
        return [
            {
                "version": v["version"],
                "timestamp": str(v["timestamp"]),
                "rows": v["metadata"].get("total_rows"),
            }
            for v in self.table.list_versions()
        ]

    # --- build and open ---------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        directory: str | Path,
        embeddings: EmbeddingSet,
        kind: str = "flat",
        storage: str = "float32",
        texts: Mapping[str, str] | None = None,
        fields: Mapping[str, Mapping[str, object]] | None = None,
        index_options: Mapping[str, object] | None = None,
    ) -> LanceIndex:
        """Write `embeddings` as a new table in `directory` (a folder to fill: `index build` stages it),
        with their texts (id -> text) and metadata fields (name -> id -> scalar) when given; then the
        vector index of `kind`, a B-tree on id and, over stored text, a full-text index."""
        if kind not in KINDS:
            raise UsageError(f"unknown Lance index type {kind!r}; choose one of {', '.join(KINDS)}")
        if storage not in STORAGES:
            raise UsageError(f"a Lance index holds float32 or float16 vectors, not {storage}")
        if len(embeddings) == 0:
            raise DocembedError("cannot build an index over zero embeddings")
        _refuse_non_finite(embeddings)
        refuse_repeated_ids(embeddings.ids, "the embeddings")
        fields = dict(fields or {})
        clash = next((name for name in fields if name in RESERVED), None)
        if clash:
            raise UsageError(f"--fields: {clash!r} is a column of the index already (id, vector, text)")
        metadata = collection_metadata(
            embeddings.metadata, embeddings.dim, embeddings.is_multi, kind, storage
        )
        pa = _pa()
        schema = _schema(embeddings.dim, embeddings.is_multi, storage, texts is not None, fields, metadata)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        batches = _record_batches(schema, embeddings, texts, fields)
        try:
            db = _lancedb().connect(str(directory))
            table = db.create_table(TABLE, pa.RecordBatchReader.from_batches(schema, batches))
        except (ValueError, TypeError, OSError, RuntimeError) as error:
            raise DocembedError(f"cannot write the Lance table: {_one_line(error)}") from None
        index = cls(directory, table, metadata)
        index._create_indexes(kind, dict(index_options or {}))
        _write_marker(directory, index.version, metadata)
        return index

    def _create_indexes(self, kind: str, options: dict) -> None:
        from lancedb.index import FTS, BTree

        try:
            self.table.create_index("id", config=BTree())  # merge_insert, delete and lookups by id
            if self.has_text:
                self.table.create_index("text", config=FTS(stem=True, language="English"))
            lance_type = KINDS[kind]
            if lance_type is not None:
                self.table.create_index("vector", config=_vector_index_config(lance_type, options, self.dim))
        except (ValueError, RuntimeError, OSError) as error:
            raise DocembedError(f"cannot build the {kind} index: {_one_line(error)}") from None

    @classmethod
    def open(cls, directory: str | Path, version: int | None = None) -> LanceIndex:
        directory = Path(directory)
        if not is_lance_dir(directory):
            raise DocembedError(f"{directory} is not a docembed Lance index (no {MARKER} and {TABLE}.lance)")
        try:
            marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
            metadata = marker["metadata"]
            if marker.get("table", TABLE) != TABLE:  # the one table docembed writes: no name read from a file
                raise ValueError(f"{MARKER} names the table {marker['table']!r}, not {TABLE!r}")
            table = _lancedb().connect(str(directory)).open_table(TABLE)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            raise DocembedError(f"cannot open the Lance index {directory}: {_one_line(error)}") from None
        if version is not None:
            try:
                table.checkout(int(version))
            except (ValueError, RuntimeError) as error:
                have = ", ".join(str(v["version"]) for v in table.list_versions())
                raise DocembedError(
                    f"{directory} has no version {version} ({_one_line(error)}); versions on disk: {have}"
                ) from None
        return cls(directory, table, metadata, pinned=version is not None)

    # --- search -----------------------------------------------------------------------------------------
    def search(
        self,
        queries: Vectors,
        k: int = 10,
        where: str | None = None,
        nprobes: int | None = None,
        refine_factor: int | None = None,
        ef: int | None = None,
    ) -> list[list[tuple[str, float]]]:
        """Top-k (id, score) per query, best first, among the rows that `where` (an SQL filter, applied
        before the vector search) keeps. `nprobes`, `refine_factor`, `ef`: an approximate index's search
        settings, instead of those recorded at build."""
        tuning = {**self._tuning}
        tuning.update(
            {k: v for k, v in (("nprobes", nprobes), ("refine_factor", refine_factor), ("ef", ef)) if v}
        )
        self._check_queries(queries)
        if self.is_multi:
            return [
                self._search_multi(l2_normalize(queries[i].astype(np.float32)), k, where, tuning)
                for i in range(len(queries))
            ]
        vectors = l2_normalize(np.asarray(queries, dtype=np.float32))
        results: list[list[tuple[str, float]]] = [[] for _ in range(len(vectors))]
        if len(vectors) == 0:
            return results
        # one LanceDB call for the batch: its rows name their query (query_index)
        builder = self._vector_query(list(vectors), k, where, tuning)
        builder = builder.select(["id", "_distance"])  # named: LanceDB warns when it adds it itself
        found = self._run(builder)
        which = (
            found["query_index"].to_numpy() if "query_index" in found.column_names else np.zeros(len(found))
        )
        scores = 1.0 - found["_distance"].to_numpy().astype(np.float64)
        for q, doc_id, score in zip(which, found["id"].to_pylist(), scores, strict=True):
            results[int(q)].append((doc_id, float(score)))
        for hits in results:
            hits.sort(key=lambda hit: -hit[1])
        return results

    def tune(self, nprobe: int | None = None, candidates: int | None = None) -> LanceIndex:
        """Search with these settings from now on (`search --nprobe/--candidates`): an IVF index's lists
        probed, and a multi-vector search's candidate documents rescored exactly."""
        self._tuning.update(
            {key: value for key, value in (("nprobes", nprobe), ("candidates", candidates)) if value}
        )
        return self

    def _vector_query(self, query, limit: int, where, tuning: dict | None = None):
        builder = self.table.search(query, vector_column_name="vector").distance_type("cosine").limit(limit)
        if self.lance_type is not None:
            settings = dict(self.metadata.get("search", {}))
            settings.update({key: value for key, value in (tuning or {}).items() if value is not None})
            for key in ("nprobes", "refine_factor", "ef"):
                if settings.get(key):
                    builder = getattr(builder, key)(int(settings[key]))
        if where:
            builder = builder.where(where, prefilter=True)
        return builder

    def _search_multi(self, query: np.ndarray, k: int, where, tuning: dict) -> list[tuple[str, float]]:
        if len(query) == 0:
            return []
        # LanceDB's MaxSim is exact over a flat table; an approximate index, maxima smoothed over passages
        # or a long query read whole get more candidates, rescored here from their stored vectors
        exact = (
            self.lance_type is None
            and self.passage_temperature == 0
            and not reads_whole(query, self.long_queries)
        )
        depth = k if exact else max(k, tuning.get("candidates") or max(4 * k, 64))
        builder = self._vector_query(query, depth, where, tuning)
        found = self._run(builder.select(["id", "_distance"] + ([] if exact else ["vector"])))
        ids = found["id"].to_pylist()
        if exact:
            scores = 1.0 - found["_distance"].to_numpy().astype(np.float64) / len(query)
        else:
            docs = _multi_from_arrow(found["vector"], self.dim)
            scores = maxsim_one_to_many(query, docs, *passage_scoring(self)).astype(np.float64)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(ids[j], float(scores[j])) for j in order]

    def hybrid_search(
        self,
        query_texts: Sequence[str],
        queries: Vectors,
        k: int = 10,
        where: str | None = None,
        depth: int = 100,
    ) -> list[list[tuple[str, float]]]:
        """Top-k (id, fused score) per query: LanceDB's hybrid query, the vector ranking and the full-text
        ranking of the stored text (BM25, English stems), each `depth` deep, fused by reciprocal rank (its
        RRF reranker: the sum of 1 / (60 + rank) over the two rankings)."""
        if not self.has_text:
            raise UsageError(
                "--hybrid needs the documents' text in the index: build it with --text-from CORPUS"
            )
        self._check_queries(queries)
        results = []
        for i, text in enumerate(query_texts):
            vector = queries[i] if self.is_multi else np.asarray(queries)[i]
            vector = l2_normalize(np.asarray(vector, dtype=np.float32))
            if len(vector) == 0 or not text.strip():  # nothing to fuse: the vector ranking alone
                one = queries.select([i]) if self.is_multi else np.asarray(queries)[i : i + 1]
                results.append(self.search(one, k, where)[0])
                continue
            builder = self.table.search(query_type="hybrid", vector_column_name="vector", fts_columns="text")
            builder = builder.vector(vector).text(text).distance_type("cosine").limit(max(k, depth))
            if where:
                builder = builder.where(where, prefilter=True)
            found = self._run(builder.select(["id"]))
            scores = found["_relevance_score"].to_numpy().astype(np.float64)
            results.append(list(zip(found["id"].to_pylist(), map(float, scores), strict=True))[:k])
        return results

    def fused_search(
        self,
        query_texts: Sequence[str],
        queries: Vectors,
        fusion,
        k: int = 10,
        where: str | None = None,
        depth: int = 100,
    ) -> list[list[tuple[str, float]]]:
        """Top-k (id, fused score) per query for a fusion model (`-m bm25+MODEL`, a fitted fusion folder:
        models.fusion, with its validated weight): the union of the vector search's and the full-text
        search's top `depth` ids are a query's candidates, which the fusion scores as `docembed rerank -m
        FUSION` scores one row of them. Its lexical part is fitted on the candidates' stored texts when it
        needs fitting (as rerank fits it on a row's candidates), the model part's exact scores come from
        the stored vectors, and the two are normalised over the candidates and combined."""
        from docembed.models.fusion import fuse

        if not self.has_text:
            raise UsageError(
                "hybrid search needs the documents' text in the index: build it with --text-from"
            )
        self._check_queries(queries)
        fit_per_query = fusion.requires_fit  # a built-in pair; a fitted fusion folder keeps its own fit
        dense = self.search(queries, depth, where)
        results = []
        for i, text in enumerate(query_texts):
            candidates = list(
                dict.fromkeys([doc for doc, _ in dense[i]] + self._full_text(text, depth, where))
            )
            if not candidates:
                results.append([])
                continue
            stored = self.rows_of(candidates, ["text"])
            texts = [stored[doc]["text"] or "" for doc in candidates]
            if fit_per_query:
                fusion.lexical.fit(texts)
            lexical = fusion.lexical_scores([text], texts)
            one = queries.select([i]) if isinstance(queries, MultiVectors) else np.asarray(queries)[i : i + 1]
            model = self.scores_of(one, candidates)[None].astype(np.float64)
            config = fusion.config
            weight = fusion.query_weights(long_query_rows(one))[0]  # the weight of the query's kind
            fused = fuse(lexical, model, weight, config.normalization, config.rrf_k)[0]
            order = np.argsort(-fused, kind="stable")[:k]
            results.append([(candidates[j], float(fused[j])) for j in order])
        return results

    def _full_text(self, text: str, limit: int, where: str | None) -> list[str]:
        """The ids of the `limit` best full-text matches of `text` (BM25 over English stems), best first."""
        if not text.strip():
            return []
        builder = self.table.search(text, query_type="fts", fts_columns="text").limit(limit)
        if where:
            builder = builder.where(where, prefilter=True)
        return self._run(builder.select(["id"]))["id"].to_pylist()

    def scores_of(self, query: Vectors, doc_ids: Sequence[str]) -> np.ndarray:
        """The exact score of one query (a batch of one) against each of `doc_ids`, as `search` scores a
        hit: the cosine to the stored vector, or mean-MaxSim (passages smoothed as the model pools them)."""
        stored = self.vectors_of(doc_ids)
        if not doc_ids:
            return np.zeros(0)
        if self.is_multi:
            vectors = l2_normalize(np.asarray(query.vectors, dtype=np.float32))
            return maxsim_one_to_many(vectors, stored, *passage_scoring(self)).astype(np.float64)
        vector = l2_normalize(np.asarray(query, dtype=np.float32)).ravel()
        return stored.astype(np.float64) @ vector

    def vectors_of(self, doc_ids: Sequence[str]) -> Vectors:
        """The stored vectors of each of `doc_ids`, in order: a MultiVectors for a multi-vector table (each
        document's passages, for `search --passages`), else one row each."""
        found = self._rows_table(doc_ids, ["vector"])
        row_of = {doc: row for row, doc in enumerate(found["id"].to_pylist())} if found is not None else {}
        missing = next((doc for doc in doc_ids if doc not in row_of), None)
        if missing is not None:
            raise DocembedError(f"id {missing!r} is not in the index")
        if not doc_ids:
            return MultiVectors.from_list([]) if self.is_multi else np.zeros((0, self.dim), dtype=np.float32)
        column = found["vector"].take(_pa().array([row_of[doc] for doc in doc_ids], _pa().int64()))
        if self.is_multi:
            return _multi_from_arrow(column, self.dim)
        return _dense_from_arrow(column, self.dim)

    def _run(self, builder):
        try:
            return builder.to_arrow()
        except (ValueError, RuntimeError, OSError) as error:
            raise DocembedError(f"the Lance search failed: {_one_line(error)}") from None

    def check_filter(self, where: str) -> None:
        """Run `where` (an SQL filter) on the table once, for one row: a mistake in it (a column the table
        lacks, a typo in the SQL) is found before a model loads to encode the queries."""
        try:
            self.table.search().where(where).select(["id"]).limit(1).to_arrow()
        except (ValueError, RuntimeError, OSError) as error:
            have = ", ".join(self.fields) or "none"
            raise UsageError(f"--where {where!r}: {_one_line(error)} (the fields: {have})") from None

    def _check_queries(self, queries: Vectors) -> None:
        check_queries(queries, self.dim, self.metadata, multi=self.is_multi)

    # --- rows by id -------------------------------------------------------------------------------------
    def rows_of(self, ids: Sequence[str], columns: Sequence[str]) -> dict[str, dict]:
        """id -> {column: value} for the ids of `ids` the table holds."""
        found = self._rows_table(ids, columns)
        return {row["id"]: row for row in found.to_pylist()} if found is not None else {}

    def _rows_table(self, ids: Sequence[str], columns: Sequence[str]):
        """The rows (id and `columns`) of the ids of `ids` the table holds, as one Arrow table (None for no
        ids), fetched by SQL IN lists of _IN_LIST ids."""
        parts = [
            self._run(self.table.search().where(condition).select(["id", *columns]).limit(_IN_LIST))
            for condition in _id_lists(list(dict.fromkeys(ids)))
        ]
        return _pa().concat_tables(parts) if parts else None

    def texts_of(self, ids: Sequence[str]) -> dict[str, str | None]:
        """id -> stored text of each of `ids` the table holds."""
        if not self.has_text:
            return {}
        return {i: row["text"] for i, row in self.rows_of(ids, ["text"]).items()}

    def stored(self, doc_id: str) -> Vectors:
        """The stored (normalised) embedding of `doc_id`, shaped as a query batch of one."""
        found = self._run(self.table.search().where(f"id = {sql_string(doc_id)}").select(["vector"]).limit(1))
        if len(found) == 0:
            raise DocembedError(f"id {doc_id!r} is not in the index")
        if self.is_multi:
            return _multi_from_arrow(found["vector"], self.dim)
        return _dense_from_arrow(found["vector"], self.dim)

    def more_like(self, doc_ids: Sequence[str], k: int = 10, where: str | None = None):
        """Top-k documents nearest each stored document, the document itself left out."""
        results = []
        for doc_id in doc_ids:
            hits = self.search(self.stored(doc_id), k + 1, where)[0]
            results.append([hit for hit in hits if hit[0] != doc_id][:k])
        return results

    # --- changes: each one Lance commit, under docembed's write lock --------------------------------------
    @contextmanager
    def _writing(self) -> Iterator[None]:
        if self.pinned:
            raise UsageError("an index opened at an earlier version is read-only")
        with output_lock(self.directory, ANY_INDEX_DIRECTORY):
            self.table.checkout_latest()  # another process may have committed since it was opened
            yield

    def add(
        self,
        embeddings: EmbeddingSet,
        texts: Mapping[str, str] | None = None,
        fields: Mapping[str, Mapping[str, object]] | None = None,
    ) -> int:
        """Append documents whose ids are new to the table; returns the new version."""
        self._check_addition(embeddings, texts, fields)
        with self._writing():
            present = self.rows_of(list(embeddings.ids), [])
            if present:
                first = next(i for i in embeddings.ids if i in present)
                raise DocembedError(
                    f"{len(present)} id(s) already in the index (first: {first!r}): ids stay unique; "
                    "`docembed index update` replaces documents by id"
                )
            schema = self.table.schema
            batches = _record_batches(schema, embeddings, texts, dict(fields or {}))
            try:
                self.table.add(_pa().RecordBatchReader.from_batches(schema, batches))
            except (ValueError, TypeError, OSError, RuntimeError) as error:
                raise DocembedError(f"cannot add to {self.directory}: {_one_line(error)}") from None
            return self.version

    def update(
        self,
        embeddings: EmbeddingSet,
        texts: Mapping[str, str] | None = None,
        fields: Mapping[str, Mapping[str, object]] | None = None,
    ) -> tuple[int, int, int]:
        """Replace the rows with these ids (their vectors, and their text and fields where given; the rest
        is kept) and insert the ids that are new, in one commit (merge_insert on id). Returns
        (updated, inserted, version)."""
        self._check_addition(embeddings, texts, fields)
        fields = dict(fields or {})
        names = ["id", "vector"] + (["text"] if texts is not None else []) + list(fields)
        table_schema = self.table.schema
        pa = _pa()
        schema = pa.schema([table_schema.field(name) for name in names], metadata=table_schema.metadata)
        with self._writing():
            batches = list(_record_batches(schema, embeddings, texts, fields))
            try:
                result = (
                    self.table.merge_insert("id")
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute(pa.Table.from_batches(batches, schema))
                )
            except (ValueError, TypeError, OSError, RuntimeError) as error:
                raise DocembedError(f"cannot update {self.directory}: {_one_line(error)}") from None
            return int(result.num_updated_rows), int(result.num_inserted_rows), self.version

    def remove(self, ids: Iterable[str]) -> tuple[int, int, int]:
        """Delete the rows with these ids (unknown ids are ignored), in one commit; returns (removed, left,
        version). Nothing to remove writes nothing."""
        wanted = list(dict.fromkeys(ids))
        with self._writing():
            before = len(self)
            present = list(self.rows_of(wanted, []))
            if present:
                condition = " OR ".join(f"({c})" for c in _id_lists(present))
                try:
                    self.table.delete(condition)
                except (ValueError, OSError, RuntimeError) as error:
                    raise DocembedError(f"cannot remove from {self.directory}: {_one_line(error)}") from None
            left = len(self)
            return before - left, left, self.version

    def compact(self, prune: bool = False) -> int:
        """Rewrite small data files into larger ones, bring the indexes up to date with rows added since
        they were built, and (with `prune`) delete every version but the latest. Returns the version."""
        from datetime import timedelta

        with self._writing(), warnings.catch_warnings():
            # its warning that pruning breaks readers of old versions: what --prune says it does
            warnings.simplefilter("ignore", UserWarning)
            try:
                self.table.optimize(cleanup_older_than=timedelta(0) if prune else None)
            except (ValueError, OSError, RuntimeError) as error:
                raise DocembedError(f"cannot compact {self.directory}: {_one_line(error)}") from None
            return self.version

    def _check_addition(self, embeddings: EmbeddingSet, texts, fields) -> None:
        """What add and update refuse: another model, another kind or width, NaN, repeated ids, text for an
        index without text, fields the table lacks."""
        for key in ("model", "config_hash"):
            mine, theirs = self.metadata.get(key), embeddings.metadata.get(key)
            if mine is not None and theirs is not None and mine != theirs:
                raise DocembedError(
                    f"the new embeddings come from another model ({key}: {theirs!r}, the index: {mine!r})"
                )
        if embeddings.is_multi != self.is_multi:
            kind = "multi-vector" if self.is_multi else "dense"
            raise DocembedError(f"the index holds {kind} embeddings; the new ones are not")
        if embeddings.dim != self.dim:
            raise DocembedError(f"the new embeddings are {embeddings.dim}-d, the index's {self.dim}-d")
        _refuse_non_finite(embeddings)
        refuse_repeated_ids(embeddings.ids, "the new embeddings")
        if texts is not None and not self.has_text:
            raise UsageError(f"{self.directory} holds no text: build it with --text-from to store text")
        unknown = next((name for name in fields or {} if name not in self.fields), None)
        if unknown is not None:
            have = ", ".join(self.fields) or "none"
            raise UsageError(f"--fields: the index has no field {unknown!r} (its fields: {have})")


def refuse_undoing_changes(output: str | Path, source: str | Path, ids: Sequence[str]) -> None:
    """Refuse a rebuild of the Lance index at `output` from `source` (its embeddings' `ids`) that would
    drop documents added since it was built, or bring back removed ones (its build version against its
    latest, while the build version is on disk): --overwrite says to rebuild from `source` alone."""
    if not is_lance_dir(output):
        return
    added, removed = changes_since_build(output)
    have = set(ids)
    dropped = [i for i in added if i not in have]
    revived = [i for i in removed if i in have]
    if dropped:
        raise DocembedError(
            f"{output} holds {len(dropped)} document(s) added since it was built (first: {dropped[0]!r}) "
            f"that {source} lacks: a rebuild from {source} would drop them; pass --overwrite to rebuild from "
            f"{source} alone, or encode them into {source} first"
        )
    if revived:
        raise DocembedError(
            f"{output} lacks {len(revived)} document(s) removed since it was built (first: {revived[0]!r}) "
            f"that {source} still holds: a rebuild from {source} would bring them back; pass --overwrite to "
            f"rebuild from {source} alone, or take them out of {source} first"
        )


def changes_since_build(directory: str | Path) -> tuple[list[str], list[str]]:
    """(ids added, ids removed) between the version the index was built as and its latest: what a rebuild
    from the build's embeddings would undo. The removed ids are known only while the build version is
    on disk (`index compact --prune` deletes it)."""
    directory = Path(directory)
    latest = LanceIndex.open(directory)
    now = latest.ids()
    try:
        built = json.loads((directory / MARKER).read_text(encoding="utf-8")).get("built_version")
        then = LanceIndex.open(directory, int(built)).ids() if built is not None else None
    except (OSError, ValueError, TypeError, DocembedError):
        then = None
    if then is None:
        return now, []  # no build version to compare with: every id counts as added
    was, present = set(then), set(now)
    return [i for i in now if i not in was], [i for i in then if i not in present]


# --- either store, by what a folder holds: what `serve` and `search` open ---------------------------------
def open_index(directory: str | Path):
    """The vector index in `directory`: a LanceIndex for a Lance folder, else a faiss VectorIndex."""
    from docembed.faiss_index import VectorIndex

    return LanceIndex.open(directory) if is_lance_dir(directory) else VectorIndex.load(directory)


def index_stamp(directory: str | Path):
    """A cheap stamp that changes with every change of the index in `directory`, either store (None while
    it cannot be read): a Lance table's newest manifest (every commit writes one), or faiss' meta.json."""
    from docembed.faiss_index import index_stamp as faiss_stamp

    directory = Path(directory)
    if not is_lance_dir(directory):
        return faiss_stamp(directory)
    try:  # Lance names manifests u64::MAX - version: the newest has the smallest number
        manifests = [
            int(p.stem)
            for p in (directory / f"{TABLE}.lance" / "_versions").iterdir()
            if p.suffix == ".manifest"
        ]
    except (OSError, ValueError):
        return None
    return (len(manifests), min(manifests)) if manifests else None


def recorded_model_of(directory: str | Path) -> str | None:
    """The model the index in `directory` was built with, read without opening it, either store."""
    from docembed.faiss_index import recorded_model_of as faiss_model

    directory = Path(directory)
    if not is_lance_dir(directory):
        return faiss_model(directory)
    metadata = recorded_metadata_of(directory)
    return metadata.get("model_source") or metadata.get("model")


def recorded_metadata_of(directory: str | Path) -> dict:
    """The embeddings' metadata the index in `directory` keeps, read without opening it, either store."""
    from docembed.faiss_index import read_index_meta

    directory = Path(directory)
    if not is_lance_dir(directory):
        return read_index_meta(directory / "meta.json")
    return json.loads((directory / MARKER).read_text(encoding="utf-8")).get("metadata", {})


# --- a collection written in pieces: writers write fragments, one commit makes the table ------------------
# The Lance file version LanceDB writes itself (0.40): fragments written by pylance open in its reader
FRAGMENT_FILE_VERSION = "2.2"


PYLANCE_MISSING = "a Lance collection written by many workers needs pylance: pip install pylance"


def require_pylance() -> None:
    """Fail in one line when pylance is missing, without importing it: once imported it warns at every fork
    (Ray's processes start after this check)."""
    import importlib.util

    if importlib.util.find_spec("lance") is None:
        raise DocembedError(PYLANCE_MISSING)


def import_pylance():
    try:
        import lance
    except ImportError:
        raise DocembedError(PYLANCE_MISSING) from None
    return lance


def write_fragments(directory: str | Path, embeddings: EmbeddingSet, texts: Mapping[str, str] | None = None):
    """Write `embeddings` (one piece of a collection) as Lance data files of the table in `directory`,
    uncommitted: returns the fragments' metadata as JSON strings, for `commit_fragments`. Rows as `build`
    writes them (vectors normalised; `texts`, id -> text, as the text column when given)."""
    if len(embeddings) == 0:
        return []  # no rows: no fragment (the other pieces make the table)
    _refuse_non_finite(embeddings)
    schema = _schema(embeddings.dim, embeddings.is_multi, "float32", texts is not None, {}, {})
    batches = _record_batches(schema, embeddings, texts, {})
    reader = _pa().RecordBatchReader.from_batches(schema, batches)
    try:
        fragments = import_pylance().fragment.write_fragments(
            reader,
            str(Path(directory) / f"{TABLE}.lance"),
            schema=schema,
            mode="create",  # the table does not exist until commit_fragments
            data_storage_version=FRAGMENT_FILE_VERSION,
        )
    except (ValueError, TypeError, OSError, RuntimeError) as error:
        raise DocembedError(f"cannot write Lance fragments in {directory}: {_one_line(error)}") from None
    return [json.dumps(fragment.to_json()) for fragment in fragments]


def commit_fragments(
    directory: str | Path, fragments: Sequence[str], metadata: dict, text: bool = False
) -> LanceIndex:
    """Make the table of `directory` from `fragments` (write_fragments' JSON, in row order) in one commit,
    then what `build` adds for a flat index: the B-tree on id, the full-text index over `text`, and
    docembed.json. `metadata`: the embeddings' (model, dim, kind "dense" or "multi"). An error leaves no
    committed table only when `directory` is staged (encode writes it through io.outputs.directory_output)."""
    lance = import_pylance()
    directory = Path(directory)
    dim, multi = int(metadata["dim"]), metadata.get("kind") == "multi"
    metadata = collection_metadata(metadata, dim, multi)
    schema = _schema(dim, multi, "float32", text, {}, metadata)
    pieces = [lance.fragment.FragmentMetadata.from_json(fragment) for fragment in fragments]
    try:
        lance.LanceDataset.commit(
            str(directory / f"{TABLE}.lance"), lance.LanceOperation.Overwrite(schema, pieces)
        )
        table = _lancedb().connect(str(directory)).open_table(TABLE)
    except (ValueError, TypeError, OSError, RuntimeError) as error:
        raise DocembedError(f"cannot commit the Lance table in {directory}: {_one_line(error)}") from None
    index = LanceIndex(directory, table, metadata)
    refuse_repeated_ids(index.ids(), "the encoded documents")  # pieces cannot see each other's ids
    index._create_indexes("flat", {})
    _write_marker(directory, index.version, metadata)
    return index


def collection_metadata(
    metadata: Mapping[str, object], dim: int, multi: bool, kind: str = "flat", storage: str = "float32"
) -> dict:
    """What a collection records of its embeddings' `metadata`: the model and the kind of index, not the
    rows' text digests or a count (the table counts its rows). Vectors scored by windows of their token
    positions are refused: a collection keeps no positions, so it could not score them as their model does."""
    if metadata.get("passage_group_tokens"):
        raise UsageError(
            "these vectors are scored by windows of their token positions (nugget-passages, or nugget with "
            "--passage-temperature), which a Lance collection does not keep: use --store faiss, or encode "
            "with plain nugget"
        )
    recorded = dict(metadata, index_kind=kind, storage=storage, dim=dim)
    recorded.pop("text_hashes", None)  # the rows' text digests (encode --reuse): not the index's
    recorded.pop("count", None)  # the table counts its rows; a count here would go stale
    recorded["kind"] = "multi" if multi else "dense"
    refine = REFINE.get(KINDS[kind])
    recorded["search"] = {"refine_factor": refine} if refine else {}
    if "HNSW" in (KINDS[kind] or ""):
        recorded["search"]["ef"] = HNSW_EF
    return recorded


def _write_marker(directory: Path, version: int, metadata: dict) -> None:
    marker = {"store": STORE, "table": TABLE, "built_version": version, "metadata": metadata}
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


# --- a collection read back as embeddings: what `index build COLLECTION` reads ------------------------------
# what a collection records about itself, not about its embeddings
_INDEX_KEYS = ("index_kind", "search", "kind")


def is_lance_dataset(path: str | Path) -> bool:
    """Whether `path` is a docembed collection folder or a Lance table folder (NAME.lance/_versions)."""
    path = Path(path)
    return is_lance_dir(path) or (path.suffix == ".lance" and (path / "_versions").is_dir())


def load_collection(path: str | Path) -> EmbeddingSet:
    """The ids and vectors (as stored: normalised) of a collection, with its embeddings' metadata: a
    docembed Lance folder, or its table folder (documents.lance), whose schema metadata names the model."""
    path = Path(path)
    if is_lance_dir(path):
        index = LanceIndex.open(path)
        table, metadata = index.table, dict(index.metadata)
    else:
        try:
            table = _lancedb().connect(str(path.parent)).open_table(path.name.removesuffix(".lance"))
        except (OSError, ValueError, RuntimeError) as error:
            raise DocembedError(f"cannot open the Lance table {path}: {_one_line(error)}") from None
        raw = (table.schema.metadata or {}).get(b"docembed")
        if raw is None or not {"id", "vector"} <= set(table.schema.names):
            raise DocembedError(
                f"{path} is a Lance table without docembed's id, vector and metadata: not written by docembed"
            )
        metadata = json.loads(raw)
    count = int(table.count_rows())
    if count == 0:
        raise DocembedError(f"{path} holds no documents")
    rows = table.search().select(["id", "vector"]).limit(count).to_arrow()
    dim = int(metadata["dim"])
    multi = metadata.get("kind") == "multi"
    vectors = _multi_from_arrow(rows["vector"], dim) if multi else _dense_from_arrow(rows["vector"], dim)
    kept = {key: value for key, value in metadata.items() if key not in _INDEX_KEYS}
    return EmbeddingSet(vectors, rows["id"].to_pylist(), kept)


# --- arrow: the table's schema and record batches ----------------------------------------------------------
def _schema(dim: int, multi: bool, storage: str, text: bool, fields: Mapping[str, Mapping], metadata: dict):
    pa = _pa()
    value = pa.float16() if storage == "float16" else pa.float32()
    vector = pa.list_(value, dim)
    columns = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("vector", pa.list_(vector) if multi else vector),
    ]
    if text:
        columns.append(pa.field("text", pa.string()))
    for name, values in fields.items():
        if not values:  # a misspelt name would make a column of nulls that every --where then fails on
            raise UsageError(f"--fields: no document's row has a field {name!r}")
        columns.append(pa.field(name, _field_type(name, values)))
    return pa.schema(columns, metadata={b"docembed": json.dumps(metadata).encode("utf-8")})


def _field_type(name: str, values: Mapping[str, object]):
    pa = _pa()
    try:
        kind = pa.array(list(values.values())).type
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise DocembedError(f"--fields: the values of {name!r} mix types ({_one_line(error)})") from None
    return pa.string() if pa.types.is_null(kind) else kind  # a field null in every row: text


def _record_batches(schema, embeddings: EmbeddingSet, texts, fields) -> Iterator:
    """The rows of `embeddings` as record batches of `schema`, _CHUNK documents at a time: vectors
    normalised (cosine as the stored vectors' dot product, as faiss holds them), text and fields by id."""
    pa = _pa()
    data, ids = embeddings.data, list(embeddings.ids)
    vector_type = schema.field("vector").type
    for start in range(0, len(ids), _CHUNK):
        stop = min(start + _CHUNK, len(ids))
        chunk = ids[start:stop]
        columns = []
        for column in schema:
            if column.name == "id":
                columns.append(pa.array(chunk, pa.string()))
            elif column.name == "vector":
                columns.append(_vector_array(data, start, stop, vector_type))
            elif column.name == "text":
                columns.append(pa.array([texts.get(i) if texts else None for i in chunk], pa.string()))
            else:
                values = fields.get(column.name, {})
                try:
                    columns.append(pa.array([values.get(i) for i in chunk], column.type))
                except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                    raise DocembedError(
                        f"--fields: {column.name!r} holds {column.type} in the index: {_one_line(error)}"
                    ) from None
        yield pa.record_batch(columns, schema=schema)


def _vector_array(data: Vectors, start: int, stop: int, vector_type):
    pa = _pa()
    if isinstance(data, MultiVectors):
        lo, hi = int(data.offsets[start]), int(data.offsets[stop])
        flat = l2_normalize(np.asarray(data.vectors[lo:hi], dtype=np.float32))
        inner = vector_type.value_type
        values = pa.FixedSizeListArray.from_arrays(
            pa.array(flat.ravel().astype(inner.value_type.to_pandas_dtype())), inner.list_size
        )
        offsets = (data.offsets[start : stop + 1] - lo).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=vector_type)
    flat = l2_normalize(np.asarray(data[start:stop], dtype=np.float32))
    values = pa.array(flat.ravel().astype(vector_type.value_type.to_pandas_dtype()))
    return pa.FixedSizeListArray.from_arrays(values, vector_type.list_size)


def _dense_from_arrow(column, dim: int) -> np.ndarray:
    flat = column.combine_chunks().flatten() if hasattr(column, "combine_chunks") else column.flatten()
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


def _multi_from_arrow(column, dim: int) -> MultiVectors:
    lists = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    offsets = lists.offsets.to_numpy().astype(np.int64)
    inner = lists.flatten()  # the rows' vectors, a slice honoured
    vectors = np.asarray(inner.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
    return MultiVectors(vectors, offsets - offsets[0])


def _vector_index_config(lance_type: str, options: dict, dim: int):
    from lancedb import index as lance

    if lance_type.endswith("_PQ") and "num_sub_vectors" not in options and dim % PQ_DIMS_PER_CODE == 0:
        options = {**options, "num_sub_vectors": dim // PQ_DIMS_PER_CODE}

    config = {
        "IVF_FLAT": lance.IvfFlat,
        "IVF_SQ": lance.IvfSq,
        "IVF_PQ": lance.IvfPq,
        "IVF_HNSW_SQ": lance.IvfHnswSq,
        "IVF_HNSW_PQ": lance.IvfHnswPq,
        "IVF_HNSW_FLAT": lance.IvfHnswFlat,
    }[lance_type]
    return config(distance_type="cosine", **options)


def refuse_repeated_ids(ids: Sequence[str], what: str) -> None:
    """A Lance index keys its rows by id: `what` (the embeddings' name) may not repeat one."""
    if len(set(ids)) != len(ids):
        repeated = next(i for i, n in Counter(ids).items() if n > 1)
        raise DocembedError(
            f"{what}: {len(ids) - len(set(ids))} duplicate id(s) (first: {repeated!r}): "
            "a Lance index keys its rows by id"
        )


# --- the corpus columns: texts and scalar fields by id ------------------------------------------------------
SCALARS = (str, int, float, bool, type(None))


def corpus_columns(
    corpus: str,
    fields: Sequence[str],
    wanted: set[str],
    id_field: str = "id",
    text_field: str = "text",
    with_text: bool = True,
) -> tuple[dict[str, str] | None, dict[str, dict[str, object]]]:
    """(id -> text, field -> id -> value) of the rows of `corpus` whose ids are `wanted`: texts from any
    format docembed reads, fields (scalar JSON values) from JSON Lines or Parquet rows. A repeated id keeps
    its last row."""
    from docembed.faiss_index import corpus_texts
    from docembed.io.readers import infer_format, input_kind

    texts = corpus_texts(corpus, wanted, id_field, text_field) if with_text else None
    values: dict[str, dict[str, object]] = {name: {} for name in fields}
    if not fields:
        return texts, values
    fmt = "parquet" if input_kind(corpus) == "dir" else infer_format(corpus)
    if fmt == "jsonl":
        from docembed.io.readers import iter_jsonl_lines

        for line, row in iter_jsonl_lines(corpus):
            doc_id = row.get(id_field)
            doc_id = str(doc_id) if isinstance(doc_id, int) and not isinstance(doc_id, bool) else doc_id
            if doc_id not in wanted:
                continue
            for name in fields:
                if name not in row:  # absent: null in the table, and a field no row has is refused (_schema)
                    continue
                value = row[name]
                if not isinstance(value, SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
                    raise DocembedError(
                        f"{corpus}:{line}: field {name!r} is {type(value).__name__}: --fields takes scalar "
                        "fields (string, number, boolean, null)"
                    )
                values[name][doc_id] = value
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(corpus, columns=[id_field, *fields])
        except (OSError, ValueError, KeyError) as error:
            raise DocembedError(f"cannot read --fields from {corpus}: {_one_line(error)}") from None
        ids = [str(i) for i in table[id_field].to_pylist()]
        for name in fields:
            for doc_id, value in zip(ids, table[name].to_pylist(), strict=True):
                if doc_id in wanted:
                    values[name][doc_id] = value
    else:
        raise UsageError(f"--fields reads JSON Lines or Parquet rows; {corpus} is {fmt}")
    return texts, values
