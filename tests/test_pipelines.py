"""Pipelines that make trusts (issue #32): one staleness rule for every output (files and folders: replaced
without --overwrite when any input is newer), `-o` with atomic writes for search and similarity, shard
provenance that `merge` orders and checks by, built-in models recorded by name, and the Makefile of
docs/pipelines.md run end to end."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import DOCEMBED, invoke
from docembed.io.embeddings import load_embeddings

WORDS = [f"w{i}" for i in range(64)]
PIPELINES = Path(__file__).resolve().parents[1] / "docs" / "pipelines.md"


@pytest.fixture(scope="module")
def model(tiny_tfidf_dir):
    return tiny_tfidf_dir


def corpus(path: Path, n: int, prefix: str = "d") -> Path:
    rows = [
        {"id": f"{prefix}{i}", "text": " ".join(WORDS[(i * 7 + k) % 64] for k in range(6))} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("docembed: error: "), err
    return lines[0]


def age(path: Path, seconds: float) -> None:
    """Set `path`'s mtime `seconds` into the past (negative: the future), as if made then."""
    when = path.stat().st_mtime - seconds
    os.utime(path, (when, when))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or ".lock" in p.name)


# --- one staleness rule: make's -----------------------------------------------------------------------------
def test_file_output_is_replaced_when_any_input_is_newer(capfd, model, tmp_path):
    docs = corpus(tmp_path / "docs.jsonl", 4)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"source": "d0", "candidates": ["d1", "d2", "d3"]}) + "\n")
    out = tmp_path / "ranked.jsonl"
    args = ("rerank", tasks, "--docs", docs, "-m", model, "-o", out)
    assert invoke(capfd, *args).code == 0
    result = invoke(capfd, *args)  # newer than both inputs: kept
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    age(out, 10)
    age(tasks, 20)  # only the documents changed since: the tasks are older than the output
    assert invoke(capfd, *args).code == 0
    assert out.stat().st_mtime > docs.stat().st_mtime


def test_index_folder_is_replaced_when_its_embeddings_are_newer(capfd, model, tmp_path, monkeypatch):
    docs = corpus(tmp_path / "docs.jsonl", 5)
    emb, index = tmp_path / "docs.npy", tmp_path / "docs.index"
    assert invoke(capfd, "encode", docs, "-m", model, "-o", emb).code == 0
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    result = invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index)
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    corpus(docs, 7)
    age(docs, -5)
    assert invoke(capfd, "encode", docs, "-m", model, "-o", emb).code == 0  # a stale file, no --overwrite
    assert (
        invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    )  # a stale folder, no --overwrite
    assert json.loads((index / "ids.json").read_text()) == [f"d{i}" for i in range(7)]
    assert leftovers(tmp_path) == []
    # the data-safety rules stand: a stale folder docembed did not write, the working directory and a
    # folder holding an input are never replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    age(mine, 100)
    result = invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", mine)
    assert result.code == 1 and "not a docembed index" in one_line_error(result.err)
    assert (mine / "notes.txt").read_text() == "keep me"
    age(index, 100)
    shutil.copy(emb, index / "inner.npy")
    shutil.copy(tmp_path / "docs.ids.txt", index / "inner.ids.txt")
    age(index, 100)
    result = invoke(capfd, "index", "build", "--store", "faiss", index / "inner.npy", "-o", index)
    assert result.code == 1 and "holds the input" in one_line_error(result.err)
    monkeypatch.chdir(mine)
    age(mine, 100)
    result = invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", ".")
    assert result.code == 1 and "working directory" in one_line_error(result.err)


def test_encode_fit_refits_its_model_folder_when_the_input_is_newer(capfd, tmp_path):
    docs = corpus(tmp_path / "docs.jsonl", 6)
    out = tmp_path / "docs.npy"
    args = ("encode", docs, "-m", "tfidf", "--fit", "-o", out)
    assert invoke(capfd, *args).code == 0
    result = invoke(capfd, *args)
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    corpus(docs, 8)
    age(docs, -5)
    assert invoke(capfd, *args).code == 0
    assert len(load_embeddings(str(out))) == 8 and (tmp_path / "docs.model" / "config.json").is_file()
    fitted = tmp_path / "fitted"  # `docembed fit` outputs follow the same rule
    age(docs, 60)
    assert invoke(capfd, "fit", "tfidf", docs, "-o", fitted).code == 0
    result = invoke(capfd, "fit", "tfidf", docs, "-o", fitted)
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    age(fitted, 100)  # older than the corpus now
    assert invoke(capfd, "fit", "tfidf", docs, "-o", fitted).code == 0


