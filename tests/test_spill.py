"""One document's output larger than memory should hold (issue #49: NUGGET's vectors of a 50 MB text are
1.6 GB): past a size, tensors.GrowingRows spills the rows to a temporary file, the result is that file
mapped read-only, and the finite check and the writers go through it a block at a time, releasing its
pages, so the process never holds the whole output. The values and the files written are those of the
in-memory path."""

import json
import subprocess
import sys
import textwrap
from functools import partial

import numpy as np
import pytest

from docembed.io.embeddings import load_embeddings, save_embeddings, stored_arrays
from docembed.tensors import GrowingRows, mapped_file
from docembed.types import EmbeddingSet, MultiVectors


def _grown(batches, spill_bytes=None):
    rows = GrowingRows(batches[0].shape[1], np.float32, expected=4, spill_bytes=spill_bytes)
    for batch in batches:
        rows.extend(batch)
    return rows.result()


def test_spilled_rows_are_the_rows_in_memory_mapped_read_only():
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(int(n), 6)).astype(np.float32) for n in rng.integers(0, 40, size=30)]
    in_memory, spilled = _grown(batches), _grown(batches, spill_bytes=200)
    assert mapped_file(in_memory) is None and mapped_file(spilled) is not None
    assert not spilled.flags.writeable
    assert np.array_equal(np.asarray(spilled), in_memory)
    assert np.array_equal(in_memory, np.concatenate(batches))


@pytest.mark.parametrize("storage", ["float32", "float16", "int8"])
def test_a_mapped_set_is_written_as_the_same_files(tmp_path, storage):
    rng = np.random.default_rng(1)
    batches = [rng.normal(size=(70_000, 3)).astype(np.float32), rng.normal(size=(9, 3)).astype(np.float32)]
    offsets = [0, 5, 70_009]
    sets = {
        "memory": MultiVectors(_grown(batches), offsets, np.arange(70_009)),
        "mapped": MultiVectors(_grown(batches, spill_bytes=1024), offsets, np.arange(70_009)),
    }
    assert mapped_file(sets["mapped"].vectors) is not None
    written = {}
    for name, data in sets.items():
        path = tmp_path / f"{name}.npy"
        save_embeddings(EmbeddingSet(data, ["a", "b"], {"model": "m"}), str(path), storage=storage)
        written[name] = path.read_bytes()
        back = load_embeddings(str(path))
        assert np.array_equal(back.data.offsets, offsets) and back.ids == ["a", "b"]
    assert written["memory"] == written["mapped"]
    # np.save's bytes, with the one-pass conversion's values
    expected = stored_arrays(np.concatenate(batches), storage)["vectors"]
    reference = tmp_path / "reference.npy"
    np.save(reference, expected)
    assert written["memory"] == reference.read_bytes()


def test_int8_storage_converted_in_blocks_equals_one_pass():
    vectors = np.random.default_rng(2).normal(size=(140_000, 4)).astype(np.float32)
    vectors[7] = 0.0
    scales = np.abs(vectors).max(axis=1, initial=0.0) / 127.0
    safe = np.where(scales > 0, scales, 1.0)[:, None]
    stored = stored_arrays(vectors, "int8")
    assert np.array_equal(stored["vectors"], np.clip(np.rint(vectors / safe), -127, 127).astype(np.int8))
    assert np.array_equal(stored["scales"], scales.astype(np.float32))


def test_nugget_spills_a_long_text_to_the_same_vectors(monkeypatch, minilm_tokenizer):
    from docembed import tensors
    from tiny_models import tiny_nugget

    nugget = tiny_nugget(minilm_tokenizer, long_documents="windows")
    nugget.model.eval()
    text = " ".join(["The committee met on Tuesday to review the budget, e.g. for pumps."] * 120)
    monkeypatch.setattr(tensors, "STREAM_CHARS", 2_000)  # streamed, in memory and then spilled
    monkeypatch.setattr(tensors, "BLOCK_CHARS", 700)
    encode = partial(nugget.encode, [text], batch_size=4)
    in_memory = encode()
    monkeypatch.setattr(GrowingRows, "SPILL_BYTES", 4096)
    spilled = encode()
    assert mapped_file(in_memory.vectors) is None and mapped_file(spilled.vectors) is not None
    assert len(spilled.vectors) * spilled.dim * 4 > 4096
    assert np.array_equal(in_memory.offsets, spilled.offsets)
    assert np.array_equal(in_memory.positions, spilled.positions)
    assert np.array_equal(in_memory.vectors, spilled.vectors)  # normalized as made: unit rows, same values
    assert np.allclose(np.linalg.norm(spilled.vectors, axis=1), 1.0, atol=1e-5)


MEASURE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from docembed.cli.encode import refuse_non_finite
    from docembed.io.embeddings import save_embeddings
    from docembed.tensors import GrowingRows
    from docembed.types import EmbeddingSet, MultiVectors

    def peak_mb():  # this process's own high-water mark (ru_maxrss carries the parent's across exec)
        status = open("/proc/self/status").read()
        return int(status.split("VmHWM:")[1].split()[0]) / 1024

    spill_bytes, out = int(sys.argv[1]), sys.argv[2]
    batch = np.random.default_rng(0).normal(size=(8192, 384)).astype(np.float32)  # 12.6 MB a batch
    before = peak_mb()
    rows = GrowingRows(384, np.float32, expected=8192, spill_bytes=spill_bytes)
    for _ in range(24):  # 302 MB of output
        rows.extend(batch)
    vectors = rows.result()
    emb = EmbeddingSet(MultiVectors(vectors, [0, len(vectors)]), ["doc"], {"model": "m"})
    refuse_non_finite(emb, "m")
    save_embeddings(emb, out)
    grown = peak_mb() - before
    print(json.dumps({"grown_mb": grown, "rows": len(vectors)}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_spilled_output_is_never_resident_as_a_whole(tmp_path):
    """A 302 MB output through GrowingRows, the finite check and the .npy writer: held in memory it raises
    the peak by its size; spilled (64 MB), by little more than the spill size and a block."""
    grown = {}
    for name, spill in (("memory", 1 << 40), ("spilled", 64 << 20)):
        out = tmp_path / f"{name}.npy"
        result = subprocess.run(
            [sys.executable, "-c", MEASURE, str(spill), str(out)], capture_output=True, text=True, check=True
        )
        grown[name] = json.loads(result.stdout)["grown_mb"]
        assert out.stat().st_size > 300e6
    assert grown["memory"] > 280, grown
    assert grown["spilled"] < 170, grown
