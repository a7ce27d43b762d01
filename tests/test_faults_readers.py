"""Fault injection on what docembed reads back (issue #34): damaged embeddings files, ids that must
round-trip exactly, damaged or mismatched indexes, caches of another model, and built-in names shadowed by
a folder. Every failure is ONE line `docembed: error: ...` naming the file, never a traceback and never a
wrong answer with exit status 0. The model is the tiny tf-idf of tests/test_faults.py."""

import json

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.errors import DocembedError
from docembed.io.embeddings import load_embeddings, save_embeddings
from docembed.types import EmbeddingSet, MultiVectors
from test_faults import corpus, one_line_error

# Ids that a line-based or fixed-width store would split, strip or shift.
AWKWARD_IDS = [
    "v\x0bt",
    "f\x0cf",
    "u\u2028x",
    "nel\x85",
    "tab\t",
    " padded ",
    "",
    "nul\x00",
    "😀",
    "cr\r",
    "n\nl",
]


@pytest.fixture(scope="module")
def model(tiny_tfidf_dir):
    return tiny_tfidf_dir


def dense_set(ids, dim: int = 4) -> EmbeddingSet:
    rng = np.random.default_rng(len(ids))
    return EmbeddingSet(rng.normal(size=(len(ids), dim)).astype(np.float32), list(ids), {"model": "m"})


# --- damaged embeddings files (class: damaged embeddings) ---------------------------------------------------
def _truncate(path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def damaged_files(tmp_path):
    """(file, words its error names) for each way an embeddings file is found damaged."""
    good = dense_set(["a", "b", "c"])
    cases = []
    npz = tmp_path / "cut.npz"
    save_embeddings(good, str(npz))
    _truncate(npz, 200)
    cases.append((npz, "cut.npz"))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + bytes(64))
    cases.append((garbage, "not a safetensors file"))
    flat = tmp_path / "flat.npy"
    save_embeddings(good, str(flat))
    np.save(flat, np.arange(3, dtype=np.float32))  # 1-D, three "vectors" for three ids
    cases.append((flat, "2-D"))
    listed = tmp_path / "listed.npy"
    save_embeddings(good, str(listed))
    (tmp_path / "listed.meta.json").write_text("[1, 2]")
    cases.append((listed, "metadata is a JSON list"))
    ints = tmp_path / "ints.npy"
    save_embeddings(good, str(ints))
    np.save(ints, np.ones((3, 4), dtype=np.int64))
    cases.append((ints, "float vectors"))
    short = tmp_path / "short.npy"
    save_embeddings(good, str(short))
    (tmp_path / "short.ids.txt").write_text("a\nb\n")
    cases.append((short, "2 ids for 3 embeddings"))
    wide = tmp_path / "wide.npz"  # metadata that disagrees with the vectors
    np.savez(wide, vectors=good.data, ids=np.array(json.dumps(good.ids)), metadata=np.array('{"dim": 7}'))
    cases.append((wide, "dim 7"))
    nan = tmp_path / "nan.npy"  # written by another tool: save_embeddings refuses NaN itself
    save_embeddings(dense_set(["a", "b"]), str(nan))
    vectors = np.load(nan)
    vectors[1, 2] = np.nan
    np.save(nan, vectors)
    cases.append((nan, "NaN"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "vector": [1, 2]}\n{"id": "b", "vector": [1]}\n["no"]\n')
    cases.append((rows, "line 3"))
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "a", "vector": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    cases.append((deep, "nested too deeply"))
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text('{"shards": ["part-00000.parquet"]}')
    cases.append((shards, "manifest.json"))
    return cases


def test_damaged_embeddings_files_are_one_line_errors_naming_the_file(tmp_path):
    for path, words in damaged_files(tmp_path):
        with pytest.raises(DocembedError) as caught:
            load_embeddings(str(path))
        message = str(caught.value)
        assert path.name in message and words in message, (path.name, message)
        assert "\n" not in message


def test_damaged_inputs_of_merge_plot_and_index_build(capfd, tmp_path):
    good = tmp_path / "good.npy"
    save_embeddings(dense_set(["a", "b", "c"]), str(good))
    zero = tmp_path / "zero.npy"
    zero.write_bytes(b"")  # a zero-byte file: numpy raises EOFError, which click turns into "Aborted"
    result = invoke(capfd, "merge", zero, good, "-o", tmp_path / "m.npy")
    assert result.code == 1, result.err  # not 130, not "interrupted"
    assert "zero.npy" in one_line_error(result.err) and "interrupted" not in result.err
    assert not (tmp_path / "m.npy").exists()
    cut = tmp_path / "cut.npz"
    save_embeddings(dense_set(["a", "b", "c"]), str(cut))
    _truncate(cut, 100)
    for args in (
        ("plot", cut, "-l", tmp_path / "labels.txt", "-o", tmp_path / "map.png"),
        ("index", "build", "--store", "faiss", cut, "-o", tmp_path / "idx"),
    ):
        result = invoke(capfd, *args)
        assert result.code == 1 and "cut.npz" in one_line_error(result.err), args


# --- ids round-trip exactly (class: ids) --------------------------------------------------------------------
def test_awkward_ids_round_trip_through_every_format(tmp_path):
    for suffix in ("npz", "safetensors", "parquet", "jsonl"):  # .npz dropped a trailing NUL
        save_embeddings(dense_set(AWKWARD_IDS), str(tmp_path / f"x.{suffix}"))
        assert load_embeddings(str(tmp_path / f"x.{suffix}")).ids == AWKWARD_IDS, suffix
    ids = [i for i in AWKWARD_IDS if not any(c in i for c in "\n\r\x85\u2028")]  # .npy: one id a line
    save_embeddings(dense_set(ids), str(tmp_path / "x.npy"))
    assert load_embeddings(str(tmp_path / "x.npy")).ids == ids


def test_npz_of_older_versions_still_reads(tmp_path):
    # before ids were stored as one JSON array, .npz held one numpy string per id
    path = tmp_path / "old.npz"
    np.savez(path, vectors=np.ones((2, 3), np.float32), ids=np.array(["a", "b"]), metadata=np.array("{}"))
    assert load_embeddings(str(path)).ids == ["a", "b"]


def test_an_index_returns_the_right_document_for_every_awkward_id(capfd, tmp_path):
    emb = dense_set(AWKWARD_IDS, dim=16)
    save_embeddings(emb, str(tmp_path / "x.npz"))
    assert (
        invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "x.npz", "-o", tmp_path / "idx").code
        == 0
    )
    from docembed.faiss_index import VectorIndex

    index = VectorIndex.load(tmp_path / "idx")
    assert index.ids == AWKWARD_IDS
    hits = index.search(emb.data, k=1)
    assert [h[0][0] for h in hits] == AWKWARD_IDS  # each vector finds its own id, none shifted


