"""Collections in LanceDB (#46): `index build --store lance` and the commands over it. Scores agree with the
faiss flat index and docembed.scoring on the same vectors; filters, stored text, hybrid search, add / update /
remove as versions, a second writer, and the table read by another tool (Polars); killed writers and the
default store: test_lance_store.py."""

import json
import os

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import save_embeddings
from docembed.types import EmbeddingSet, MultiVectors

pytest.importorskip("lancedb")

WORDS = ["cats run fast", "dogs are running", "fish swim slowly", "birds fly high"]


def _unit(rng, n, dim=32):
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _dense(path, x, ids, **metadata):
    save_embeddings(EmbeddingSet(x, list(ids), dict(metadata)), str(path))
    return path


def _multi(rng, n, dim=16, most=6):
    counts = rng.integers(1, most + 1, size=n)
    return MultiVectors(_unit(rng, int(counts.sum()), dim), np.concatenate([[0], np.cumsum(counts)]))


def _corpus(path, n, start=0):
    with open(path, "w") as handle:
        for i in range(start, start + n):
            row = {
                "id": f"d{i}",
                "text": f"{WORDS[i % 4]} number {i}",
                "year": 2000 + i,
                "lang": ["en", "fr"][i % 2],
            }
            handle.write(json.dumps(row) + "\n")
    return path


def _one_line_error(result, code=1) -> str:
    lines = result.err.strip().splitlines()
    assert result.code == code and len(lines) == 1 and lines[0].startswith("docembed: error: "), result.err
    return lines[0]


def _rows(out):
    return [json.loads(line) for line in out.splitlines()]


# --- the same answers as faiss and docembed.scoring ------------------------------------------------------
def test_dense_search_matches_the_faiss_flat_index(tmp_path):
    from docembed.faiss_index import VectorIndex
    from docembed.lance_index import LanceIndex

    rng = np.random.default_rng(46)
    x = rng.normal(size=(300, 32)).astype(np.float32) * 3  # not unit: both normalise
    emb = EmbeddingSet(x, [f"d{i}" for i in range(300)], {"model": "m"})
    queries = rng.normal(size=(12, 32)).astype(np.float32)
    lance = LanceIndex.build(tmp_path / "l", emb)
    faiss_hits = VectorIndex.build(emb, "flat").search(queries, 10)
    lance_hits = lance.search(queries, 10)
    for mine, theirs in zip(lance_hits, faiss_hits, strict=True):
        assert [i for i, _ in mine] == [i for i, _ in theirs]
        np.testing.assert_allclose([s for _, s in mine], [s for _, s in theirs], atol=1e-5)
    # opened again from disk, with a filter: the same ranking restricted to the rows it keeps
    again = LanceIndex.open(tmp_path / "l")
    kept = again.search(queries[:1], 5, where="id >= 'd2'")[0]
    cosines = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (queries[0] / np.linalg.norm(queries[0]))
    allowed = [j for j in np.argsort(-cosines, kind="stable") if f"d{j}" >= "d2"][:5]
    assert [i for i, _ in kept] == [f"d{j}" for j in allowed]


def test_multi_vector_search_is_mean_maxsim(tmp_path):
    from docembed.faiss_index import VectorIndex
    from docembed.lance_index import LanceIndex
    from docembed.scoring import LONG_QUERY_PASSAGES, maxsim_one_to_many

    rng = np.random.default_rng(7)
    docs = _multi(rng, 80)
    emb = EmbeddingSet(docs, [f"d{i}" for i in range(80)], {"model": "m"})
    queries = _multi(rng, 5, most=4)
    lance = LanceIndex.build(tmp_path / "l", emb)
    assert lance.is_multi and len(lance) == 80
    faiss_hits = VectorIndex.build(emb, "flat").search(queries, 10)
    for i, hits in enumerate(lance.search(queries, 10)):
        exact = maxsim_one_to_many(queries[i], docs)
        order = np.argsort(-exact, kind="stable")[:10]
        assert [h for h, _ in hits] == [f"d{j}" for j in order]
        np.testing.assert_allclose([s for _, s in hits], exact[order], atol=1e-5)
        assert [h for h, _ in hits] == [h for h, _ in faiss_hits[i]]
    # a model that smooths its maxima (passage_temperature): candidates rescored as scoring does
    warm = LanceIndex.build(tmp_path / "t", EmbeddingSet(docs, emb.ids, {"passage_temperature": 0.1}))
    hits = warm.search(queries.select([0]), 5)[0]
    exact = maxsim_one_to_many(queries[0], docs, 0.1)
    order = np.argsort(-exact, kind="stable")[:5]
    assert [h for h, _ in hits] == [f"d{j}" for j in order]
    np.testing.assert_allclose([s for _, s in hits], exact[order], atol=1e-5)
    # a model that reads a long query whole (long_queries): its candidates rescored the same way
    whole = LanceIndex.build(tmp_path / "w", EmbeddingSet(docs, emb.ids, {"long_queries": "whole"}))
    long_query = MultiVectors.from_list([_unit(rng, LONG_QUERY_PASSAGES, 16)])
    hits = whole.search(long_query, 5)[0]
    exact = maxsim_one_to_many(long_query[0], docs, 0.0, "whole")
    order = np.argsort(-exact, kind="stable")[:5]
    assert [h for h, _ in hits] == [f"d{j}" for j in order]
    np.testing.assert_allclose([s for _, s in hits], exact[order], atol=1e-5)


