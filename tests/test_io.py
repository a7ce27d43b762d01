"""Readers (formats, streaming, shards, bad input) and every embeddings container's round trip."""

import gzip
import json

import numpy as np
import pytest

from docembed.errors import DocembedError, InputFormatError, UsageError
from docembed.io.embeddings import OUTPUT_FORMATS, check_output_path, load_embeddings, save_embeddings
from docembed.io.readers import DocumentReader, Shard, count_lines
from docembed.types import EmbeddingSet, MultiVectors


def write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def test_jsonl_fields_generated_ids_and_empty_texts(tmp_path):
    src = write(tmp_path / "d.jsonl", '{"doc":"a","body":"x"}\n{"body":""}\n{"doc":7,"body":"z"}\n')
    docs = list(DocumentReader(src, id_field="doc", text_field="body"))
    assert [(d.id, d.text) for d in docs] == [("a", "x"), ("1", ""), ("7", "z")]


def test_txt_and_tsv_and_gzip(tmp_path):
    assert [d.text for d in DocumentReader(write(tmp_path / "a.txt", "one\n\nthree"))] == ["one", "", "three"]
    tsv = DocumentReader(write(tmp_path / "a.tsv", "L0\thello world\nL1\t\n"))
    assert [(d.id, d.text) for d in tsv] == [("L0", "hello world"), ("L1", "")]
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"id":"g","text":"zipped"}\n'))
    assert list(DocumentReader(str(gz)))[0].text == "zipped"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"id":1,"text":"ok"}\n{"id":2,"text":\n', "malformed JSON"),
        (b'{"id":1,"text":"ok"}\n{"id":2,"body":"x"}\n', "'text' missing"),
        (b'{"id":1,"text":"ok"}\n{"id":2,"text":"caf\xe9"}\n', "invalid UTF-8"),
        (b'{"id":1,"text":"ok"}\n[1,2]\n', "a JSON array, not one object per line"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, content, reason):
    src = write(tmp_path / "bad.jsonl", content)
    with pytest.raises(InputFormatError) as info:
        list(DocumentReader(src))
    assert info.value.line_number == 2 and reason in str(info.value) and "bad.jsonl:2" in str(info.value)
    reader = DocumentReader(src, skip_invalid=True)
    assert [d.text for d in reader] == ["ok"] and reader.skipped == 1


def test_stdin_needs_format_and_unknown_suffix(tmp_path):
    with pytest.raises(UsageError):
        DocumentReader("-")
    with pytest.raises(UsageError):
        DocumentReader(write(tmp_path / "x.csv", "a"))
    with pytest.raises(DocembedError, match="not found"):
        list(DocumentReader(str(tmp_path / "missing.jsonl")))


def test_shards_are_contiguous_and_cover_the_input(tmp_path):
    src = write(tmp_path / "n.txt", "".join(f"doc {i}\n" for i in range(10)))
    assert count_lines(src) == 10
    parts = [[d.id for d in DocumentReader(src, shard=Shard(i, 3))] for i in range(3)]
    assert sum(parts, []) == [str(i) for i in range(10)]
    assert [len(p) for p in parts] == [3, 3, 4]
    with pytest.raises(UsageError):
        Shard.parse("3/3")


def test_reader_streams_without_reading_ahead(tmp_path):
    # a generator-backed reader hands out the first document before touching a malformed last line
    src = write(tmp_path / "s.jsonl", '{"text":"first"}\n' * 3 + "{broken\n")
    it = iter(DocumentReader(src))
    assert next(it).text == "first"


def multi_set():
    rng = np.random.default_rng(0)
    counts = [3, 1, 0, 2]
    data = MultiVectors.from_list(
        [rng.standard_normal((c, 4)).astype(np.float32) for c in counts],
        [np.arange(c) * 2 for c in counts],
    )
    return EmbeddingSet(data, ["a", "b", "empty", "d"], {"model": "m", "normalized": False})


def dense_set():
    rng = np.random.default_rng(1)
    return EmbeddingSet(rng.standard_normal((3, 5)).astype(np.float32), ["x", "y", "z"], {"model": "m"})


@pytest.mark.parametrize("fmt", OUTPUT_FORMATS)
@pytest.mark.parametrize("make", [dense_set, multi_set])
def test_round_trip_every_container(tmp_path, fmt, make):
    original = make()
    path = str(tmp_path / f"emb.{fmt}")
    save_embeddings(original, path)
    loaded = load_embeddings(path)
    assert loaded.ids == original.ids
    assert loaded.metadata["model"] == "m" and loaded.metadata["dim"] == original.dim
    if original.is_multi:
        assert loaded.is_multi
        np.testing.assert_array_equal(loaded.data.offsets, original.data.offsets)
        np.testing.assert_allclose(loaded.data.vectors, original.data.vectors, rtol=1e-6)
        np.testing.assert_array_equal(loaded.data.positions, original.data.positions)
    else:
        np.testing.assert_allclose(loaded.data, original.data, rtol=1e-6)


@pytest.mark.parametrize("fmt", ["npy", "npz", "safetensors"])
@pytest.mark.parametrize("make", [dense_set, multi_set])
@pytest.mark.parametrize(("storage", "tolerance"), [("float16", 1e-3), ("int8", 4e-3)])
def test_smaller_storage_reads_back_as_float32_within_its_rounding(tmp_path, fmt, make, storage, tolerance):
    original = make()
    path = str(tmp_path / f"small.{fmt}")
    save_embeddings(original, path, storage=storage)
    loaded = load_embeddings(path)
    vectors = loaded.data.vectors if original.is_multi else loaded.data
    reference = original.data.vectors if original.is_multi else original.data
    assert vectors.dtype == np.float32 and loaded.metadata["storage"] == storage
    scale = np.abs(reference).max(axis=1, keepdims=True, initial=0.0)  # errors relative to each vector
    assert (np.abs(vectors - reference) <= tolerance * np.maximum(scale, 1e-12)).all()
    if original.is_multi:
        np.testing.assert_array_equal(loaded.data.offsets, original.data.offsets)


@pytest.mark.parametrize("fmt", ["npy", "npz", "safetensors"])
def test_smaller_storage_takes_half_and_a_quarter_of_the_bytes(tmp_path, fmt):
    vectors = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    emb = EmbeddingSet(MultiVectors(vectors, np.array([0, 100, 300])), ["a", "b"])
    sizes = {}
    for storage in ("float32", "float16", "int8"):
        folder = tmp_path / storage
        folder.mkdir()
        save_embeddings(emb, str(folder / f"e.{fmt}"), storage=storage)
        sizes[storage] = sum(f.stat().st_size for f in folder.iterdir())
    assert sizes["float16"] / sizes["float32"] < 0.55
    assert sizes["int8"] / sizes["float32"] < 0.3


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_smaller_storage_is_refused_by_text_and_parquet_outputs(tmp_path, fmt):
    with pytest.raises(UsageError, match="--storage int8 is for npy, npz and safetensors"):
        save_embeddings(dense_set(), str(tmp_path / f"e.{fmt}"), storage="int8")
    with pytest.raises(UsageError, match="unknown storage"):
        save_embeddings(dense_set(), str(tmp_path / "e.npz"), storage="int4")


def test_int8_storage_is_idempotent_and_keeps_zero_vectors(tmp_path):
    data = np.array([[0.0, 0.0, 0.0], [0.5, -1.0, 0.25]], dtype=np.float32)
    path = str(tmp_path / "e.npz")
    save_embeddings(EmbeddingSet(data, ["zero", "v"]), path, storage="int8")
    once = load_embeddings(path).data
    assert np.array_equal(once[0], [0, 0, 0]) and once[1][1] == pytest.approx(-1.0)
    save_embeddings(EmbeddingSet(once, ["zero", "v"]), path, storage="int8")  # re-stored: the same values
    assert np.array_equal(load_embeddings(path).data, once)


def test_parquet_is_readable_by_other_tools(tmp_path):
    import pyarrow.parquet as pq

    save_embeddings(dense_set(), str(tmp_path / "e.parquet"))
    table = pq.read_table(tmp_path / "e.parquet")
    assert table.column_names == ["id", "vector"]
    assert json.loads(table.schema.metadata[b"docembed"])["kind"] == "dense"


def test_output_checks(tmp_path):
    with pytest.raises(DocembedError, match="folder does not exist"):
        check_output_path(str(tmp_path / "nope" / "e.npy"), overwrite=False)
    (tmp_path / "e.npy").write_bytes(b"keep")
    with pytest.raises(DocembedError, match="--overwrite"):
        check_output_path(str(tmp_path / "e.npy"), overwrite=False)
    check_output_path(str(tmp_path / "e.npy"), overwrite=True)


def test_atomic_write_leaves_nothing_on_failure(tmp_path, monkeypatch):
    import docembed.io.embeddings as emb_io

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(emb_io.np, "savez", boom)
    target = tmp_path / "e.npz"
    with pytest.raises(KeyboardInterrupt):
        save_embeddings(dense_set(), str(target))
    assert list(tmp_path.iterdir()) == []


def write_parquet(path, texts, ids=None, row_group_size=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"text": pa.array(texts, type=pa.string())}
    if ids is not None:
        columns["id"] = pa.array(ids)
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return str(path)


def test_parquet_input_file_and_directory(tmp_path):
    src = write_parquet(tmp_path / "a.parquet", ["x", "", "z"], ["a", None, "c"])
    docs = list(DocumentReader(src))
    assert [(d.id, d.text) for d in docs] == [("a", "x"), ("1", ""), ("c", "z")]
    # a directory: files in path order, rows numbered across files, bookkeeping files skipped
    folder = tmp_path / "dir"
    folder.mkdir()
    write_parquet(folder / "part-1.parquet", ["c", "d"])
    write_parquet(folder / "part-0.parquet", ["a", "b"])
    (folder / "_SUCCESS").write_text("")
    reader = DocumentReader(str(folder))
    assert reader.format == "parquet" and len(reader) == 4
    assert [(d.id, d.text) for d in reader] == [("0", "a"), ("1", "b"), ("2", "c"), ("3", "d")]


def test_parquet_shards_and_ranges_read_only_their_rows(tmp_path):
    texts = [f"doc {i}" for i in range(10)]
    src = write_parquet(tmp_path / "n.parquet", texts, row_group_size=3)
    parts = [[d.text for d in DocumentReader(src, shard=Shard(i, 3))] for i in range(3)]
    assert sum(parts, []) == texts and [len(p) for p in parts] == [3, 3, 4]
    documents, skipped = DocumentReader(src).read_range(4, 8)
    assert [d.id for d in documents] == ["4", "5", "6", "7"] and skipped == 0


def test_parquet_null_text_is_an_error_or_skipped(tmp_path):
    src = write_parquet(tmp_path / "n.parquet", ["a", None, "c"])
    with pytest.raises(InputFormatError, match="n.parquet:2"):
        list(DocumentReader(src))
    reader = DocumentReader(src, skip_invalid=True)
    assert [d.id for d in reader] == ["0", "2"] and reader.skipped == 1
    with pytest.raises(DocembedError, match="no text column 'body'"):
        list(DocumentReader(src, text_field="body"))


def test_text_range_reads_from_a_byte_offset(tmp_path):
    from docembed.io.readers import line_offsets

    src = write(tmp_path / "r.txt", "".join(f"line {i}\n" for i in range(7)))
    rows, offsets = line_offsets(src, 3)
    assert rows == 7 and len(offsets) == 3
    documents, _ = DocumentReader(src).read_range(3, 6, offsets[1])
    assert [(d.id, d.text) for d in documents] == [("3", "line 3"), ("4", "line 4"), ("5", "line 5")]


def test_a_set_with_non_finite_vectors_is_never_written(tmp_path):
    """`load_embeddings` refuses NaN or infinite vectors: `save_embeddings` does not write a file it would."""
    vectors = np.ones((3, 4), np.float32)
    vectors[1, 2] = np.nan
    for name in ("e.npz", "e.jsonl"):
        with pytest.raises(DocembedError, match="row 1 holds NaN"):
            save_embeddings(EmbeddingSet(vectors, ["a", "b", "c"], {}), str(tmp_path / name))
        assert not (tmp_path / name).exists()