def test_lone_surrogate_ids_are_refused_when_written_and_kept_by_the_index(tmp_path):
    with pytest.raises(DocembedError, match="lone surrogate"):
        save_embeddings(dense_set(["ok", "bad\ud800"]), str(tmp_path / "x.parquet"))
    assert not (tmp_path / "x.parquet").exists()
    from docembed.faiss_index import VectorIndex

    index = VectorIndex.build(dense_set(["ok", "bad\ud800"]))
    index.save(tmp_path / "idx")
    assert VectorIndex.load(tmp_path / "idx").ids == ["ok", "bad\ud800"]


# --- indexes (class: index reads) ---------------------------------------------------------------------------
@pytest.fixture
def index_dir(capfd, tmp_path):
    save_embeddings(dense_set(["a", "b", "c"], dim=8), str(tmp_path / "x.npy"))
    assert (
        invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "x.npy", "-o", tmp_path / "idx").code
        == 0
    )
    return tmp_path / "idx"


def _search(capfd, index, *extra):
    return invoke(capfd, "search", index, "--query", "w1 w2", "-m", "tfidf", *extra)


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda d: _truncate(d / "index.faiss", 60), "not a faiss index or damaged"),
        (lambda d: (d / "meta.json").write_text("[]"), "not an object"),
        (lambda d: (d / "meta.json").write_text("{"), "meta.json"),
        (lambda d: (d / "ids.json").write_text('["a", "b"]'), "2 ids for 3 documents"),
        (lambda d: (d / "ids.json").write_text('["a", "b", "c", "d"]'), "4 ids for 3 documents"),
        (lambda d: (d / "ids.json").write_text('{"a": 1}'), "JSON array"),
        (lambda d: (d / "ids.json").unlink(), "no ids.json"),
    ],
)
def test_damaged_index_is_one_line_error(capfd, index_dir, damage, words):
    damage(index_dir)
    result = _search(capfd, index_dir)
    assert result.code == 1 and words in one_line_error(result.err), result.err
    assert result.out == ""