# --- search and similarity -o -------------------------------------------------------------------------------
def test_search_output_is_written_all_or_nothing(capfd, model, tmp_path):
    docs = corpus(tmp_path / "docs.jsonl", 5)
    emb, index, out = tmp_path / "docs.npy", tmp_path / "docs.index", tmp_path / "hits.jsonl"
    assert invoke(capfd, "encode", docs, "-m", model, "-o", emb).code == 0
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"id": "q1", "text": "w1 w8"}\n{"id": "q2", "text": "w3"}\n')
    result = invoke(capfd, "search", index, "--queries", queries, "-m", model, "-k", "2", "-o", out)
    assert result.code == 0 and result.out == ""
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["query_id"] for r in rows] == ["q1", "q2"] and len(rows[0]["results"]) == 2
    before = out.read_text()
    result = invoke(capfd, "search", index, "--queries", queries, "-m", model, "-o", out)
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q1", "text": "w1"}\n{"id": "q2", "text": \n')
    failed = tmp_path / "failed.jsonl"
    result = invoke(capfd, "search", index, "--queries", bad, "-m", model, "-o", failed)
    assert result.code == 1 and not failed.exists()  # no 0-byte target that make takes for up to date
    result = invoke(capfd, "search", index, "--queries", bad, "-m", model, "-o", out, "--overwrite")
    assert result.code == 1 and out.read_text() == before
    assert leftovers(tmp_path) == []


def test_similarity_output_is_written_all_or_nothing(capfd, model, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"text1": "w1 w2", "text2": "w1 w2"}\n{"text1": "w1", "text2": "w9"}\n')
    out = tmp_path / "scores.jsonl"
    result = invoke(capfd, "similarity", "--pairs", pairs, "-m", model, "-o", out)
    assert result.code == 0 and result.out == ""
    scores = [json.loads(line)["score"] for line in out.read_text().splitlines()]
    assert scores[0] == pytest.approx(1.0, abs=1e-5) and scores[1] < 1
    age(out, 10)  # the pairs changed since: a stale output is replaced
    assert invoke(capfd, "similarity", "--pairs", pairs, "-m", model, "-o", out).code == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text1": "w1", "text2": "w2"}\n{"text1": "w1"}\n')
    failed = tmp_path / "failed.jsonl"
    result = invoke(capfd, "similarity", "--pairs", bad, "-m", model, "-o", failed)
    assert result.code == 1 and not failed.exists()
    two = tmp_path / "two.txt"
    assert invoke(capfd, "similarity", "w1 w2", "w1 w2", "-m", model, "-o", two).code == 0
    assert float(two.read_text()) == pytest.approx(1.0, abs=1e-5)
    assert leftovers(tmp_path) == []


# --- shard provenance and merge -----------------------------------------------------------------------------
def encode_shards(capfd, model, src: Path, folder: Path, n: int, which=None, name="part") -> list[Path]:
    parts = []
    for i in which if which is not None else range(n):
        part = folder / f"{name}{i}.npy"
        assert invoke(capfd, "encode", src, "-m", model, "--shard", f"{i}/{n}", "-o", part).code == 0
        parts.append(part)
    return parts


def test_shards_record_their_provenance(capfd, model, tmp_path):
    src = corpus(tmp_path / "docs.jsonl", 10)
    (part,) = encode_shards(capfd, model, src, tmp_path, 4, which=[2])
    shard = load_embeddings(str(part)).metadata["shard"]
    info = src.stat()
    assert shard == {
        "index": 2,
        "count": 4,
        "input": str(src.resolve()),
        "input_size": info.st_size,
        "input_mtime_ns": info.st_mtime_ns,
        "rows": 10,
        "start": 5,
        "stop": 7,
    }


def test_merge_orders_shards_by_provenance_not_by_the_shell(capfd, model, tmp_path):
    src = corpus(tmp_path / "docs.jsonl", 23)
    encode_shards(capfd, model, src, tmp_path, 11)
    globbed = sorted(tmp_path.glob("part*.npy"))  # part0 part1 part10 part2 ...: the shell's order
    assert [p.name for p in globbed[:3]] == ["part0.npy", "part1.npy", "part10.npy"]
    merged, whole = tmp_path / "merged.npz", tmp_path / "whole.npy"
    assert invoke(capfd, "merge", *globbed, "-o", merged).code == 0
    assert invoke(capfd, "encode", src, "-m", model, "-o", whole).code == 0
    a, b = load_embeddings(str(merged)), load_embeddings(str(whole))
    assert a.ids == b.ids == [f"d{i}" for i in range(23)] and np.array_equal(a.data, b.data)
    assert "shard" not in a.metadata


