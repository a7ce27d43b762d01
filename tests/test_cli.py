"""Every foundation subcommand end to end on the real offline MiniLM, and the bad inputs it must survive."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from cli_helpers import DOCEMBED, invoke, run
from docembed.io.embeddings import load_embeddings

DOCS = [
    ("cat", "The cat sat on the mat and purred."),
    ("empty", ""),
    ("bank", "The central bank raised interest rates again."),
    ("dog", "A dog chased the ball across the park."),
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS))
    return path


def test_help_is_fast_and_version():
    started = time.perf_counter()
    result = run("--help")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0 and "encode" in result.stdout
    assert elapsed < 1.5, f"docembed --help took {elapsed:.2f}s"
    assert run("--version").stdout.startswith("docembed ")


def test_encode_rows_match_input_and_metadata(capfd, corpus, tmp_path):
    out = tmp_path / "e.npz"
    result = invoke(capfd, "encode", corpus, "-o", out)
    assert result.code == 0 and result.out == "" and "encoded 4 documents" in result.err
    emb = load_embeddings(str(out))
    assert emb.ids == [i for i, _ in DOCS] and emb.data.shape == (4, 384)
    assert emb.metadata["model"] == "sbert" and emb.metadata["normalized"] is True
    np.testing.assert_allclose(np.linalg.norm(emb.data, axis=1), 1.0, rtol=1e-5)
    # the empty text got a real embedding, not a zero row
    assert np.abs(emb.data[1]).sum() > 0


def test_encode_jsonl_to_stdout_and_stdin(capfd, corpus, tmp_path, monkeypatch):
    result = invoke(capfd, "-q", "encode", corpus)
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert [r["id"] for r in rows] == [i for i, _ in DOCS] and len(rows[0]["vector"]) == 384
    assert result.err == ""  # -q: nothing but data
    proc = subprocess.run(
        [DOCEMBED, "-q", "encode", "-", "--format", "txt"], input="one\ntwo\n", capture_output=True, text=True
    )
    assert proc.returncode == 0 and [json.loads(x)["id"] for x in proc.stdout.splitlines()] == ["0", "1"]


def test_encode_multi_vector_and_shards(capfd, corpus, tmp_path):
    out = tmp_path / "tokens.parquet"
    assert invoke(capfd, "encode", corpus, "-m", "sbert-tokens", "-o", out).code == 0
    emb = load_embeddings(str(out))
    assert emb.is_multi and len(emb) == 4 and emb.metadata["kind"] == "multi"
    assert emb.data.counts[1] == 2  # the empty text still has [CLS] [SEP]
    parts = []
    for i in range(2):
        path = tmp_path / f"shard{i}.npy"
        assert invoke(capfd, "encode", corpus, "--shard", f"{i}/2", "-o", path).code == 0
        parts.append(load_embeddings(str(path)))
    whole = tmp_path / "whole.npy"
    invoke(capfd, "encode", corpus, "-o", whole)
    assert sum((p.ids for p in parts), []) == load_embeddings(str(whole)).ids
    np.testing.assert_allclose(
        np.concatenate([p.data for p in parts]), load_embeddings(str(whole)).data, atol=1e-5
    )


def test_parquet_input_on_the_local_engine(capfd, corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [i for i, _ in DOCS], "text": [t for _, t in DOCS]})
    pq.write_table(table, tmp_path / "docs.parquet", row_group_size=3)
    out, reference = tmp_path / "p.npy", tmp_path / "j.npy"
    assert invoke(capfd, "encode", tmp_path / "docs.parquet", "-m", "glove-avg", "-o", out).code == 0
    assert invoke(capfd, "encode", corpus, "-m", "glove-avg", "-o", reference).code == 0
    got, want = load_embeddings(str(out)), load_embeddings(str(reference))
    assert got.ids == want.ids and np.array_equal(got.data, want.data)
    # --shard slices Parquet rows the way it slices lines
    half = tmp_path / "half.npy"
    assert (
        invoke(
            capfd, "encode", tmp_path / "docs.parquet", "-m", "glove-avg", "--shard", "1/2", "-o", half
        ).code
        == 0
    )
    assert load_embeddings(str(half)).ids == [i for i, _ in DOCS[2:]]


def test_capability_not_supported_is_one_line(capfd, corpus, tmp_path):
    for flag, value in (("--ratio", "0.5"), ("--long", "windows"), ("--precision", "int8")):
        result = invoke(capfd, "encode", corpus, "-m", "glove-avg", flag, value, "-o", tmp_path / "x.npy")
        assert result.code == 1 and "does not support" in result.err and "Traceback" not in result.err
        assert not (tmp_path / "x.npy").exists()


def test_similarity_texts_and_pairs(capfd, tmp_path):
    close = float(invoke(capfd, "similarity", "A cat sits on a mat.", "The cat sat on the mat.").out)
    far = float(invoke(capfd, "similarity", "A cat sits on a mat.", "Interest rates rose.").out)
    assert -1 <= far < close <= 1
    maxsim = float(invoke(capfd, "similarity", "A cat sits.", "A cat sits.", "-m", "sbert-tokens").out)
    assert maxsim == pytest.approx(1.0, abs=1e-4)  # every query token finds itself
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps({"a": "x y", "b": "x y", "tag": 1}) + "\n" + json.dumps({"a": "cat", "b": "stock"}) + "\n"
    )
    result = invoke(capfd, "similarity", "--pairs", pairs, "--left-field", "a", "--right-field", "b")
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert rows[0]["tag"] == 1 and rows[0]["score"] > rows[1]["score"]
    assert invoke(capfd, "similarity", "only one").code == 2


def test_rerank_ids_and_texts(capfd, tmp_path):
    docs = tmp_path / "docs.tsv"
    docs.write_text(
        "L0\tthe feline rested on the rug\nR0\tbond yields fell\nR1\ta cat lay on the carpet\nR2\t\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"qid": "q7", "source": "L0", "candidates": ["R0", "R2", "R1"], "answer": 2}) + "\n"
    )
    for model in ("sbert", "sbert-tokens"):
        result = invoke(capfd, "rerank", tasks, "--docs", docs, "-m", model)
        row = json.loads(result.out)
        assert row["source"] == "L0" and row["ranking"][0]["id"] == "R1"
        assert (row["qid"], row["answer"]) == (
            "q7",
            2,
        ) and "candidates" not in row  # the ranking replaces them
        scores = [c["score"] for c in row["ranking"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 3
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        json.dumps({"query": "weather", "candidates": ["sunny and warm", "tax law", "rain"]}) + "\n"
    )
    row = json.loads(invoke(capfd, "rerank", queries, "-k", "2").out)
    assert len(row["ranking"]) == 2 and row["ranking"][0]["text"] != "tax law"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"source": "L0", "candidates": ["nope"]}) + "\n")
    result = invoke(capfd, "rerank", bad, "--docs", docs)
    assert result.code == 1 and "bad.jsonl:1" in result.err and "nope" in result.err


def test_a_query_text_ranks_the_documents_of_its_candidate_ids(capfd, tmp_path):
    # a query finds the document it is about: its candidates are ids of --docs, ranked by their texts
    docs = tmp_path / "docs.tsv"
    docs.write_text("R0\tbond yields fell\nR1\ta cat lay on the carpet\nR2\tthe orchestra tuned up\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"query": "a kitten on a rug", "candidates": ["R0", "R2", "R1"]}) + "\n")
    row = json.loads(invoke(capfd, "rerank", tasks, "--docs", docs, "-m", "tfidf+sbert").out)
    assert row["query"] == "a kitten on a rug" and row["ranking"][0]["id"] == "R1"
    assert {entry["id"] for entry in row["ranking"]} == {"R0", "R1", "R2"}
    # some ids, some not: the ids were meant, and the missing ones are named
    tasks.write_text(json.dumps({"query": "a kitten", "candidates": ["R0", "R9"]}) + "\n")
    result = invoke(capfd, "rerank", tasks, "--docs", docs)
    assert result.code == 1 and "tasks.jsonl:1" in result.err and "R9" in result.err


@pytest.mark.parametrize("model", ["sbert", "sbert-tokens"])
def test_index_build_and_search(capfd, corpus, tmp_path, model):
    emb, index = tmp_path / "e.npz", tmp_path / "index"
    assert invoke(capfd, "encode", corpus, "-m", model, "-o", emb).code == 0
    assert invoke(capfd, "index", "build", emb, "-o", index).code == 0
    result = invoke(
        capfd, "search", index, "--query", "a kitten on a rug", "--query", "monetary policy", "-k", "2"
    )
    rows = [json.loads(line) for line in result.out.splitlines()]
    assert [r["results"][0]["id"] for r in rows] == ["cat", "bank"]
    assert invoke(capfd, "index", "build", emb, "-o", index).code == 1  # exists, no --overwrite


def test_models_lists_builtins(capfd):
    rows = [json.loads(line) for line in invoke(capfd, "models", "--json").out.splitlines()]
    assert {"sbert", "sbert-tokens", "glove-avg"} <= {r["name"] for r in rows}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"id": 1, "text": "fine"}\n{"id": 2, "text": "broken\n', "docs.jsonl:2: malformed JSON"),
        (b'{"id": 1, "text": "fine"}\n{"id": 2}\n', "docs.jsonl:2: text field 'text' missing"),
        (b'{"id": 1, "text": "caf\xe9"}\n', "docs.jsonl:1: invalid UTF-8"),
        (b"", "input is empty"),
    ],
)
def test_bad_input_is_one_clear_line(capfd, tmp_path, content, message):
    src = tmp_path / "docs.jsonl"
    src.write_bytes(content)
    out = tmp_path / "out.npy"
    result = invoke(capfd, "encode", src, "-o", out)
    assert result.code == 1 and message in result.err and "Traceback" not in result.err
    assert not out.exists()


def test_skip_invalid_counts(capfd, tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_bytes(b'{"id": 1, "text": "fine"}\n{oops\n{"id": 3, "text": "also fine"}\n')
    result = invoke(capfd, "encode", src, "--skip-invalid", "-o", tmp_path / "o.npy")
    assert result.code == 0 and "skipped 1 invalid line" in result.err
    assert load_embeddings(str(tmp_path / "o.npy")).ids == ["1", "3"]


def test_user_errors_exit_codes(capfd, corpus, tmp_path):
    cases = [
        (["encode", corpus, "-m", "no-such-model"], 1, "unknown model 'no-such-model'"),
        (["encode", corpus, "-o", tmp_path / "missing" / "e.npy"], 1, "output folder does not exist"),
        (["encode", tmp_path / "absent.jsonl"], 1, "input file not found"),
        (["encode", "-"], 2, "needs an explicit --format"),
        (["encode", corpus, "--no-such-flag"], 2, "No such option"),
        (["encode", corpus, "-o", tmp_path / "e.xyz"], 2, "output format"),
        (["--device", "tpu", "models"], 2, "--device"),
    ]
    for args, code, message in cases:
        result = invoke(capfd, *args)
        assert (result.code, message in result.err) == (code, True), (args, result)
        assert "Traceback" not in result.err


def test_existing_output_is_kept_without_overwrite(capfd, corpus, tmp_path):
    out = tmp_path / "e.npy"
    out.write_bytes(b"precious")
    result = invoke(capfd, "encode", corpus, "-o", out)
    assert result.code == 1 and "--overwrite" in result.err and out.read_bytes() == b"precious"
    assert invoke(capfd, "encode", corpus, "-o", out, "--overwrite").code == 0
    assert load_embeddings(str(out)).ids[0] == "cat"


def test_corrupt_model_directories(capfd, corpus, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    result = invoke(capfd, "encode", corpus, "-m", garbage)
    assert result.code == 1 and "corrupt" in result.err
    saved = tmp_path / "saved"
    from docembed.models import load_model

    load_model("sbert").save(saved)
    weights = saved / "sentence_transformer" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    result = invoke(capfd, "encode", corpus, "-m", saved)
    assert result.code == 1 and "Traceback" not in result.err and "saved" in result.err


def test_saved_sbert_round_trip(tmp_path):
    from docembed.models import load_model

    model = load_model("sbert-tokens")
    model.save(tmp_path / "m")
    again = load_model(str(tmp_path / "m"))
    assert again.multi_vector and again.config == model.config
    a, b = model.encode(["same text"]), again.encode(["same text"])
    np.testing.assert_allclose(a.vectors, b.vectors, atol=1e-6)


@pytest.mark.slow  # 29 s here; streamed long texts: tests/test_faults_round3c.py (make test-all)
def test_huge_document_is_embedded(capfd, tmp_path):
    src = tmp_path / "big.txt"
    # a ~300 KB line: sbert reads it whole, ~240 windows (the streamed path of a larger one is tested in
    # test_faults_round3c.py)
    src.write_text(("word " * 60_000).strip() + "\nsmall\n")
    result = invoke(capfd, "encode", src, "-o", tmp_path / "big.npy")
    assert result.code == 0 and load_embeddings(str(tmp_path / "big.npy")).data.shape == (2, 384)


def test_broken_pipe_is_quiet(tmp_path):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"document number {i}\n" for i in range(300)))
    proc = subprocess.run(
        f"'{DOCEMBED}' -q encode '{src}' | head -n 1", shell=True, capture_output=True, text=True
    )
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_ctrl_c_during_encode_leaves_no_output(tmp_path):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"a short document, number {i}\n" for i in range(50000)))
    out = tmp_path / "out.npy"
    proc = subprocess.Popen(
        [DOCEMBED, "-v", "encode", str(src), "-o", str(out)], stderr=subprocess.PIPE, text=True
    )
    # -v announces each chunk on stderr: interrupt once encoding has really started
    for line in proc.stderr:
        if "encoded chunk" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["many.txt"]  # no output, no temp files


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_sigterm_unwinds_alone_and_kills_at_once_under_torchrun(tmp_path, world_size):
    """Alone, SIGTERM unwinds like Ctrl-C (exit 143, temporary files removed). Under torchrun the default
    action stays: torchrun stops the other ranks with SIGTERM when one dies, and a rank blocked in a
    collective (C++, where no Python handler runs) must die at once, not hang."""
    src = tmp_path / "many.txt"
    src.write_text("".join(f"a short document, number {i}\n" for i in range(50000)))
    out = tmp_path / "out.npy"
    env = dict(os.environ, WORLD_SIZE=world_size, RANK="1" if world_size == "2" else "0")
    proc = subprocess.Popen(
        [DOCEMBED, "-v", "encode", str(src), "-m", "glove-avg", "-o", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    for line in proc.stderr:
        if "encoded chunk" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if world_size == "1":
        assert proc.returncode == 143 and "terminated" in err
    else:
        assert proc.returncode == -signal.SIGTERM and "terminated" not in err
    assert not out.exists()


def test_a_swallowed_ctrl_c_still_stops_encoding_at_the_next_chunk(monkeypatch):
    """Python drops a KeyboardInterrupt raised inside a __del__ or a callback; the SIGINT handler also sets
    a flag that the encode loop checks between chunks."""
    from docembed import runtime
    from docembed.encoding import encode_documents
    from docembed.io.readers import Document

    class Counting:
        name = "counting"
        calls = 0

        def encode(self, texts, batch_size=32):
            Counting.calls += 1
            with pytest.raises(KeyboardInterrupt):
                runtime.on_interrupt(signal.SIGINT, None)  # the interrupt lands here and is swallowed
            return np.zeros((len(texts), 2), dtype=np.float32)

        def metadata(self):
            return {}

    monkeypatch.setattr(runtime, "_interrupt_requested", False)
    docs = (Document(str(i), "text") for i in range(10))
    with pytest.raises(KeyboardInterrupt):
        encode_documents(Counting(), docs, chunk_size=2)
    assert Counting.calls == 1


def test_every_command_help_has_an_example():
    import typer.main

    from docembed.cli import app

    def commands(group, prefix=""):
        for name, command in group.commands.items():
            if getattr(command, "commands", None):
                yield from commands(command, f"{prefix}{name} ")
            elif not command.hidden:
                yield f"{prefix}{name}", command

    found = dict(commands(typer.main.get_command(app)))
    assert {"encode", "merge", "index build", "search"} <= set(found)
    missing = [name for name, command in found.items() if "Example: docembed " not in (command.help or "")]
    assert missing == []


def test_declared_capabilities_match_the_methods():
    from docembed.models.base import CAPABILITIES, Encoder
    from docembed.models.families import FAMILY_MODULES, get_family

    methods = {"ratio": "set_ratio", "workers": "set_workers", "fit": "fit", "sparse": "encode_sparse"}
    for family in FAMILY_MODULES:
        cls = get_family(family)
        assert cls.capabilities <= set(CAPABILITIES), family
        for capability, method in methods.items():
            has = getattr(cls, method, None) is not None and getattr(cls, method) is not getattr(
                Encoder, method, None
            )
            assert has == (capability in cls.capabilities), (family, capability)