def test_cli_more_like_this_equals_faiss(capfd, tmp_path):
    rng = np.random.default_rng(3)
    emb = _dense(tmp_path / "e.npy", _unit(rng, 60), [f"d{i}" for i in range(60)], model="m")
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", tmp_path / "f").code == 0
    assert invoke(capfd, "index", "build", emb, "-o", tmp_path / "l", "--store", "lance").code == 0
    faiss_rows = _rows(invoke(capfd, "search", tmp_path / "f", "--id", "d3", "--id", "d9", "-k", "5").out)
    lance_rows = _rows(invoke(capfd, "search", tmp_path / "l", "--id", "d3", "--id", "d9", "-k", "5").out)
    for mine, theirs in zip(lance_rows, faiss_rows, strict=True):
        assert [h["id"] for h in mine["results"]] == [h["id"] for h in theirs["results"]]
        np.testing.assert_allclose(
            [h["score"] for h in mine["results"]], [h["score"] for h in theirs["results"]], atol=2e-6
        )


# --- text, fields, filters, hybrid, the model recorded ------------------------------------------------------
@pytest.fixture(scope="module")
def glove_collection(tmp_path_factory):
    """40 documents encoded with glove-avg, their corpus (text, year, lang) and a Lance index of both."""
    from docembed.models.registry import load_model

    folder = tmp_path_factory.mktemp("glove")
    corpus = _corpus(folder / "c.jsonl", 40)
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    model = load_model("glove-avg")
    x = model.encode([r["text"] for r in rows], 32)
    emb = _dense(folder / "e.npy", x, [r["id"] for r in rows], model="glove-avg")
    return folder, corpus, emb


def test_build_with_text_and_fields_then_search_filter_and_hybrid(capfd, tmp_path, glove_collection):
    folder, corpus, emb = glove_collection
    index = tmp_path / "l"
    misspelt = invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance", "--text-from", corpus,
                      "--fields", "year,lagn")  # fmt: skip
    assert misspelt.code == 2 and "no document's row has a field 'lagn'" in misspelt.err
    assert not index.exists()  # not a column of nulls that every --where on it fails against
    built = invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance", "--text-from", corpus,
                   "--fields", "year,lang")  # fmt: skip
    assert built.code == 0, built.err
    assert json.loads((index / "docembed.json").read_text())["metadata"]["model"] == "glove-avg"
    # the model comes from the index, as with faiss; hits carry the stored text
    result = invoke(capfd, "search", index, "--query", "running dogs", "-k", "3")
    assert result.code == 0, result.err
    (row,) = _rows(result.out)
    assert row["query"] == "running dogs" and all(h["text"].startswith(WORDS[1]) for h in row["results"])
    faiss_index = tmp_path / "f"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", faiss_index).code == 0
    (theirs,) = _rows(invoke(capfd, "search", faiss_index, "--query", "running dogs", "-k", "3").out)
    assert [h["id"] for h in row["results"]] == [h["id"] for h in theirs["results"]]
    # a prefilter on the stored fields
    result = invoke(
        capfd, "search", index, "--query", "cats", "-k", "5", "--where", "lang = 'fr' AND year > 2010"
    )
    hits = _rows(result.out)[0]["results"]
    assert len(hits) == 5 and all(int(h["id"][1:]) % 2 == 1 and int(h["id"][1:]) > 10 for h in hits)
    for mistake in ("year >>= 3", "yaer > 2010"):  # one line naming the filter, before the model loads
        result = invoke(capfd, "search", index, "--query", "cats", "--where", mistake, "-m", "no-such-model")
        assert (
            result.code == 2
            and f"--where {mistake!r}" in result.err
            and "the fields: year, lang" in result.err
        )
    # hybrid: the full-text ranking (English stems: "swimming" finds "swim") fused with the vectors
    result = invoke(capfd, "search", index, "--query", "swimming", "-k", "4", "--hybrid")
    assert result.code == 0, result.err
    assert all("fish swim" in h["text"] for h in _rows(result.out)[0]["results"])
    trec = invoke(capfd, "search", index, "--query", "birds", "-k", "2", "--output-format", "trec").out
    assert [line.split()[:4] for line in trec.splitlines()][0][:2] == ["0", "Q0"] and len(
        trec.splitlines()
    ) == 2
    # a bad filter, and Lance options on a faiss index: one line each
    assert (
        "no field named"
        in _one_line_error(invoke(capfd, "search", index, "--id", "d1", "--where", "nope > 1"), 2).lower()
    )
    assert "--where" in _one_line_error(invoke(capfd, "search", faiss_index, "--id", "d1", "--where", "x"), 2)


