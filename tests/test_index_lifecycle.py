"""The index lifecycle (#47): an index remembers what `index add` / `index remove` changed since it was built,
and a rebuild from the embeddings file that would undo that (make's staleness rule alone, no --overwrite) is
refused in one line; --overwrite rebuilds from the file alone, with a warning."""

import json
import os

import numpy as np

from cli_helpers import invoke
from test_collections import _save, _unit


def _one_line_error(result) -> str:
    lines = result.err.strip().splitlines()
    assert result.code == 1 and len(lines) == 1 and lines[0].startswith("docembed: error: "), result.err
    return lines[0]


def _touch(path, seconds=5.0):
    """Make `path` newer than anything written just now (the input changed: make would rebuild)."""
    when = path.stat().st_mtime + seconds
    os.utime(path, (when, when))


def _ids(index):
    from docembed.faiss_index import VectorIndex

    return VectorIndex.load(index).ids


def _twenty_and_five(tmp_path):
    """An index built from 20 documents (e.npy), and 5 more (more.npy, ids n0..n4) added with `index add`."""
    x = _unit(np.random.default_rng(47), 25)
    emb = _save(tmp_path / "e.npy", x[:20], [f"d{i}" for i in range(20)])
    more = _save(tmp_path / "more.npy", x[20:], [f"n{i}" for i in range(5)])
    return x, emb, more


def test_a_stale_rebuild_that_would_drop_added_documents_is_refused(capfd, tmp_path):
    x, emb, more = _twenty_and_five(tmp_path)
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    assert invoke(capfd, "index", "add", index, more).code == 0
    assert len(_ids(index)) == 25
    _touch(emb)  # the input is newer: make's rule would rebuild, and drop n0..n4 without a word
    message = _one_line_error(invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index))
    assert "5 document(s) added with `index add`" in message and "(first: 'n0')" in message
    assert "would drop them" in message and "--overwrite" in message and str(emb) in message
    assert len(_ids(index)) == 25  # nothing written
    # encoded into the embeddings file, they are kept: the rebuild goes ahead and starts a fresh record
    full = _save(tmp_path / "e.npy", x, [f"d{i}" for i in range(20)] + [f"n{i}" for i in range(5)])
    _touch(full, 20)
    assert invoke(capfd, "index", "build", "--store", "faiss", full, "-o", index).code == 0
    assert len(_ids(index)) == 25 and not (index / "changes.json").exists()


def test_overwrite_rebuilds_from_the_file_alone_with_a_warning(capfd, tmp_path):
    _, emb, more = _twenty_and_five(tmp_path)
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    assert invoke(capfd, "index", "add", index, more, "--compact").code == 0
    assert json.loads((index / "changes.json").read_text())["added"] == [f"n{i}" for i in range(5)]
    result = invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index, "--overwrite")
    assert result.code == 0 and "warning:" in result.err and "5 document(s) added" in result.err
    assert _ids(index) == [f"d{i}" for i in range(20)]
    _touch(emb)
    assert (
        invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    )  # nothing to undo any more


def test_a_rebuild_that_would_bring_back_removed_documents_is_refused(capfd, tmp_path):
    _, emb, more = _twenty_and_five(tmp_path)
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    (tmp_path / "gone.txt").write_text("d3\nd7\n")
    assert invoke(capfd, "index", "remove", index, "--ids", tmp_path / "gone.txt").code == 0
    _touch(emb)
    message = _one_line_error(invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index))
    assert "2 document(s) removed with `index remove`" in message and "(first: 'd3')" in message
    assert "bring them back" in message
    # added and removed: one line for both
    assert invoke(capfd, "index", "add", index, more).code == 0
    _touch(emb, 10)
    message = _one_line_error(invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index))
    assert "5 document(s) added" in message and "2 document(s) removed" in message and "undo both" in message
    assert len(_ids(index)) == 23


def test_a_bm25_rebuild_over_a_changed_vector_index_is_refused_too(capfd, tmp_path):
    _, emb, more = _twenty_and_five(tmp_path)
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    assert invoke(capfd, "index", "add", index, more).code == 0
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"word{i} x"}) + "\n" for i in range(20)))
    _touch(corpus)
    assert "5 document(s) added" in _one_line_error(
        invoke(capfd, "index", "build", corpus, "--type", "bm25", "-o", index)
    )


def test_a_build_into_the_other_store_is_refused_without_overwrite(capfd, tmp_path):
    """Each store checks only its own kind of index for added documents: a --store that names the other
    store would replace the index, added documents and all."""
    from docembed.lance_index import open_index

    _, emb, more = _twenty_and_five(tmp_path)
    for held, other in (("faiss", "lance"), ("lance", "faiss")):
        index = tmp_path / f"{held}-index"
        assert invoke(capfd, "index", "build", "--store", held, emb, "-o", index).code == 0
        assert invoke(capfd, "index", "add", index, more).code == 0
        _touch(emb)
        result = invoke(capfd, "index", "build", "--store", other, emb, "-o", index)
        lines = result.err.strip().splitlines()
        assert result.code != 0 and len(lines) == 1 and f"is a {held} index" in lines[0], result.err
        assert "--overwrite" in lines[0]
        ids = _ids(index) if held == "faiss" else open_index(index).ids()
        assert len(ids) == 25  # nothing replaced
        result = invoke(capfd, "index", "build", "--store", other, emb, "-o", index, "--overwrite")
        assert result.code == 0, result.err


def test_changes_are_recorded_in_memory_and_survive_save_and_load(tmp_path):
    from docembed.faiss_index import IndexChanges, VectorIndex, changes_since_build
    from docembed.types import EmbeddingSet

    x = _unit(np.random.default_rng(1), 6)
    index = VectorIndex.build(EmbeddingSet(x[:4], ["a", "b", "c", "d"]))
    assert not index.changes
    index.add(EmbeddingSet(x[4:], ["e", "f"]))
    index.remove(["b", "e"])  # e: added, then gone; b: built, then gone
    assert index.changes == IndexChanges(added=["f"], removed=["b", "e"])
    index.add(EmbeddingSet(x[1:2], ["b"]))  # back again: added, no longer removed
    assert index.changes == IndexChanges(added=["f", "b"], removed=["e"])
    assert index.changes.undone_by(["a", "b", "c", "d", "e"]) == (["f"], ["e"])
    index.save(tmp_path / "i")
    assert VectorIndex.load(tmp_path / "i").changes == index.changes
    assert changes_since_build(tmp_path / "i") == index.changes
    # a segment's ids count as added without loading the vectors
    VectorIndex.append_saved(tmp_path / "i", EmbeddingSet(x[:1] * 0.5, ["g"]), compact_share=0.9)
    assert changes_since_build(tmp_path / "i").added == ["f", "b", "g"]


def test_remove_saved_that_removes_nothing_writes_nothing(tmp_path):
    from docembed.faiss_index import VectorIndex, index_stamp
    from docembed.types import EmbeddingSet

    x = _unit(np.random.default_rng(2), 5)
    VectorIndex.build(EmbeddingSet(x, list("abcde"))).save(tmp_path / "i")
    before = index_stamp(tmp_path / "i")
    assert VectorIndex.remove_saved(tmp_path / "i", ["zz"]) == (0, 5)
    assert index_stamp(tmp_path / "i") == before
    assert VectorIndex.remove_saved(tmp_path / "i", ["a", "zz"]) == (1, 4)
    assert index_stamp(tmp_path / "i") != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i"]  # no staging folder or lock left