def test_merge_refuses_gaps_overlaps_and_parts_of_other_inputs(capfd, model, tmp_path):
    src = corpus(tmp_path / "docs.jsonl", 9)
    p0, p1, p2, p3 = encode_shards(capfd, model, src, tmp_path, 4)
    out = tmp_path / "whole.npy"

    def refused(*parts) -> str:
        result = invoke(capfd, "merge", *parts, "-o", out)
        assert result.code == 1 and not out.exists()
        return one_line_error(result.err)

    assert "missing shard(s) 2/4" in refused(p0, p1, p3)
    assert "given twice" in refused(p0, p1, p1, p2, p3)
    (q0,) = encode_shards(capfd, model, src, tmp_path, 3, which=[0], name="three")
    assert "different --shard N" in refused(p0, p1, p2, p3, q0)
    other = corpus(tmp_path / "other.jsonl", 9)
    (o2,) = encode_shards(capfd, model, other, tmp_path, 4, which=[2], name="other")
    assert "different inputs" in refused(p0, p1, o2, p3)
    plain = tmp_path / "plain.npy"
    assert invoke(capfd, "encode", other, "-m", model, "-o", plain).code == 0
    assert "records no shard" in refused(p0, p1, p2, p3, plain)
    corpus(src, 9, prefix="e")  # the input changed after the first shards were written
    age(src, -5)
    (n3,) = encode_shards(capfd, model, src, tmp_path, 4, which=[3], name="new")
    assert "different versions" in refused(p0, p1, p2, n3)
    assert invoke(capfd, "merge", p3, p1, p0, p2, "-o", out).code == 0
    assert load_embeddings(str(out)).ids == [f"d{i}" for i in range(9)]
    # files without provenance are joined in the order given, as before
    joined = tmp_path / "joined.npy"
    assert invoke(capfd, "merge", plain, whole_of(capfd, model, src, tmp_path), "-o", joined).code == 0
    assert load_embeddings(str(joined)).ids == [f"d{i}" for i in range(9)] + [f"e{i}" for i in range(9)]


def whole_of(capfd, model, src: Path, folder: Path) -> Path:
    out = folder / f"{src.stem}.whole.npy"
    assert invoke(capfd, "encode", src, "-m", model, "-o", out).code == 0
    return out


# --- portable outputs: built-in models by name --------------------------------------------------------------
def test_builtin_models_are_recorded_by_name_saved_ones_by_path(capfd, model, tmp_path):
    docs = corpus(tmp_path / "docs.jsonl", 3)
    builtin, saved = tmp_path / "builtin.npy", tmp_path / "saved.npy"
    assert invoke(capfd, "encode", docs, "-m", "static", "-o", builtin).code == 0
    assert invoke(capfd, "encode", docs, "-m", model, "-o", saved).code == 0
    meta = load_embeddings(str(builtin)).metadata
    assert meta["model"] == "static" and "model_source" not in meta and meta["docembed_version"]
    assert not any(isinstance(v, str) and "/zoo/" in v for v in meta.values())
    assert load_embeddings(str(saved)).metadata["model_source"] == str(Path(model).resolve())


def test_an_index_recording_an_old_absolute_zoo_path_still_finds_its_model(capfd, tmp_path):
    docs = corpus(tmp_path / "docs.jsonl", 4)
    emb, index = tmp_path / "docs.npy", tmp_path / "docs.index"
    assert invoke(capfd, "encode", docs, "-m", "static", "-o", emb).code == 0
    assert invoke(capfd, "index", "build", "--store", "faiss", emb, "-o", index).code == 0
    meta = json.loads((index / "meta.json").read_text())
    assert meta["model"] == "static" and "model_source" not in meta
    # what an older docembed wrote in another environment: the zoo's absolute installation path
    meta["model_source"] = "/gone/venv/lib/python3.11/site-packages/docembed/zoo/static"
    (index / "meta.json").write_text(json.dumps(meta))
    result = invoke(capfd, "search", index, "--query", "w1 w8", "-k", "2")
    assert result.code == 0, result.err
    assert len(json.loads(result.out)["results"]) == 2
    result = invoke(capfd, "search", index, "--query", "w1", "-m", "/gone/elsewhere/static")
    assert result.code == 1 and "no model folder /gone/elsewhere/static" in one_line_error(
        result.err
    )  # only zoo paths are forgiven


