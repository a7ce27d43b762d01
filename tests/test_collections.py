"""Collections and IR conventions (#32): TREC runs from search/rerank scored by `evaluate --qrels --run`
(ir_measures) against hand-computed values; `index add` / `index remove`; `search --id`, `--text-from`;
`encode --reuse`."""

import json

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings, save_embeddings
from docembed.types import EmbeddingSet

# --- TREC runs and evaluate --qrels ------------------------------------------------------------------------
QRELS = "q1 0 d1 1\nq1 0 d3 2\nq1 0 d5 0\nq2 0 d2 1\nq3 0 d9 1\n"
RUN = (
    "q1 Q0 d2 1 0.9 t\nq1 Q0 d1 2 0.8 t\nq1 Q0 d3 3 0.7 t\n"  # relevant at ranks 2 (rel 1) and 3 (rel 2)
    "q2 Q0 d2 1 0.5 t\nq2 Q0 d4 2 0.4 t\n"  # relevant at rank 1; q3 has no results: scores 0
)
# By hand: q1 AP = (1/2 + 2/3) / 2, RR = 1/2, nDCG@10 (trec_eval: gain = grade) = (1/log2 3 + 2/2) /
# (2 + 1/log2 3); q2: all 1; q3: all 0. Means over the 3 judged queries.
Q1_NDCG = (1 / np.log2(3) + 1) / (2 + 1 / np.log2(3))
EXPECTED = {
    "AP": (7 / 12 + 1 + 0) / 3,
    "RR": (1 / 2 + 1 + 0) / 3,
    "nDCG@10": (Q1_NDCG + 1 + 0) / 3,
    "R@1": (0 + 1 + 0) / 3,
    "R@2": (1 / 2 + 1 + 0) / 3,
}


def test_evaluate_qrels_run_matches_hand_computed_and_ir_measures(capfd, tmp_path):
    import ir_measures

    qrels, run = tmp_path / "qrels.txt", tmp_path / "run.txt"
    qrels.write_text(QRELS)
    run.write_text(RUN)
    args = [a for name in EXPECTED for a in ("--measure", name)]
    result = invoke(capfd, "evaluate", "--qrels", qrels, "--run", run, *args)
    assert result.code == 0, result.err
    got = json.loads(result.out)["measures"]
    for name, value in EXPECTED.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name
    reference = ir_measures.calc_aggregate(
        [ir_measures.parse_measure(n) for n in EXPECTED],
        list(ir_measures.read_trec_qrels(str(qrels))),
        list(ir_measures.read_trec_run(str(run))),
    )
    assert {str(m): v for m, v in reference.items()} == pytest.approx(got)
    # the defaults: MAP, nDCG@10, MRR, recall@10/100
    default = json.loads(invoke(capfd, "evaluate", "--qrels", qrels, "--run", run).out)["measures"]
    assert set(default) == {"AP", "nDCG@10", "RR", "R@10", "R@100"}
    assert default["AP"] == pytest.approx(EXPECTED["AP"])
    assert invoke(capfd, "evaluate", "--qrels", qrels).code == 2  # --run missing


def _save(path, vectors, ids, model="m"):
    save_embeddings(
        EmbeddingSet(np.asarray(vectors, dtype=np.float32), list(ids), {"model": model}), str(path)
    )
    return path


def test_search_writes_trec_runs_that_evaluate_reads(capfd, tmp_path):
    emb = _save(tmp_path / "e.npy", [[1, 0], [0.8, 0.6], [0, 1]], ["a", "b", "c"])
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    result = invoke(
        capfd, "search", index, "--id", "a", "-k", "2", "--output-format", "trec", "--run-tag", "x"
    )
    assert result.code == 0, result.err
    assert result.out == "a Q0 b 1 0.8 x\na Q0 c 2 0.0 x\n"
    (tmp_path / "run.txt").write_text(result.out)
    jsonl = invoke(capfd, "search", index, "--id", "a", "-k", "2").out
    (tmp_path / "run.jsonl").write_text(jsonl)
    (tmp_path / "qrels.txt").write_text("a 0 c 1\n")
    for run in ("run.txt", "run.jsonl"):  # a TREC file or search's own JSONL
        out = invoke(capfd, "evaluate", "--qrels", tmp_path / "qrels.txt", "--run", tmp_path / run).out
        assert json.loads(out)["measures"]["RR"] == pytest.approx(0.5)
        assert json.loads(out)["measures"]["AP"] == pytest.approx(0.5)
    # an id with a space cannot go in a TREC run: one line, no traceback
    spaced = _save(tmp_path / "s.npz", [[1, 0], [0, 1]], ["x y", "z"])
    assert invoke(capfd, "index", "build", "--store", "faiss", spaced, "-o", tmp_path / "i2").code == 0
    bad = invoke(capfd, "search", tmp_path / "i2", "--id", "z", "--output-format", "trec")
    assert bad.code == 1 and "whitespace" in bad.err and "Traceback" not in bad.err


