"""Lance collections, continued: writers killed during add, update and remove leave one whole version, and
the store `index build` picks by default (Lance for dense sets, faiss where it serves better), beside a
bm25 --lexical-index as faiss is."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import save_embeddings
from docembed.types import EmbeddingSet
from test_lance_index import _dense, _multi, _unit, glove_collection  # noqa: F401 (a module fixture)

pytest.importorskip("lancedb")


# --- a writer killed mid-change ---------------------------------------------------------------------------
KILLED_ADD = """
import sys, time
import numpy as np
from docembed import lance_index
from docembed.types import EmbeddingSet

def slow(schema, embeddings, texts, fields, batches=lance_index._record_batches):
    for number, batch in enumerate(batches(schema, embeddings, texts, fields)):
        yield batch
        if number == 9:  # ten batches handed to LanceDB, then the writer hangs until it is killed
            print("writing", flush=True)
            time.sleep(600)

lance_index._record_batches = slow
lance_index._CHUNK = 64
rng = np.random.default_rng(0)
x = rng.normal(size=(1000, 32)).astype(np.float32)
lance_index.LanceIndex.open(sys.argv[1]).add(EmbeddingSet(x, [f"k{i}" for i in range(1000)]))
"""


def test_a_writer_killed_mid_add_leaves_the_previous_version(capfd, tmp_path):
    from docembed.lance_index import LanceIndex

    rng = np.random.default_rng(9)
    emb = _dense(tmp_path / "e.npy", _unit(rng, 50), [f"d{i}" for i in range(50)])
    index = tmp_path / "l"
    assert invoke(capfd, "index", "build", emb, "-o", index, "--store", "lance").code == 0
    before = LanceIndex.open(index).version
    data = index / "documents.lance" / "data"
    files_before = len(list(data.iterdir()))
    script = tmp_path / "add.py"
    script.write_text(KILLED_ADD)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    with subprocess.Popen([sys.executable, str(script), str(index)], stdout=subprocess.PIPE, env=env) as proc:
        try:
            assert proc.stdout.readline().strip() == b"writing"
            deadline = time.monotonic() + 10
            while len(list(data.iterdir())) == files_before and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(list(data.iterdir())) > files_before  # killed with a data file half written
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    after = LanceIndex.open(index)
    assert after.version == before and len(after) == 50 and not any(i.startswith("k") for i in after.ids())
    # the dead writer's lock is swept: the next writer commits the next version
    more = _dense(tmp_path / "m.npy", _unit(rng, 3), ["n0", "n1", "n2"])
    assert invoke(capfd, "index", "add", index, more).code == 0
    assert LanceIndex.open(index).version == before + 1 and len(LanceIndex.open(index)) == 53


KILLED_CHANGE = """
import sys
import numpy as np
from docembed import lance_index
from docembed.types import EmbeddingSet

index, change, count = lance_index.LanceIndex.open(sys.argv[1]), sys.argv[2], int(sys.argv[3])
print("writing", flush=True)
if change == "update":  # every row's vector replaced by one recognisable vector
    index.update(EmbeddingSet(np.ones((count, 32), np.float32), [f"d{i}" for i in range(count)]))
else:
    index.remove([f"d{i}" for i in range(0, count, 2)])
