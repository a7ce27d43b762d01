"""`index add` as an appended segment (#32): the cost of the new vectors, not a rewrite of the index; the
loaded index equals the same add in memory; compaction past a tenth; a failed append changes nothing."""

import json

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings, save_embeddings
from docembed.types import EmbeddingSet
from test_collections import _ids, _save, _unit


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_add_appends_a_segment_and_searches_as_an_add_in_memory(capfd, tmp_path, kind):
    from docembed.faiss_index import VectorIndex

    rng = np.random.default_rng(4)
    x = _unit(rng, 1030)
    base = _save(tmp_path / "base.npy", x[:1000], [f"d{i}" for i in range(1000)])
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", base, "-o", index, "-t", kind).code == 0
    written = (index / "index.faiss").read_bytes()
    for start in (1000, 1015):  # two appends of 1.5 % each: two segments, index.faiss never rewritten
        more = _save(
            tmp_path / f"m{start}.npy", x[start : start + 15], [f"d{i}" for i in range(start, start + 15)]
        )
        result = invoke(capfd, "index", "add", index, more)
        assert result.code == 0 and "appended as a segment" in result.err, result.err
    assert (index / "index.faiss").read_bytes() == written
    meta = json.loads((index / "meta.json").read_text())
    assert meta["segments"] == ["0001", "0002"] and meta["count"] == 1030
    # the loaded index equals the base with the same vectors added in memory, in the same order
    eager = VectorIndex.load(tmp_path / "index")
    reference = VectorIndex.build(load_embeddings(str(base)), kind)
    for start in (1000, 1015):
        reference.add(load_embeddings(str(tmp_path / f"m{start}.npy")))
    queries = x[[3, 1007, 1029]]
    assert eager.ids == reference.ids
    assert eager.search(queries, 10) == reference.search(queries, 10)
    hits = _ids(invoke(capfd, "search", index, "--id", "d1029", "-k", "3"))[0]
    assert hits == [hit for hit, _ in reference.more_like(["d1029"], 3)[0]]
    # an id already in a segment is refused, and nothing is written
    dup = _save(tmp_path / "dup.npy", x[:1], ["d1020"])
    refused = invoke(capfd, "index", "add", index, dup)
    assert refused.code == 1 and "'d1020' is already in the index" in refused.err
    assert json.loads((index / "meta.json").read_text())["segments"] == ["0001", "0002"]
    # removing compacts: one file again, the segments gone
    (tmp_path / "gone.txt").write_text("d1001\n")
    assert invoke(capfd, "index", "remove", index, "--ids", tmp_path / "gone.txt").code == 0
    assert not (index / "added").exists() and "segments" not in json.loads((index / "meta.json").read_text())
    assert len(VectorIndex.load(index).ids) == 1029


def test_index_add_compacts_past_a_tenth_and_on_request(capfd, tmp_path):
    import faiss

    rng = np.random.default_rng(5)
    x = _unit(rng, 260)
    _save(tmp_path / "base.npy", x[:200], [f"d{i}" for i in range(200)])
    index = tmp_path / "index"
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "base.npy", "-o", index)
    for n, start in enumerate(range(200, 260, 10)):  # 10 each: segments until they pass 10 % of the whole
        _save(tmp_path / f"m{n}.npy", x[start : start + 10], [f"d{i}" for i in range(start, start + 10)])
        result = invoke(capfd, "index", "add", index, tmp_path / f"m{n}.npy")
        assert result.code == 0, result.err
        segments = json.loads((index / "meta.json").read_text()).get("segments", [])
        assert ("rewritten as one file" in result.err) == (not segments)
        assert len(segments) * 10 <= 0.1 * (210 + 10 * n)  # never more than a tenth waits in segments
    assert faiss.read_index(str(index / "index.faiss")).ntotal + 10 * len(segments) == 260
    _save(tmp_path / "last.npy", x[:1], ["last"])
    assert (
        "rewritten as one file"
        in invoke(capfd, "index", "add", index, tmp_path / "last.npy", "--compact").err
    )
    assert faiss.read_index(str(index / "index.faiss")).ntotal == 261 and not (index / "added").exists()


def test_a_failed_append_leaves_the_index_as_it_was(capfd, tmp_path, monkeypatch):
    from docembed import faiss_index
    from docembed.faiss_index import VectorIndex

    rng = np.random.default_rng(6)
    x = _unit(rng, 102)
    _save(tmp_path / "base.npy", x[:100], [f"d{i}" for i in range(100)])
    index = tmp_path / "index"
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "base.npy", "-o", index)
    meta = (index / "meta.json").read_bytes()
    more = load_embeddings(str(_save(tmp_path / "m.npy", x[100:101], ["new"])))

    def disk_full(directory, ids):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(faiss_index, "write_ids", disk_full)
        with pytest.raises(OSError):
            VectorIndex.append_saved(index, more)
    assert (index / "meta.json").read_bytes() == meta and len(VectorIndex.load(index).ids) == 100
    assert not VectorIndex.append_saved(index, more)  # the orphan folder is replaced by the real segment
    assert VectorIndex.load(index).ids[-1] == "new"
    # a segment that meta.json names but that is gone: a one-line error naming it
    import shutil

    shutil.rmtree(index / "added" / "0001")
    damaged = invoke(capfd, "search", index, "--id", "d0")
    assert damaged.code == 1 and "0001 is a damaged segment" in damaged.err


def test_multi_vector_segment_searches_as_a_rebuild(capfd, tmp_path):
    from docembed.types import MultiVectors

    rng = np.random.default_rng(7)
    sets = [_unit(rng, int(n), 8) for n in rng.integers(1, 5, size=41)]
    ids = [f"m{i}" for i in range(41)]
    for name, part in (("a", slice(0, 40)), ("b", slice(40, 41)), ("all", slice(0, 41))):
        data = EmbeddingSet(MultiVectors.from_list(sets[part]), ids[part], {"model": "m"})
        save_embeddings(data, str(tmp_path / f"{name}.npz"))
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "a.npz", "-o", tmp_path / "grown")
    assert (
        "appended as a segment" in invoke(capfd, "index", "add", tmp_path / "grown", tmp_path / "b.npz").err
    )
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "all.npz", "-o", tmp_path / "whole")
    for doc in ("m40", "m3"):
        grown = invoke(capfd, "search", tmp_path / "grown", "--id", doc, "-k", "6").out
        assert grown and grown == invoke(capfd, "search", tmp_path / "whole", "--id", doc, "-k", "6").out