def test_the_table_reads_with_polars(tmp_path, glove_collection):
    import lancedb
    import polars as pl

    folder, corpus, emb = glove_collection
    from docembed.io.embeddings import load_embeddings
    from docembed.lance_index import LanceIndex, corpus_columns

    data = load_embeddings(str(emb))
    texts, fields = corpus_columns(str(corpus), ["year"], set(data.ids))
    LanceIndex.build(tmp_path / "l", data, texts=texts, fields=fields)
    table = lancedb.connect(str(tmp_path / "l")).open_table("documents")
    frame = table.to_polars().filter(pl.col("year") >= 2030).select("id", "text", "vector").collect()
    assert sorted(frame["id"].to_list()) == sorted(f"d{i}" for i in range(30, 40))
    vectors = np.asarray(frame["vector"].to_list(), dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)  # stored normalised
    assert json.loads(table.schema.metadata[b"docembed"])["model"] == "glove-avg"


# --- refusals -----------------------------------------------------------------------------------------------
def test_non_finite_vectors_and_duplicate_ids_are_refused(capfd, tmp_path):
    x = _unit(np.random.default_rng(1), 10)
    emb = _dense(tmp_path / "nan.npy", x, [f"d{i}" for i in range(10)])
    x[4, 2] = np.nan
    np.save(emb, x)  # NaN written by another tool (save_embeddings refuses them)
    message = _one_line_error(invoke(capfd, "index", "build", emb, "-o", tmp_path / "a", "--store", "lance"))
    assert "NaN or infinite" in message  # the loader refuses it first; the index refuses it too
    from docembed.errors import DocembedError
    from docembed.lance_index import LanceIndex

    with pytest.raises(DocembedError, match="NaN or infinite values \\(first: id 'd4'\\)"):
        LanceIndex.build(tmp_path / "c", EmbeddingSet(x, [f"d{i}" for i in range(10)]))
    dup = _dense(tmp_path / "dup.npy", _unit(np.random.default_rng(2), 4), ["a", "b", "a", "c"])
    message = _one_line_error(invoke(capfd, "index", "build", dup, "-o", tmp_path / "b", "--store", "lance"))
    assert "duplicate id" in message and "'a'" in message
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --- add, update, remove, versions, compaction ------------------------------------------------------------
def test_add_update_remove_and_versions(capfd, tmp_path):
    from docembed.lance_index import LanceIndex

    rng = np.random.default_rng(11)
    x = _unit(rng, 30)
    corpus = _corpus(tmp_path / "c.jsonl", 30)
    emb = _dense(tmp_path / "e.npy", x[:20], [f"d{i}" for i in range(20)], model="m")
    more = _dense(tmp_path / "more.npy", x[20:], [f"d{i}" for i in range(20, 30)], model="m")
    index = tmp_path / "l"
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance", "--text-from", corpus,
                  "--fields", "year").code == 0  # fmt: skip
    built = LanceIndex.open(index).version
    result = invoke(capfd, "index", "add", index, more, "--text-from", corpus)
    assert result.code == 0 and f"version {built + 1}" in result.err, result.err
    opened = LanceIndex.open(index)
    assert len(opened) == 30 and opened.texts_of(["d25"]) == {"d25": f"{WORDS[1]} number 25"}
    assert opened.rows_of(["d25"], ["year"])["d25"]["year"] == 2025
    message = _one_line_error(invoke(capfd, "index", "add", index, more))
    assert "already in the index" in message and "index update" in message
    # update: d0 gets d29's vector, keeps its text; x is a new id
    new = _dense(tmp_path / "new.npy", np.stack([x[29], x[5]]), ["d0", "x"], model="m")
    result = invoke(capfd, "index", "update", index, new)
    assert result.code == 0 and "updated 1 and inserted 1" in result.err, result.err
    opened = LanceIndex.open(index)
    np.testing.assert_allclose(opened.stored("d0")[0], x[29], atol=1e-6)
    assert opened.texts_of(["d0"])["d0"] == f"{WORDS[0]} number 0" and len(opened) == 31
    (row,) = _rows(invoke(capfd, "search", index, "--id", "d0", "-k", "1").out)
    assert row["results"][0]["id"] == "d29"
    # remove, unknown ids counted
    (tmp_path / "gone.txt").write_text("d1\nd2\nnope\n")
    result = invoke(capfd, "index", "remove", index, "--ids", tmp_path / "gone.txt")
    assert result.code == 0 and "removed 2 documents" in result.err and "1 id(s) not in" in result.err
    latest = LanceIndex.open(index)
    assert len(latest) == 29 and "d1" not in latest.ids()
    # every earlier version stays readable: the build's answers come back
    (old,) = _rows(invoke(capfd, "search", index, "--id", "d3", "-k", "30", "--version", str(built)).out)
    assert len(old["results"]) == 19 and {"d1", "d2"} <= {h["id"] for h in old["results"]}
    assert "d25" not in {h["id"] for h in old["results"]}
    message = _one_line_error(invoke(capfd, "search", index, "--id", "d3", "--version", "999"))
    assert "no version 999" in message
    # compaction keeps the rows; --prune drops the old versions
    assert invoke(capfd, "index", "compact", index).code == 0
    assert invoke(capfd, "search", index, "--id", "d3", "--version", str(built)).code == 0
    assert invoke(capfd, "index", "compact", index, "--prune").code == 0
    assert len(LanceIndex.open(index)) == 29
    assert invoke(capfd, "search", index, "--id", "d3", "--version", str(built)).code == 1
    assert "Lance index" in _one_line_error(invoke(capfd, "index", "update", tmp_path / "nothing", new), 2)