def test_index_of_an_older_version_splits_ids_at_newlines_only(tmp_path):
    from docembed.faiss_index import VectorIndex

    index = VectorIndex.build(dense_set(["v\x0bt", "u\u2028x", "c"]))
    index.save(tmp_path / "idx")
    (tmp_path / "idx" / "ids.json").unlink()
    (tmp_path / "idx" / "ids.txt").write_text("v\x0bt\nu\u2028x\nc\n", encoding="utf-8")
    assert VectorIndex.load(tmp_path / "idx").ids == ["v\x0bt", "u\u2028x", "c"]


def test_nan_vectors_are_refused_at_build_and_at_load(capfd, tmp_path):
    from docembed.faiss_index import VectorIndex

    emb = dense_set(["a", "b", "c"])
    emb.data[1, 0] = np.nan
    with pytest.raises(DocembedError, match="row 1 holds NaN"):  # never written either
        save_embeddings(emb, str(tmp_path / "nan.parquet"), format="parquet")
    assert not (tmp_path / "nan.parquet").exists()
    with pytest.raises(DocembedError, match="NaN.*'b'"):
        VectorIndex.build(emb)
    multi = EmbeddingSet(MultiVectors(emb.data, [0, 1, 3]), ["x", "y"], {})
    with pytest.raises(DocembedError, match="NaN.*'y'"):
        VectorIndex.build(multi)
    # an index written with NaN vectors (by an older version): refused on load, not "[]" for every search
    emb.data[1, 0] = 0.0
    index = VectorIndex.build(emb)
    vectors = index.index.reconstruct_n(0, 3)
    vectors[1, 0] = np.nan
    index.index.reset()
    index.index.add(vectors)
    index.save(tmp_path / "idx")
    result = _search(capfd, tmp_path / "idx")
    assert result.code == 1 and "NaN" in one_line_error(result.err) and result.out == ""


def test_search_with_a_query_model_of_another_width(capfd, model, tmp_path):
    src = corpus(tmp_path / "d.jsonl", 6)
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy").code == 0
    assert (
        invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "x.npy", "-o", tmp_path / "idx").code
        == 0
    )
    other = dense_set(["q"], dim=5)
    from docembed.faiss_index import VectorIndex

    with pytest.raises(DocembedError, match="5-d.*-d ones"):
        VectorIndex.load(tmp_path / "idx").search(other.data)
    result = _search(capfd, tmp_path / "idx")  # the built-in tfidf: unfitted, so a usage hint, one line
    assert result.code != 0 and one_line_error(result.err)
    assert invoke(capfd, "search", tmp_path / "idx", "--query", "w1 w2", "-m", model).code == 0


# --- caches (class: caches) ---------------------------------------------------------------------------------
class FakeModel:
    """Enough of an Encoder for the embedding cache: identity from metadata, a width of its own."""

    name, source, fitted_on, max_seq_length, multi_vector = "fake", None, None, None, False

    def __init__(self, dim: int):
        self.dim, self.calls = dim, 0

    def metadata(self):
        return {"model": "fake", "family": "fake", "config_hash": "same"}  # the same identity at any width

    def encode(self, texts, batch_size=32):
        self.calls += 1
        return np.full((len(texts), self.dim), 0.5, dtype=np.float32)


def test_eval_cache_of_another_width_is_rebuilt_with_a_warning(capfd, tmp_path):
    from docembed.encoding import EmbeddingCache

    cache = EmbeddingCache(tmp_path / "cache")
    assert cache.vectors(FakeModel(3), ["a", "b"]).shape == (2, 3)
    wider = FakeModel(5)
    capfd.readouterr()
    assert cache.vectors(wider, ["a", "b"]).shape == (2, 5)  # not the 3-d vectors of the cache
    assert "3-d embeddings, the model makes 5-d" in capfd.readouterr().err
    assert cache.vectors(wider, ["a", "b", "c"]).shape == (3, 5)  # the rebuilt entry is used again
    assert "warning" not in capfd.readouterr().err