def test_rerank_writes_trec_runs(capfd, tmp_path, tiny_tfidf_dir):
    docs = tmp_path / "docs.jsonl"
    texts = {"q": "w1 w2 w3", "same": "w1 w2 w3", "half": "w1 w9 w20", "none": "w40 w41 w42"}
    docs.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in texts.items()))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"source": "q", "candidates": ["none", "half", "same"]}) + "\n")
    result = invoke(capfd, "rerank", tasks, "--docs", docs, "-m", tiny_tfidf_dir, "--output-format", "trec")
    assert result.code == 0, result.err
    lines = [line.split() for line in result.out.splitlines()]
    assert [(f[0], f[1], f[2], f[3], f[5]) for f in lines] == [
        ("q", "Q0", "same", "1", "docembed"),
        ("q", "Q0", "half", "2", "docembed"),
        ("q", "Q0", "none", "3", "docembed"),
    ]
    scores = [float(f[4]) for f in lines]
    assert scores[0] == pytest.approx(1.0, abs=1e-5) and scores[0] > scores[1] > scores[2]
    text_rows = tmp_path / "text.jsonl"
    text_rows.write_text(json.dumps({"query": "w1", "candidates": ["w1", "w2"]}) + "\n")
    refused = invoke(capfd, "rerank", text_rows, "-m", tiny_tfidf_dir, "--output-format", "trec")
    assert refused.code == 2 and "id rows" in refused.err


# --- index add / remove, search --id / --text-from ---------------------------------------------------------
def _unit(rng, n, dim=16):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _ids(result):
    return [[hit["id"] for hit in json.loads(line)["results"]] for line in result.out.splitlines()]


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_add_appends_without_retraining_and_refuses_duplicates(capfd, tmp_path, kind):
    import faiss

    rng = np.random.default_rng(0)
    x = _unit(rng, 600)
    a = _save(tmp_path / "a.npy", x[:500], [f"d{i}" for i in range(500)])
    b = _save(tmp_path / "b.npy", x[500:], [f"d{i}" for i in range(500, 600)])
    index = tmp_path / "index"
    assert invoke(capfd, "index", "build", "--store", "faiss", a, "-o", index, "-t", kind).code == 0
    before = faiss.read_index(str(index / "index.faiss"))
    result = invoke(capfd, "index", "add", index, b)
    assert result.code == 0 and "added 100 documents" in result.err, result.err
    after = faiss.read_index(str(index / "index.faiss"))
    assert after.ntotal == 600 and json.loads((index / "meta.json").read_text())["count"] == 600
    if kind == "ivf":  # the trained centroids are kept: no retraining
        centroids = faiss.downcast_index(before.quantizer).reconstruct_n(0, before.nlist)
        kept = faiss.downcast_index(after.quantizer).reconstruct_n(0, after.nlist)
        assert np.array_equal(centroids, kept)
    # a new document finds itself first (exact for flat), and old ones stay searchable
    hits = _ids(invoke(capfd, "search", index, "--id", "d550", "-k", "5"))[0]
    if kind == "flat":
        assert hits[0] == f"d{int(np.argsort(-(x[:600] @ x[550]))[1])}"
    assert "d550" not in hits and len(hits) == 5
    # duplicates (already indexed, or repeated in the file) are refused in one line; the index is untouched
    stamp = (index / "index.faiss").read_bytes()
    dup = _save(tmp_path / "dup.npy", x[:2], ["new", "d3"])
    refused = invoke(capfd, "index", "add", index, dup)
    assert refused.code == 1 and "'d3' is already in the index" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    twice = _save(tmp_path / "twice.npy", x[:2], ["n", "n"])
    assert "repeated" in invoke(capfd, "index", "add", index, twice).err
    assert (index / "index.faiss").read_bytes() == stamp
    other = _save(tmp_path / "o.npy", x[:1], ["z"], model="another")
    assert "another model" in invoke(capfd, "index", "add", index, other).err