def test_a_second_writer_fails_at_once(capfd, tmp_path):
    from docembed.io.outputs import output_lock
    from docembed.lance_index import ANY_INDEX_DIRECTORY

    rng = np.random.default_rng(5)
    emb = _dense(tmp_path / "e.npy", _unit(rng, 10), [f"d{i}" for i in range(10)])
    more = _dense(tmp_path / "m.npy", _unit(rng, 2), ["n0", "n1"])
    index = tmp_path / "l"
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance").code == 0
    with output_lock(index, ANY_INDEX_DIRECTORY):  # another writer holds the index
        message = _one_line_error(invoke(capfd, "index", "add", index, more))
    assert "another" in message and "writing" in message and "(pid " in message
    assert invoke(capfd, "index", "add", index, more).code == 0


def test_a_stale_rebuild_that_would_undo_changes_is_refused(capfd, tmp_path):
    rng = np.random.default_rng(47)
    emb = _dense(tmp_path / "e.npy", _unit(rng, 20), [f"d{i}" for i in range(20)])
    more = _dense(tmp_path / "more.npy", _unit(rng, 2), ["n0", "n1"])
    index = tmp_path / "l"
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance").code == 0
    assert invoke(capfd, "index", "add", index, more).code == 0
    when = emb.stat().st_mtime + 5
    os.utime(emb, (when, when))  # the input is newer: make's rule alone would rebuild and drop n0, n1
    message = _one_line_error(invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance"))
    assert "2 document(s) added since it was built (first: 'n0')" in message and "--overwrite" in message
    (tmp_path / "gone.txt").write_text("n0\nn1\nd4\n")
    assert invoke(capfd, "index", "remove", index, "--ids", tmp_path / "gone.txt").code == 0
    message = _one_line_error(invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance"))
    assert "1 document(s) removed since it was built (first: 'd4')" in message
    # --overwrite rebuilds from the file alone; a faiss build may replace the Lance folder, and back
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance", "--overwrite").code == 0
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index, "--overwrite").code == 0
    assert (index / "index.faiss").exists() and not (index / "docembed.json").exists()
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance", "--overwrite").code == 0
    assert not (index / "index.faiss").exists() and (index / "documents.lance").is_dir()


# --- index migrate: a faiss index (its added segments too) becomes a Lance one ----------------------------
@pytest.mark.parametrize("multi", [False, True])
def test_migrate_keeps_ids_vectors_model_and_additions(capfd, tmp_path, multi):
    rng = np.random.default_rng(7)
    data = _multi(rng, 30) if multi else _unit(rng, 30)
    ids = [f"d{i}" for i in range(30)]
    first = EmbeddingSet(data.select(range(25)) if multi else data[:25], ids[:25], {"model": "m"})
    later = EmbeddingSet(data.select(range(25, 30)) if multi else data[25:], ids[25:], {"model": "m"})
    save_embeddings(first, str(tmp_path / "a.npz"))
    save_embeddings(later, str(tmp_path / "b.npz"))
    assert (
        invoke(
            capfd, "-q", "index", "build", "--store", "faiss", tmp_path / "a.npz", "-o", tmp_path / "f.index"
        ).code
        == 0
    )
    assert invoke(capfd, "-q", "index", "add", tmp_path / "f.index", tmp_path / "b.npz").code == 0
    corpus = _corpus(tmp_path / "c.jsonl", 30)
    migrated = invoke(
        capfd,
        "-q",
        "index",
        "migrate",
        tmp_path / "f.index",
        "-o",
        tmp_path / "l",
        "--text-from",
        corpus,
        "--fields",
        "year",
    )
    assert migrated.code == 0, migrated.err
    faiss_rows = _rows(
        invoke(capfd, "search", tmp_path / "f.index", "--id", "d3", "--id", "d27", "-k", "5").out
    )
    lance_rows = _rows(invoke(capfd, "search", tmp_path / "l", "--id", "d3", "--id", "d27", "-k", "5").out)
    for mine, theirs in zip(lance_rows, faiss_rows, strict=True):
        assert [h["id"] for h in mine["results"]] == [h["id"] for h in theirs["results"]]
        np.testing.assert_allclose(
            [h["score"] for h in mine["results"]], [h["score"] for h in theirs["results"]], atol=1e-5
        )
        assert all(h["text"].endswith(f"number {h['id'][1:]}") for h in mine["results"])
    from docembed.lance_index import LanceIndex

    table = LanceIndex.open(tmp_path / "l")
    assert sorted(table.ids()) == sorted(ids) and table.recorded_model() == "m" and table.fields == ["year"]
    # the faiss index is left as it was; a second migrate to the same folder needs --overwrite
    assert (tmp_path / "f.index" / "index.faiss").is_file()
    again = invoke(capfd, "-q", "index", "migrate", tmp_path / "f.index", "-o", tmp_path / "l")
    assert "exists" in _one_line_error(again)


def test_migrate_refuses_what_is_not_a_faiss_index(capfd, tmp_path):
    _dense(tmp_path / "e.npy", _unit(np.random.default_rng(1), 5), [f"d{i}" for i in range(5)])
    assert (
        invoke(
            capfd, "-q", "index", "build", tmp_path / "e.npy", "-o", tmp_path / "l", "--store", "lance"
        ).code
        == 0
    )
    assert "not a faiss index" in _one_line_error(
        invoke(capfd, "index", "migrate", tmp_path / "l", "-o", tmp_path / "x"), code=2
    )
    corpus = _corpus(tmp_path / "c.jsonl", 5)
    assert invoke(capfd, "-q", "index", "build", corpus, "-t", "bm25", "-o", tmp_path / "b").code == 0
    assert "bm25" in _one_line_error(
        invoke(capfd, "index", "migrate", tmp_path / "b", "-o", tmp_path / "x"), code=2
    )


# --- search settings: recorded at build, tuned per search --------------------------------------------------
def test_multi_vector_search_settings_trade_recall_for_work(capfd, tmp_path):
    from docembed.faiss_index import VectorIndex
    from docembed.scoring import maxsim_one_to_many

    rng = np.random.default_rng(3)
    data = _multi(rng, 400, dim=16, most=8)
    emb = EmbeddingSet(data, [f"d{i}" for i in range(400)], {"model": "m"})
    save_embeddings(emb, str(tmp_path / "m.npz"))
    assert (
        invoke(
            capfd,
            "-q",
            "index",
            "build",
            "--store",
            "faiss",
            tmp_path / "m.npz",
            "-o",
            tmp_path / "i",
            "-t",
            "ivf",
        ).code
        == 0
    )
    index = VectorIndex.load(tmp_path / "i")
    recorded = index.search_settings()
    assert set(recorded) == {"nprobe", "candidates", "rescore"} and recorded["nprobe"] <= index.nlist
    query = data.select([0])
    exact = maxsim_one_to_many(query.vectors, data)
    # every list probed and every vector a candidate: the exact ranking
    everything = index.search(query, 10, nprobe=index.nlist, candidates=len(data.vectors))[0]
    assert [i for i, _ in everything] == [f"d{j}" for j in np.argsort(-exact, kind="stable")[:10]]
    # one list and one candidate per query vector: fewer documents scored, each still exactly
    narrow = index.search(query, 10, nprobe=1, candidates=1)[0]
    assert len(narrow) <= len(query.vectors)
    for doc_id, score in narrow:
        assert abs(score - exact[int(doc_id[1:])]) < 1e-4
    # a shortlist of the documents whose hits promise most (at least k): the document every query vector hit
    # best (itself) is on it, and every score is still exact
    short = index.search(query, 3, nprobe=index.nlist, candidates=40, rescore=1)[0]
    assert len(short) == 3 and short[0] == ("d0", pytest.approx(1.0, abs=1e-4))
    for doc_id, score in short:
        assert abs(score - exact[int(doc_id[1:])]) < 1e-4
    # the CLI's --nprobe/--candidates are the same settings
    out = invoke(
        capfd, "search", tmp_path / "i", "--id", "d0", "-k", "10", "--nprobe", "1", "--candidates", "1"
    ).out
    assert [h["id"] for h in _rows(out)[0]["results"]] == [i for i, _ in narrow if i != "d0"][:10]
    refused = invoke(capfd, "search", tmp_path / "i", "--id", "d0", "--nprobe", "0")
    assert refused.code == 2


# --- hybrid with a fusion model: the candidates ranked as rerank ranks them --------------------------------
def test_hybrid_with_a_fusion_ranks_as_rerank_over_the_same_candidates(capfd, tmp_path, glove_collection):
    folder, corpus, emb = glove_collection
    index = tmp_path / "l"
    assert (
        invoke(
            capfd, "-q", "index", "build", emb, "-o", index, "--store", "lance", "--text-from", corpus
        ).code
        == 0
    )
    texts = {json.loads(line)["id"]: json.loads(line)["text"] for line in corpus.read_text().splitlines()}
    for query in ("fish swimming slowly", "dogs running"):
        # a depth over the collection's size: every document is a candidate
        found = invoke(
            capfd, "search", index, "--query", query, "-m", "bm25+glove-avg", "-k", "40", "--depth", "100"
        )
        assert found.code == 0, found.err
        hits = _rows(found.out)[0]["results"]
        assert sorted(h["id"] for h in hits) == sorted(texts)
        task = tmp_path / "task.jsonl"
        task.write_text(json.dumps({"query": query, "candidates": list(texts.values())}) + "\n")
        reranked = invoke(capfd, "rerank", task, "-m", "bm25+glove-avg")
        assert reranked.code == 0, reranked.err
        ranking = json.loads(reranked.out)["ranking"]
        id_of = {text: doc for doc, text in texts.items()}
        assert [h["id"] for h in hits] == [id_of[r["text"]] for r in ranking]
        np.testing.assert_allclose([h["score"] for h in hits], [r["score"] for r in ranking], atol=2e-5)
    # the fusion's lexical part is what ranks "swimming" (a stem of the text, not a word of it) by words
    shallow = _rows(
        invoke(
            capfd, "search", index, "--query", "swim", "-m", "bm25+glove-avg", "-k", "3", "--depth", "3"
        ).out
    )
    assert all("fish swim" in h["text"] for h in shallow[0]["results"])
    # without stored text there is nothing to fuse: one line before any model loads
    bare = tmp_path / "bare"
    assert invoke(capfd, "-q", "index", "build", emb, "-o", bare, "--store", "lance").code == 0
    refused = invoke(capfd, "search", bare, "--query", "x", "-m", "bm25+glove-avg")
    assert "holds no text" in _one_line_error(refused, code=2)