def test_a_model_that_declares_no_width_is_checked_on_its_next_vectors(capfd, tmp_path):
    from docembed.encoding import EmbeddingCache

    cache = EmbeddingCache(tmp_path / "cache")
    cache.vectors(FakeModel(3), ["a"])
    capfd.readouterr()
    wide = FakeModel(3)
    wide.dim = None  # no width without encoding: the cache compares the vectors it encodes next
    wide.encode = lambda texts, batch_size=32: np.ones((len(texts), 5), dtype=np.float32)
    assert cache.vectors(wide, ["a", "b"]).shape == (2, 5)
    assert "another width; rebuilding" in capfd.readouterr().err


def test_damaged_eval_cache_is_rebuilt_with_a_warning(capfd, tmp_path):
    from docembed.encoding import EmbeddingCache, model_identity

    cache = EmbeddingCache(tmp_path / "cache")
    fake = FakeModel(3)
    cache.vectors(fake, ["a", "b"])
    vectors = tmp_path / "cache" / model_identity(fake) / "vectors.npy"
    _truncate(vectors, 20)
    capfd.readouterr()
    assert cache.vectors(fake, ["a", "b"]).shape == (2, 3)
    assert "damaged, rebuilding" in capfd.readouterr().err
    assert load_embeddings(str(vectors)).dim == 3


def test_cache_entry_written_for_another_identity_is_not_used(capfd, tmp_path):
    from docembed.encoding import EmbeddingCache, model_identity

    cache = EmbeddingCache(tmp_path / "cache")
    fake = FakeModel(3)
    entry = tmp_path / "cache" / model_identity(fake) / "vectors.npy"
    entry.parent.mkdir(parents=True)
    from docembed.encoding import text_key

    save_embeddings(
        EmbeddingSet(np.zeros((1, 3), np.float32), [text_key("a")], {"model_identity": "x"}), str(entry)
    )
    capfd.readouterr()
    assert cache.vectors(fake, ["a"])[0, 0] == 0.5
    assert "model identity x" in capfd.readouterr().err


# --- names (class: model names) -----------------------------------------------------------------------------
def test_a_folder_named_like_a_built_in_does_not_replace_it(capfd, model, tmp_path, monkeypatch):
    import shutil

    from docembed.models.registry import load_model

    monkeypatch.chdir(tmp_path)
    shutil.copytree(model, tmp_path / "tfidf")  # a fitted tf-idf folder called like the built-in
    capfd.readouterr()
    built_in = load_model("tfidf")
    assert built_in.source is None and getattr(built_in, "requires_fit", False)
    err = capfd.readouterr().err
    assert "'tfidf' is the built-in model" in err and "./tfidf" in err
    folder = load_model("./tfidf")  # written as a path: the folder
    assert folder.source == str((tmp_path / "tfidf").resolve())
    assert "warning" not in capfd.readouterr().err
    assert load_model(str(tmp_path / "tfidf")).source == folder.source


def test_texts_another_process_cached_while_these_were_encoded_are_kept(tmp_path):
    """Two `evaluate` runs of one model at once: each saves its entry after encoding; the second must not
    save over the texts the first added meanwhile."""
    from docembed.encoding import EmbeddingCache, model_identity, text_key

    cache = EmbeddingCache(tmp_path / "cache")
    fake = FakeModel(3)
    other = EmbeddingCache(tmp_path / "cache")
    encode = fake.encode

    def encode_while_another_process_saves(texts, batch_size=32):
        if fake.calls == 0:  # the other run finishes its texts while ours are being encoded
            other.vectors(FakeModel(3), ["theirs", "shared"])
        return encode(texts, batch_size)

    fake.encode = encode_while_another_process_saves
    assert cache.vectors(fake, ["ours", "shared"]).shape == (2, 3)
    entry = load_embeddings(str(tmp_path / "cache" / model_identity(fake) / "vectors.npy"))
    assert sorted(entry.ids) == sorted(text_key(t) for t in ("theirs", "shared", "ours"))
    calls = fake.calls
    assert cache.vectors(fake, ["theirs", "ours", "shared"]).shape == (3, 3) and fake.calls == calls