def test_flat_index_add_equals_a_rebuild(capfd, tmp_path):
    rng = np.random.default_rng(1)
    x = _unit(rng, 300)
    ids = [f"d{i}" for i in range(300)]
    _save(tmp_path / "a.npy", x[:290], ids[:290])
    _save(tmp_path / "b.npy", x[290:], ids[290:])
    _save(tmp_path / "all.npy", x, ids)
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "a.npy", "-o", tmp_path / "grown")
    invoke(capfd, "index", "add", tmp_path / "grown", tmp_path / "b.npy")
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "all.npy", "-o", tmp_path / "whole")
    ask = [a for i in (0, 150, 295) for a in ("--id", ids[i])]
    grown = invoke(capfd, "search", tmp_path / "grown", *ask, "-k", "7").out
    assert grown and grown == invoke(capfd, "search", tmp_path / "whole", *ask, "-k", "7").out


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_remove(capfd, tmp_path, kind):
    rng = np.random.default_rng(2)
    x = _unit(rng, 400)
    emb = _save(tmp_path / "e.npy", x, [f"d{i}" for i in range(400)])
    index = tmp_path / "index"
    invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index, "-t", kind)
    nearest = _ids(invoke(capfd, "search", index, "--id", "d0", "-k", "3"))[0]
    gone = tmp_path / "gone.txt"
    gone.write_text(f"{nearest[0]}\nnot-there\n")
    result = invoke(capfd, "index", "remove", index, "--ids", gone)
    assert result.code == 0 and "removed 1 documents" in result.err and "1 id(s) not in" in result.err
    assert len(json.loads((index / "ids.json").read_text())) == 399
    after = _ids(invoke(capfd, "search", index, "--id", "d0", "-k", "3"))[0]
    assert nearest[0] not in after and after[:2] == nearest[1:]
    assert invoke(capfd, "search", index, "--id", nearest[0]).code == 1  # not in the index any more
    # and ids can come back: add after remove
    back = _save(tmp_path / "back.npy", x[:1], [nearest[0]])
    assert invoke(capfd, "index", "add", index, back).code == 0


def test_multi_vector_index_add_and_remove(capfd, tmp_path):
    from docembed.types import MultiVectors

    rng = np.random.default_rng(3)
    sets = [_unit(rng, n, 8) for n in (2, 3, 1, 4, 2)]
    whole = MultiVectors.from_list(sets)
    ids = [f"m{i}" for i in range(5)]
    save_embeddings(
        EmbeddingSet(MultiVectors.from_list(sets[:3]), ids[:3], {"model": "m"}), str(tmp_path / "a.npz")
    )
    save_embeddings(
        EmbeddingSet(MultiVectors.from_list(sets[3:]), ids[3:], {"model": "m"}), str(tmp_path / "b.npz")
    )
    save_embeddings(EmbeddingSet(whole, ids, {"model": "m"}), str(tmp_path / "all.npz"))
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "a.npz", "-o", tmp_path / "grown")
    assert invoke(capfd, "index", "add", tmp_path / "grown", tmp_path / "b.npz").code == 0
    invoke(capfd, "index", "build", "--store", "faiss", tmp_path / "all.npz", "-o", tmp_path / "whole")
    grown = invoke(capfd, "search", tmp_path / "grown", "--id", "m4", "-k", "4").out
    assert grown == invoke(capfd, "search", tmp_path / "whole", "--id", "m4", "-k", "4").out
    (tmp_path / "gone.txt").write_text("m1\n")
    assert invoke(capfd, "index", "remove", tmp_path / "grown", "--ids", tmp_path / "gone.txt").code == 0
    hits = _ids(invoke(capfd, "search", tmp_path / "grown", "--id", "m4", "-k", "4"))[0]
    assert sorted(hits) == ["m0", "m2", "m3"]


