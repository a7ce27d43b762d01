"""Fault injection, round five (issue #49): the index cases of the probe on the store `index build` now
writes by default for dense sets, a Lance collection: nothing written inside it by another command, no user
file inside it deleted by a rebuild (both held already: the output rules are the store's), and no table
name read from its marker followed (LanceDB refused a path in the name; any name but `documents` is
refused now). A huge document's output spilled to disk: tests/test_spill.py."""

import json
import os
import shutil

import pytest

from cli_helpers import invoke
from test_faults import corpus, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)

pytest.importorskip("lancedb")


@pytest.fixture
def collection(capfd, model, tmp_path):  # noqa: F811
    """A default (Lance) index of four documents, with its embeddings and corpus."""
    from docembed.lance_index import is_lance_dir

    docs = corpus(tmp_path / "docs.jsonl", 4)
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", tmp_path / "e.npy").code == 0
    assert invoke(capfd, "-q", "index", "build", tmp_path / "e.npy", "-o", tmp_path / "docs.index").code == 0
    assert is_lance_dir(tmp_path / "docs.index")
    return tmp_path / "docs.index"


def _newer(path):
    when = path.stat().st_mtime + 5
    os.utime(path, (when, when))


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["docembed.json", "documents.lance/_versions/x.manifest", "new.jsonl"])
def test_search_never_writes_inside_the_collection_it_reads(capfd, collection, name):
    queries = collection.parent / "q.txt"
    queries.write_text("w1 w2\n")
    _newer(queries)
    before = _snapshot(collection)
    for extra in ([], ["--overwrite"]):
        result = invoke(
            capfd, "-q", "search", collection, "--queries", queries, "-o", collection / name, *extra
        )
        assert result.code == 1 and "inside the input" in one_line_error(result.err)
    assert _snapshot(collection) == before


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_a_rebuild_keeps_or_refuses_a_user_file_inside_the_collection(capfd, collection, extra):
    (collection / "notes.txt").write_text("mine\n")
    _newer(collection.parent / "e.npy")  # stale: make's rule alone would rebuild
    result = invoke(capfd, "-q", "index", "build", collection.parent / "e.npy", "-o", collection, *extra)
    assert result.code == 1 and "notes.txt" in one_line_error(result.err)
    assert (collection / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("table", ["../other/documents", "other", "/tmp/documents"])
def test_a_table_name_in_the_marker_is_never_followed(capfd, collection, table):
    other = collection.parent / "other"
    shutil.copytree(collection, other)  # a readable table elsewhere, which the marker points at
    marker = json.loads((collection / "docembed.json").read_text())
    marker["table"] = table
    (collection / "docembed.json").write_text(json.dumps(marker))
    result = invoke(capfd, "-q", "search", collection, "--id", "d0", "-k", "1")
    assert result.code == 1 and "names the table" in one_line_error(result.err)
    assert not result.out