print("done", flush=True)
"""


@pytest.mark.parametrize("change", ["update", "remove"])
def test_a_writer_killed_mid_update_or_remove_leaves_one_version_or_the_next(capfd, tmp_path, change):
    """Killed at several points of a large update / remove (timed from an uninterrupted run on a copy),
    the collection opens as the previous version or the next, never a mix, and the next writer commits."""
    import shutil

    from docembed.lance_index import LanceIndex

    count = 10_000
    rng = np.random.default_rng(13)
    emb = _dense(tmp_path / "e.npy", _unit(rng, count), [f"d{i}" for i in range(count)])
    index = tmp_path / "l"
    assert invoke(capfd, "-q", "index", "build", emb, "-o", index, "--store", "lance").code == 0
    script = tmp_path / "change.py"
    script.write_text(KILLED_CHANGE)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, str(script), str(index), change, str(count)]

    def run(killed_after: float | None) -> float:
        with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as proc:
            assert proc.stdout.readline().strip() == b"writing"
            started = time.monotonic()
            if killed_after is None:
                assert proc.stdout.readline().strip() == b"done"
            else:
                time.sleep(killed_after)
                proc.send_signal(signal.SIGKILL)
            proc.wait(60)
            return time.monotonic() - started

    pristine = tmp_path / "pristine"
    shutil.copytree(index, pristine)
    took = run(None)  # how long the whole change takes here
    for fraction in (0.3, 0.7):
        shutil.rmtree(index)
        shutil.copytree(pristine, index)
        before = LanceIndex.open(index).version
        run(took * fraction)
        after = LanceIndex.open(index)
        assert after.version in (before, before + 1)
        ones = np.ones(32, np.float32) / np.sqrt(32)
        if change == "update":
            changed = [
                np.allclose(after.stored(f"d{i}"), ones, atol=1e-6) for i in (0, count // 2, count - 1)
            ]
            assert len(after) == count and len(set(changed)) == 1  # all rows replaced, or none
            assert changed[0] == (after.version == before + 1)
        else:
            assert len(after) in (count, count // 2)
            assert ("d0" in after) == ("d2" in after) == (f"d{count - 2}" in after) == (len(after) == count)
            assert (len(after) == count // 2) == (after.version == before + 1)
        more = _dense(tmp_path / "m.npy", _unit(rng, 1), ["n0"])
        assert invoke(capfd, "-q", "index", "add", index, more).code == 0  # the dead writer's lock is swept
        assert "n0" in LanceIndex.open(index)


# --- the default store: Lance for dense sets, faiss where it serves better --------------------------------
def test_the_default_store_is_lance_for_dense_sets_and_faiss_for_multi_vector_ones(capfd, tmp_path):
    from docembed.lance_index import is_lance_dir

    rng = np.random.default_rng(11)
    ids = [f"d{i}" for i in range(12)]
    dense = _dense(tmp_path / "dense.npy", _unit(rng, 12), ids, model="m")
    multi = tmp_path / "multi.npz"
    save_embeddings(EmbeddingSet(_multi(rng, 12), ids, {"model": "m"}), str(multi))
    built = {}
    for name, source, extra in (
        ("dense", dense, []),
        ("multi", multi, []),
        ("int8", dense, ["--storage", "int8"]),  # Lance holds float32 / float16 vectors only
        ("typed", dense, ["--type", "ivf_pq"]),  # a Lance index type
    ):
        assert invoke(capfd, "-q", "index", "build", source, "-o", tmp_path / name, *extra).code == 0
        built[name] = "lance" if is_lance_dir(tmp_path / name) else "faiss"
    assert built == {"dense": "lance", "multi": "faiss", "int8": "faiss", "typed": "lance"}
    # a rebuild keeps the store an index has, whichever it is
    assert invoke(capfd, "-q", "index", "build", "--store", "faiss", dense, "-o", tmp_path / "kept").code == 0
    assert invoke(capfd, "-q", "index", "build", dense, "-o", tmp_path / "kept", "--overwrite").code == 0
    assert (tmp_path / "kept" / "index.faiss").exists() and not is_lance_dir(tmp_path / "kept")
    assert invoke(capfd, "-q", "index", "build", dense, "-o", tmp_path / "dense", "--overwrite").code == 0
    assert is_lance_dir(tmp_path / "dense")


def test_a_bm25_lexical_index_fuses_with_a_lance_index_as_with_faiss(capfd, tmp_path, glove_collection):  # noqa: F811
    folder, corpus, emb = glove_collection
    lance, faiss, bm25 = tmp_path / "l", tmp_path / "f", tmp_path / "b"
    assert invoke(capfd, "-q", "index", "build", emb, "-o", lance).code == 0
    assert invoke(capfd, "-q", "index", "build", "--store", "faiss", emb, "-o", faiss).code == 0
    assert invoke(capfd, "-q", "index", "build", corpus, "--type", "bm25", "-o", bm25).code == 0
    found = {}
    for name, index in (("lance", lance), ("faiss", faiss)):
        result = invoke(
            capfd, "-q", "search", index, "--lexical-index", bm25, "-m", "bm25+glove-avg",
            "--query", "cats running", "--query", "number 7", "-k", "5", "--depth", "10",
        )  # fmt: skip
        assert result.code == 0, result.err
        found[name] = [json.loads(line)["results"] for line in result.out.splitlines()]
    for lance_hits, faiss_hits in zip(found["lance"], found["faiss"], strict=True):
        assert [h["id"] for h in lance_hits] == [h["id"] for h in faiss_hits] and len(lance_hits) == 5
        assert np.allclose([h["score"] for h in lance_hits], [h["score"] for h in faiss_hits], atol=1e-5)
    refused = invoke(
        capfd, "-q", "search", lance, "--lexical-index", bm25, "--query", "x", "--where", "year > 1"
    )
    assert refused.code != 0 and "leave out --hybrid and --where" in refused.err