def test_search_more_like_this_with_texts(capfd, tmp_path):
    emb = _save(tmp_path / "e.npy", [[1, 0], [0.8, 0.6], [0, 1]], ["a", "b", "c"])
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"doc": i, "body": t}) + "\n" for i, t in [("a", "A"), ("b", "Bee"), ("z", "-")])
    )
    index = tmp_path / "index"
    invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index)
    result = invoke(
        capfd, "search", index, "--id", "b", "--id", "a", "-k", "2", "--text-from", corpus,
        "--id-field", "doc", "--text-field", "body",
    )  # fmt: skip
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert [r["query_id"] for r in rows] == ["b", "a"]
    close = lambda score: pytest.approx(score, abs=1e-5)  # noqa: E731 (computed scores: a tolerance)
    assert rows[0]["results"] == [
        {"id": "a", "score": close(0.8), "text": "A"},
        {"id": "c", "score": close(0.6), "text": None},  # not in the corpus: null, with a warning
    ]
    assert [h["id"] for h in rows[1]["results"]] == ["b", "c"]  # never itself
    assert "not in" in result.err
    missing = invoke(capfd, "search", index, "--id", "nope")
    assert missing.code == 1 and "'nope' is not in the index" in missing.err


# --- encode --reuse -----------------------------------------------------------------------------------------
def _corpus(path, rows):
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    return path


V1 = [("a", "w1 w2 w3"), ("b", "w4 w5"), ("c", "w6 w7 w8"), ("d", "w9"), ("e", "")]
V2 = [("e", ""), ("a", "w1 w2 w3"), ("c", "w6 w7 w8 w10"), ("new", "w11 w12"), ("b", "w4 w5")]  # d gone


def test_encode_reuse_encodes_only_changed_texts_and_writes_a_full_encodes_bytes(
    capfd, tmp_path, tiny_tfidf_dir
):
    v1, v2 = _corpus(tmp_path / "v1.jsonl", V1), _corpus(tmp_path / "v2.jsonl", V2)
    assert invoke(capfd, "encode", v1, "-m", tiny_tfidf_dir, "-o", tmp_path / "old.npy").code == 0
    assert invoke(capfd, "encode", v2, "-m", tiny_tfidf_dir, "-o", tmp_path / "full.npy").code == 0
    result = invoke(
        capfd, "encode", v2, "-m", tiny_tfidf_dir, "--reuse", tmp_path / "old.npy", "-o", tmp_path / "r.npy"
    )
    assert result.code == 0, result.err
    assert "encoded 2 new or changed of 5 documents" in result.err  # c (changed) and new
    for suffix in ("npy", "ids.txt", "meta.json"):
        assert (tmp_path / f"r.{suffix}").read_bytes() == (tmp_path / f"full.{suffix}").read_bytes(), suffix
    # the unchanged rows really are copied from the old output, not encoded again
    old = np.load(tmp_path / "old.npy")
    old[0] = 7.0  # row of "a"
    np.save(tmp_path / "old.npy", old)
    again = invoke(
        capfd,
        "encode",
        v2,
        "-m",
        tiny_tfidf_dir,
        "--reuse",
        tmp_path / "old.npy",
        "-o",
        tmp_path / "r.npy",
        "--overwrite",
    )
    assert again.code == 0 and np.all(load_embeddings(str(tmp_path / "r.npy")).data[1] == 7.0)
    # the old output may be the output itself
    inplace = invoke(
        capfd,
        "encode",
        v2,
        "-m",
        tiny_tfidf_dir,
        "--reuse",
        tmp_path / "full.npy",
        "-o",
        tmp_path / "full.npy",
        "--overwrite",
    )
    assert inplace.code == 0 and "encoded 0 new or changed" in inplace.err


def test_encode_reuse_refuses_another_model_and_sets_without_hashes(capfd, tmp_path, tiny_tfidf_dir):
    from docembed.models.baselines import TfidfConfig, TfidfEncoder

    other = tmp_path / "other"
    TfidfEncoder(TfidfConfig(), name="tiny").fit([f"w{i} w{i + 1}" for i in range(0, 64, 2)]).save(other)
    v1 = _corpus(tmp_path / "v1.jsonl", V1)
    invoke(capfd, "encode", v1, "-m", tiny_tfidf_dir, "-o", tmp_path / "old.npz")
    refused = invoke(
        capfd, "encode", v1, "-m", other, "--reuse", tmp_path / "old.npz", "-o", tmp_path / "x.npz"
    )
    assert refused.code == 1 and "another model" in refused.err and not (tmp_path / "x.npz").exists()
    bare = tmp_path / "bare.npz"
    meta = load_embeddings(str(tmp_path / "old.npz")).metadata
    save_embeddings(
        EmbeddingSet(np.ones((5, 3), np.float32), list("abcde"), dict(meta, text_hashes=None)), str(bare)
    )
    no_hashes = invoke(capfd, "encode", v1, "-m", tiny_tfidf_dir, "--reuse", bare, "-o", tmp_path / "y.npz")
    assert no_hashes.code == 1 and "no text hashes" in no_hashes.err


