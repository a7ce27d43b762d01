"""`docembed encode --engine ray -o X.lance`: the actors write Lance fragments, the driver commits them once.

The collection must be what `index build --store lance` writes from a local encode of the same input (rows
in input order, normalised vectors), open at once for search and the index commands, read back by `index
build`, and by other tools (Polars, DuckDB) as a plain table; a failed run commits nothing. One Ray instance
serves the module; conftest's tiny sbert models keep each encode to seconds.
"""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cli_helpers import invoke
from docembed.errors import DocembedError
from docembed.io.embeddings import load_embeddings
from docembed.types import l2_normalize
from test_ray_engine import ray_instance  # noqa: F401 (one Ray for the module)

lance = pytest.importorskip("lance")
# pylance warns at every fork once imported (Ray starts processes); the tests' own reads fork nothing
pytestmark = [
    pytest.mark.filterwarnings("ignore:lance is not fork-safe:UserWarning"),
    pytest.mark.xdist_group("ray"),  # one local Ray at a time (make test runs pytest-xdist)
]

WORDS = ["cat", "dog", "bank", "river", "rate", "market", "music", "film", "rain", "sun", "tree", "city"]


def _text(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 3 + i % 9)) + f" number {i}."


RECORDS = [{"id": f"doc{i}", "text": _text(i)} for i in range(40)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def collection(ray_instance, corpus, tiny_sbert_dir, tmp_path_factory):  # noqa: F811
    """The corpus as a Lance collection with its texts (3 shards), written once for the module: tests that
    change it change a copy."""
    from docembed.engines.ray_engine import RayOptions, encode_with_ray

    out = tmp_path_factory.mktemp("collection") / "docs.lance"
    options = RayOptions(num_workers=2, rows_per_shard=16)
    summary = encode_with_ray(str(corpus), str(out), str(tiny_sbert_dir), options=options, store_text=True)
    assert summary["count"] == 40 and len(summary["shards"]) == 3
    return out


def _copy(path, tmp_path):
    import shutil

    return Path(shutil.copytree(path, tmp_path / path.name))


def _ray_encode(capfd, source, out, model, *extra):
    args = ("--engine", "ray", "--num-workers", "2", "--rows-per-shard", "16", "-o", out, "-m", model)
    return invoke(capfd, "encode", source, *args, *extra)


def _table(path):
    return lance.dataset(str(path / "documents.lance")).to_table()


def test_collection_matches_local_encode_and_opens_everywhere(
    capfd, collection, corpus, tiny_sbert_dir, tmp_path
):
    from docembed.lance_index import LanceIndex

    assert not list(collection.parent.glob(".*"))  # no staging folder left beside it
    local_path = tmp_path / "local.parquet"
    assert invoke(capfd, "encode", corpus, "-m", tiny_sbert_dir, "-o", local_path).code == 0
    local = load_embeddings(str(local_path))

    # the rows: ids in input order, the local vectors normalised (as `index build --store lance` keeps them)
    table = _table(collection)
    assert table["id"].to_pylist() == local.ids == [r["id"] for r in RECORDS]
    vectors = np.asarray(table["vector"].combine_chunks().flatten().to_numpy(), dtype=np.float32)
    np.testing.assert_allclose(vectors.reshape(40, -1), l2_normalize(local.data), atol=1e-5)
    assert table["text"].to_pylist() == [r["text"] for r in RECORDS]

    # docembed's metadata, beside the table and in its schema; one commit made the table's rows
    marker = json.loads((collection / "docembed.json").read_text())
    assert marker["store"] == "lance" and marker["metadata"]["model"] == str(tiny_sbert_dir)
    assert marker["metadata"]["dim"] == 32 and marker["metadata"]["kind"] == "dense"
    assert json.loads(table.schema.metadata[b"docembed"]) == marker["metadata"]
    index = LanceIndex.open(collection)
    assert index.has_text and len(index) == 40 and int(index.versions()[0]["rows"]) == 40

    # search works on it at once: exact, and hybrid over the stored text
    found = invoke(capfd, "search", collection, "--query", _text(7), "-k", "3")
    assert found.code == 0, found.err
    assert json.loads(found.out)["results"][0]["id"] == "doc7"
    hybrid = invoke(capfd, "search", collection, "--query", _text(7), "-k", "3", "--hybrid")
    assert hybrid.code == 0 and json.loads(hybrid.out)["results"][0]["id"] == "doc7", hybrid.err

    # so do the index commands: a removal is a new version
    changed, ids = _copy(collection, tmp_path), tmp_path / "gone.txt"
    ids.write_text("doc3\n")
    assert invoke(capfd, "index", "remove", changed, "--ids", ids).code == 0
    assert len(LanceIndex.open(changed)) == 39

    # a re-run without --overwrite is refused in one line, before any Ray work
    again = _ray_encode(capfd, corpus, changed, tiny_sbert_dir)
    assert again.code == 1 and "--overwrite" in again.err and len(again.err.strip().splitlines()) == 1


def test_index_build_reads_a_collection(capfd, collection, tmp_path):
    from docembed.lance_index import load_collection

    query = ("--query", _text(12), "-k", "5")
    expected = json.loads(invoke(capfd, "search", collection, *query).out)["results"]

    faiss_index = tmp_path / "docs.index"
    result = invoke(capfd, "index", "build", collection, "-o", faiss_index, "--store", "faiss")
    assert result.code == 0 and "indexed 40 documents" in result.err, result.err
    found = json.loads(invoke(capfd, "search", faiss_index, *query).out)["results"]
    assert [hit["id"] for hit in found] == [hit["id"] for hit in expected]
    assert [hit["score"] for hit in found] == pytest.approx([hit["score"] for hit in expected], abs=1e-5)

    # a collection from a collection, and from the table folder itself
    for source, target in ((collection, "copy.lance"), (collection / "documents.lance", "again.lance")):
        result = invoke(capfd, "index", "build", source, "-o", tmp_path / target, "--store", "lance")
        assert result.code == 0, result.err
        assert _table(tmp_path / target)["id"].to_pylist() == [r["id"] for r in RECORDS]

    # a Lance table docembed did not write, or none, says so in one line
    foreign = tmp_path / "foreign.lance"
    lance.write_dataset(pa.table({"id": ["a"], "v": [1.0]}), str(foreign))
    result = invoke(capfd, "index", "build", foreign, "-o", tmp_path / "x.index")
    assert result.code == 1 and "not written by docembed" in result.err
    assert "Traceback" not in result.err
    with pytest.raises(DocembedError, match="cannot open the Lance table"):
        load_collection(tmp_path / "missing.lance")


@pytest.mark.slow  # a Ray run of its own: 40 s on a shared 2-core machine (make test-all)
def test_multi_vector_collection_matches_local(capfd, ray_instance, corpus, tiny_sbert_tokens_dir, tmp_path):  # noqa: F811
    from docembed.lance_index import load_collection

    out, local_path = tmp_path / "tokens", tmp_path / "local.parquet"
    result = _ray_encode(capfd, corpus, out, tiny_sbert_tokens_dir, "--output-format", "lance")
    assert result.code == 0, result.err
    assert "encoded 40 documents" in result.err and "Lance collection, 3 shards" in result.err
    assert invoke(capfd, "encode", corpus, "-m", tiny_sbert_tokens_dir, "-o", local_path).code == 0
    local, stored = load_embeddings(str(local_path)), load_collection(out)
    assert stored.is_multi and stored.ids == local.ids
    np.testing.assert_array_equal(stored.data.offsets, local.data.offsets)
    np.testing.assert_allclose(stored.data.vectors, l2_normalize(local.data.vectors), atol=1e-5)
    assert stored.metadata["model"] == str(tiny_sbert_tokens_dir) and "index_kind" not in stored.metadata
    found = invoke(capfd, "search", out, "--query", _text(9), "-k", "2")
    assert found.code == 0 and json.loads(found.out)["results"][0]["id"] == "doc9", found.err


@pytest.mark.slow  # two failing Ray runs: 85 s on a shared 2-core machine (make test-all)
def test_a_failing_worker_commits_nothing(capfd, collection, tiny_sbert_dir, tmp_path):
    source, out = tmp_path / "bad.jsonl", tmp_path / "docs.lance"
    lines = [json.dumps(r) for r in RECORDS]
    lines[30] = "{not json"  # the second shard's worker fails; the others' fragments are written
    source.write_text("\n".join(lines) + "\n")
    result = _ray_encode(capfd, source, out, tiny_sbert_dir)
    assert result.code == 1 and "bad.jsonl:31: malformed JSON" in result.err
    assert "Traceback" not in result.err
    assert not out.exists() and not list(tmp_path.glob(".*"))  # no table, no staged fragments

    # over an existing collection (--overwrite): the previous one stays, whole, at its version
    previous = _copy(collection, tmp_path / "old")
    before, version = _table(previous), lance.dataset(str(previous / "documents.lance")).version
    result = _ray_encode(capfd, source, previous, tiny_sbert_dir, "--overwrite")
    assert result.code == 1 and "malformed JSON" in result.err
    assert _table(previous).equals(before)
    assert lance.dataset(str(previous / "documents.lance")).version == version


def test_polars_and_duckdb_read_the_table(collection):
    polars = pytest.importorskip("polars")
    frame = polars.from_arrow(_table(collection))
    assert frame.columns == ["id", "vector", "text"] and frame.height == 40
    assert frame["id"].to_list()[:2] == ["doc0", "doc1"] and len(frame["vector"][0]) == 32

    duckdb = pytest.importorskip("duckdb")
    documents = _table(collection)  # noqa: F841  (DuckDB scans the Arrow table by its name)
    rows = duckdb.sql("select id, len(vector) as dim from documents where id = 'doc7'").fetchall()
    assert rows == [("doc7", 32)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--store-text", "-o", "out"), "add --output-format lance"),
        (("--output-format", "npy", "-o", "out"), "Parquet shards only, or a Lance collection"),
    ],
)
def test_lance_usage_errors(capfd, corpus, args, message):
    result = invoke(capfd, "encode", corpus, "--engine", "ray", *args)
    assert result.code == 2 and message in result.err


def test_store_text_needs_the_ray_engine(capfd, corpus, tmp_path):
    result = invoke(capfd, "encode", corpus, "--store-text", "-o", tmp_path / "x.npy")
    assert result.code == 2 and "--store-text needs --engine ray" in result.err


def test_without_pylance_the_lance_output_says_how_to_install(capfd, corpus, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setitem(__import__("sys").modules, "lance", None)  # `import lance` raises ImportError
    result = invoke(capfd, "encode", corpus, "--engine", "ray", "-o", tmp_path / "docs.lance")
    assert result.code == 1 and "pip install pylance" in result.err
    assert not (tmp_path / "docs.lance").exists()