# --- the Makefile of docs/pipelines.md, run -----------------------------------------------------------------
def pipelines_makefile() -> str:
    match = re.search(r"```make\n(.*?)```", PIPELINES.read_text(encoding="utf-8"), re.S)
    assert match, "docs/pipelines.md: no ```make block"
    return match.group(1)


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        ["make", "--no-print-directory", f"DOCEMBED={DOCEMBED}", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_pipelines_makefile_reruns_what_a_touch_affects_and_nothing_else(tmp_path):
    (tmp_path / "Makefile").write_text(pipelines_makefile())
    topics = ["cats and dogs", "the stock market", "rain and snow", "football games", "python code"]
    rows = [{"id": f"d{i}", "text": f"a note on {topics[i % 5]}, number {i}"} for i in range(12)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "queries.txt").write_text("my dog\nwill it snow\n")
    (tmp_path / "tasks.jsonl").write_text(
        json.dumps({"source": "d0", "candidates": ["d1", "d2", "d5"]}) + "\n"
    )
    # one of the page's models: the rules are the same for each (the docs test runs the page's own list)
    first = make(tmp_path, "MODELS=static")
    assert first.returncode == 0, first.stderr
    targets = sorted(p for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    outputs = {f"static{end}" for end in (".npy", ".index", ".search.jsonl", ".rerank.jsonl")}
    assert outputs <= {p.name for p in targets} and not any(p.name.startswith("glove") for p in targets)
    assert make(tmp_path, "-q", "MODELS=static").returncode == 0  # up to date
    stamps = {p: p.stat().st_mtime_ns for p in targets}

    time.sleep(0.05)  # past the file system clock's tick: the touch is newer than every output
    os.utime(tmp_path / "docs.jsonl")  # touch docs.jsonl
    assert make(tmp_path, "-q", "MODELS=static").returncode == 1
    second = make(tmp_path, "MODELS=static")
    assert second.returncode == 0, second.stderr  # every affected rule reran, none needed --overwrite
    assert "--overwrite" not in second.stdout + second.stderr
    assert second.stdout.count(" encode ") == 1 and second.stdout.count(" rerank ") == 1
    assert second.stdout.count(" index build ") == 1 and second.stdout.count(" search ") == 1
    for path, stamp in stamps.items():
        assert path.stat().st_mtime_ns > stamp, f"{path.name} was not rebuilt"
    rows = [json.loads(line) for line in (tmp_path / "out" / "static.search.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(rows[0]["results"]) == 3

    third = make(tmp_path, "MODELS=static")  # nothing touched: nothing reruns
    assert third.returncode == 0 and DOCEMBED not in third.stdout, third.stdout
    assert make(tmp_path, "-q", "MODELS=static").returncode == 0
    assert leftovers(tmp_path / "out") == []


def test_empty_shards_in_every_format_and_with_reuse_merge_back(capfd, model, tmp_path):
    """Two of five shards of 3 lines are empty parts: written, read back and merged in any format, and with
    --reuse too."""
    src = corpus(tmp_path / "docs.jsonl", 3)
    whole = whole_of(capfd, model, src, tmp_path)
    for suffix in (".jsonl", ".npz"):
        parts = []
        for i in range(5):
            part = tmp_path / f"p{i}{suffix}"
            result = invoke(
                capfd, "encode", src, "-m", model, "--shard", f"{i}/5", "--reuse", whole, "-o", part
            )
            assert result.code == 0, result.err
            parts.append(part)
        assert sum(len(load_embeddings(str(part))) == 0 for part in parts) == 2
        merged = tmp_path / f"merged{suffix}.npy"
        assert invoke(capfd, "merge", *parts, "-o", merged).code == 0
        a, b = load_embeddings(str(merged)), load_embeddings(str(whole))
        assert a.ids == b.ids and np.allclose(a.data, b.data)


def test_merge_sums_what_the_parts_did_not_read(capfd, tiny_sbert_tokens_dir, tmp_path):
    """`coverage` (documents cut, tokens not read) of merged shards: the whole run's, not the first part's."""
    src = tmp_path / "docs.jsonl"
    texts = ["w1 w2", "w3 " * 300, "w4", "w5 w6 " * 200]  # the two long ones are past the tiny model's window
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    whole, merged = tmp_path / "whole.npz", tmp_path / "merged.npz"
    assert invoke(capfd, "encode", src, "-m", tiny_sbert_tokens_dir, "-o", whole).code == 0
    parts = [tmp_path / f"part{i}.npz" for i in range(2)]
    for i, part in enumerate(parts):
        assert (
            invoke(capfd, "encode", src, "-m", tiny_sbert_tokens_dir, "--shard", f"{i}/2", "-o", part).code
            == 0
        )
    assert invoke(capfd, "merge", *parts, "-o", merged).code == 0
    expected = load_embeddings(str(whole)).metadata["coverage"]
    assert expected["documents_cut"] == 2 and load_embeddings(str(merged)).metadata["coverage"] == expected