def test_encode_reuse_multi_vector(capfd, tmp_path, tiny_sbert_tokens_dir):
    texts = [("a", "the cat sat"), ("b", "a dog ran far away"), ("c", "birds")]
    v1 = _corpus(tmp_path / "v1.jsonl", texts)
    v2 = _corpus(tmp_path / "v2.jsonl", [texts[2], ("b", "a dog ran"), texts[0]])
    model = tiny_sbert_tokens_dir
    invoke(capfd, "encode", v1, "-m", model, "-o", tmp_path / "old.npz")
    invoke(capfd, "encode", v2, "-m", model, "-o", tmp_path / "full.npz")
    result = invoke(
        capfd, "encode", v2, "-m", model, "--reuse", tmp_path / "old.npz", "-o", tmp_path / "r.npz"
    )
    assert result.code == 0 and "encoded 1 new or changed of 3" in result.err, result.err
    full, reused = load_embeddings(str(tmp_path / "full.npz")), load_embeddings(str(tmp_path / "r.npz"))
    assert reused.ids == full.ids == ["c", "b", "a"] and reused.metadata == full.metadata
    assert np.array_equal(reused.data.offsets, full.data.offsets)
    np.testing.assert_allclose(reused.data.vectors, full.data.vectors, atol=1e-6)
    if full.data.positions is not None:
        assert np.array_equal(reused.data.positions, full.data.positions)


# --- BM25 as a first stage ----------------------------------------------------------------------------------
def test_bm25_index_search_matches_the_bm25_scorer(capfd, tmp_path):
    from docembed.models.baselines import BM25Config, BM25Scorer

    rows = [
        ("cats", "the cat sat on the mat with another cat"),
        ("dogs", "a dog in the park"),
        ("both", "cat and dog"),
        ("none", "interest rates rose"),
        ("long", "a cat " + "word " * 40),
    ]
    corpus = _corpus(tmp_path / "docs.jsonl", rows)
    index = tmp_path / "bm25.index"
    built = invoke(capfd, "index", "build", corpus, "--type", "bm25", "-o", index)
    assert built.code == 0 and "bm25" in built.err, built.err
    result = invoke(capfd, "search", index, "--query", "cat", "--query", "dog park", "-k", "3")
    assert result.code == 0, result.err
    got = [json.loads(line)["results"] for line in result.out.splitlines()]
    scorer = BM25Scorer(BM25Config()).fit([t for _, t in rows])
    for query, hits in zip(["cat", "dog park"], got, strict=True):
        scores = scorer.score(query, [t for _, t in rows])
        order = [i for i in np.argsort(-scores, kind="stable") if scores[i] > 0][:3]
        assert [h["id"] for h in hits] == [rows[i][0] for i in order]
        assert [h["score"] for h in hits] == pytest.approx([float(scores[i]) for i in order], rel=1e-5)
    assert [h["id"] for h in got[0]] == ["cats", "both", "long"]  # two "cat"s; then the short over the long
    assert "none" not in {h["id"] for hits in got for h in hits}  # no shared term: not a hit
    trec = invoke(capfd, "search", index, "--query", "dog park", "--output-format", "trec", "-k", "1").out
    assert trec.startswith("0 Q0 dogs 1 ")
    refused = invoke(capfd, "index", "add", index, tmp_path / "docs.jsonl")
    assert refused.code == 1 and "bm25 index" in refused.err


def test_merged_shards_keep_their_text_hashes_so_reuse_works(capfd, tmp_path, tiny_tfidf_dir):
    v1, v2 = _corpus(tmp_path / "v1.jsonl", V1), _corpus(tmp_path / "v2.jsonl", V2)
    for i in (1, 0):  # out of order: merge orders them
        shard = ("--shard", f"{i}/2")
        assert (
            invoke(capfd, "encode", v1, "-m", tiny_tfidf_dir, *shard, "-o", tmp_path / f"p{i}.npy").code == 0
        )
    merged = invoke(capfd, "merge", tmp_path / "p1.npy", tmp_path / "p0.npy", "-o", tmp_path / "old.npy")
    assert merged.code == 0, merged.err
    assert invoke(capfd, "encode", v1, "-m", tiny_tfidf_dir, "-o", tmp_path / "whole.npy").code == 0
    whole = load_embeddings(str(tmp_path / "whole.npy")).metadata["text_hashes"]
    assert load_embeddings(str(tmp_path / "old.npy")).metadata["text_hashes"] == whole
    result = invoke(
        capfd, "encode", v2, "-m", tiny_tfidf_dir, "--reuse", tmp_path / "old.npy", "-o", tmp_path / "r.npy"
    )
    assert result.code == 0 and "encoded 2 new or changed of 5 documents" in result.err, result.err


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
@pytest.mark.parametrize("storage", ["float16", "int8"])
def test_smaller_index_storage_ranks_as_float32_does_in_fewer_bytes(capfd, tmp_path, kind, storage):
    from docembed.faiss_index import VectorIndex
    from docembed.types import MultiVectors

    rng = np.random.default_rng(5)
    sets = [_unit(rng, int(n), 32) for n in rng.integers(3, 9, size=120)]
    ids = [f"d{i}" for i in range(len(sets))]
    save_embeddings(EmbeddingSet(MultiVectors.from_list(sets), ids, {"model": "m"}), str(tmp_path / "e.npz"))
    for name in ("float32", storage):
        built = invoke(
            capfd,
            "index",
            "build",
            "--store",
            "faiss",
            tmp_path / "e.npz",
            "-o",
            tmp_path / name,
            "-t",
            kind,
            "--storage",
            name,
        )
        assert built.code == 0, built.err
    small, full = VectorIndex.load(tmp_path / storage), VectorIndex.load(tmp_path / "float32")
    assert small.metadata["storage"] == storage
    size = {n: sum(f.stat().st_size for f in (tmp_path / n).iterdir()) for n in ("float32", storage)}
    assert size[storage] < size["float32"]
    if kind != "hnsw":  # an HNSW graph's links (32 per node) outweigh 32-d vectors
        assert size[storage] < (0.65 if storage == "float16" else 0.45) * size["float32"]
    queries = MultiVectors.from_list(sets[:20])
    same = [
        a[0][0] == b[0][0] for a, b in zip(small.search(queries, 3), full.search(queries, 3), strict=True)
    ]
    assert sum(same) >= 19  # each document finds itself first in both (rounding may swap a near tie)
    refused = invoke(
        capfd, "index", "build", tmp_path / "e.npz", "-o", tmp_path / "b", "-t", "bm25", "--storage", storage
    )
    assert refused.code != 0 and "--storage is for faiss indexes" in refused.err


@pytest.mark.parametrize("storage", ["float32", "int8"])
def test_multi_vector_index_keeps_its_vectors_once_and_scores_the_same_saved(tmp_path, storage):
    from docembed.faiss_index import VectorIndex
    from docembed.types import MultiVectors

    rng = np.random.default_rng(9)
    sets = [_unit(rng, int(n), 16) for n in rng.integers(2, 6, size=30)]
    emb = EmbeddingSet(MultiVectors.from_list(sets), [f"d{i}" for i in range(30)], {"model": "m"})
    built = VectorIndex.build(emb, "flat", storage)
    queries = MultiVectors.from_list(sets[:5])
    before = built.search(queries, 5)
    built.save(tmp_path / "i")
    assert sorted(p.name for p in (tmp_path / "i").iterdir()) == [
        "ids.json",
        "index.faiss",
        "meta.json",
        "offsets.npy",
    ]
    assert VectorIndex.load(tmp_path / "i").search(queries, 5) == before  # MaxSim reads what faiss holds
    np.save(tmp_path / "i" / "vectors.npy", built.multi.vectors)  # an index saved before 2026-11-25
    assert VectorIndex.load(tmp_path / "i").search(queries, 5) == before
