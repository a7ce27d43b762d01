"""`docembed encode --engine ray` on a local 2-CPU Ray instance, checked row by row against the local engine.

One Ray instance serves the whole module (starting one costs seconds); each encode starts its own actor
pool, which loads the model once per actor. The models are conftest's tiny sbert (dense) and its
output="tokens" twin (multi-vector): the engine's behaviour does not depend on the model's size.
"""

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import invoke
from docembed.errors import DocembedError
from docembed.io.embeddings import load_embeddings

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray at a time (make test runs pytest-xdist)

WORDS = ["cat", "dog", "bank", "river", "rate", "market", "music", "film", "rain", "sun", "tree", "city"]


def _text(i: int) -> str:
    if i == 5:
        return ""  # an empty text still gets a row
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 3 + i % 9)) + f" number {i}."


# records 3, 17 and 40 carry no id: both engines must fall back to the 0-based line (row) number
RECORDS = [{"text": _text(i)} if i in (3, 17, 40) else {"id": f"doc{i}", "text": _text(i)} for i in range(50)]
SHARD_RANGES = [[0, 16], [16, 32], [32, 48], [48, 50]]


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return path


def _ray_encode(capfd, source, out, *extra):
    return invoke(
        capfd,
        "encode",
        source,
        "--engine",
        "ray",
        "--num-workers",
        "2",
        "--rows-per-shard",
        "16",
        "-o",
        out,
        *extra,
    )


def _same_schema(a, b) -> bool:
    return pq.read_schema(a).remove_metadata() == pq.read_schema(b).remove_metadata()


def _docembed_meta(path) -> dict:
    return json.loads(pq.read_schema(path).metadata[b"docembed"])


def test_dense_matches_local_and_rerun_skips_written_shards(
    capfd, ray_instance, corpus, tiny_sbert_dir, tmp_path
):
    local_path, out = tmp_path / "local.parquet", tmp_path / "out"
    assert invoke(capfd, "encode", corpus, "-m", tiny_sbert_dir, "-o", local_path).code == 0
    result = _ray_encode(capfd, corpus, out, "-m", tiny_sbert_dir)
    assert result.code == 0, result.err
    assert result.out == "" and "encoded 50 documents" in result.err

    local, sharded = load_embeddings(str(local_path)), load_embeddings(str(out))
    assert sharded.ids == local.ids and local.ids[3] == "3" and local.ids[4] == "doc4"
    assert sharded.data.dtype == local.data.dtype == np.float32
    np.testing.assert_allclose(sharded.data, local.data, atol=1e-5)
    assert np.abs(sharded.data[5]).sum() > 0  # the empty text

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["count"] == 50 and manifest["dim"] == 32
    assert manifest["kind"] == "dense" and manifest["model"]["model"] == str(tiny_sbert_dir)
    assert manifest["job"]["input"]["rows"] == 50 and manifest["num_shards"] == 4
    assert [[s["start"], s["stop"]] for s in manifest["shards"]] == SHARD_RANGES
    assert [s["rows"] for s in manifest["shards"]] == [16, 16, 16, 2]
    assert {s["status"] for s in manifest["shards"]} == {"done"}

    # every shard is an ordinary .parquet embeddings file, with the local writer's columns and metadata
    shard = out / "part-00001.parquet"
    assert _same_schema(shard, local_path)
    own, reference = _docembed_meta(shard), _docembed_meta(local_path)
    assert own.pop("count") == 16 and reference.pop("count") == 50
    # what the model did not read is counted per shard, as the local run counts it for the whole input
    assert own.pop("coverage")["documents"] == 16 and reference.pop("coverage")["documents"] == 50
    # the local writer's per-row text hashes (for `encode --reuse`) are not written by the Ray engine
    assert reference.pop("text_hashes") and reference.pop("model_identity")
    assert own == reference
    assert load_embeddings(str(shard)).ids == local.ids[16:32]

    # a lost shard: the directory refuses to load, and a re-run writes that shard only
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    (out / "part-00002.parquet").unlink()
    with pytest.raises(DocembedError, match="incomplete"):
        load_embeddings(str(out))
    result = _ray_encode(capfd, corpus, out, "-m", tiny_sbert_dir)
    assert result.code == 0 and "3 already written, 1 to encode" in result.err
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    assert after.keys() == stamps.keys()
    assert [name for name in sorted(after) if after[name] != stamps[name]] == ["part-00002.parquet"]
    np.testing.assert_allclose(load_embeddings(str(out)).data, local.data, atol=1e-5)

    # nothing left to do: no Ray work at all; another job in the same directory is refused
    assert "4 already written, 0 to encode" in _ray_encode(capfd, corpus, out, "-m", tiny_sbert_dir).err
    result = invoke(
        capfd, "encode", corpus, "-m", tiny_sbert_dir, "--engine", "ray", "--rows-per-shard", "10", "-o", out
    )
    assert result.code == 1 and "different job" in result.err and "rows_per_shard" in result.err


@pytest.mark.slow  # a Ray run of its own, 37 s here; multi-vector encoding is tested locally (make test-all)
def test_multi_vector_from_parquet_matches_local(
    capfd, ray_instance, corpus, tiny_sbert_tokens_dir, tmp_path
):
    source = tmp_path / "docs.parquet"
    table = pa.table({"id": [r.get("id") for r in RECORDS], "text": [r["text"] for r in RECORDS]})
    pq.write_table(table, source, row_group_size=7)  # shards straddle row groups
    local_path, out = tmp_path / "local.parquet", tmp_path / "out"
    assert invoke(capfd, "encode", corpus, "-m", tiny_sbert_tokens_dir, "-o", local_path).code == 0
    result = _ray_encode(capfd, source, out, "-m", tiny_sbert_tokens_dir)
    assert result.code == 0, result.err

    local, sharded = load_embeddings(str(local_path)), load_embeddings(str(out))
    assert sharded.is_multi and sharded.ids == local.ids
    np.testing.assert_array_equal(sharded.data.offsets, local.data.offsets)
    np.testing.assert_array_equal(sharded.data.positions, local.data.positions)
    assert sharded.data.vectors.dtype == local.data.vectors.dtype == np.float32
    np.testing.assert_allclose(sharded.data.vectors, local.data.vectors, atol=1e-5)
    assert _same_schema(out / "part-00000.parquet", local_path)  # id, vectors, positions
    assert json.loads((out / "manifest.json").read_text())["kind"] == "multi"


@pytest.mark.slow  # two Ray runs, 53 s on the 2-core machine (make test-all); bad lines locally: test_cli
def test_bad_line_stops_the_run_and_skip_invalid_resumes(capfd, ray_instance, tiny_sbert_dir, tmp_path):
    source, out = tmp_path / "docs.txt", tmp_path / "out"
    lines = [json.dumps({"id": i, "text": _text(i)}) for i in range(30)]
    lines[25] = "{not json"
    source.write_text("\n".join(lines) + "\n")
    args = ("-m", tiny_sbert_dir, "--engine", "ray", "--num-workers", "1", "--rows-per-shard", "10")
    args += ("--format", "jsonl", "-o", out)
    result = invoke(capfd, "encode", source, *args)
    assert result.code == 1 and "docs.txt:26: malformed JSON" in result.err
    assert "Traceback" not in result.err
    shards = json.loads((out / "manifest.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["done", "done", "pending"]
    result = invoke(capfd, "encode", source, *args, "--skip-invalid")
    assert result.code == 0 and "2 already written, 1 to encode" in result.err
    assert "skipped 1 invalid line" in result.err
    emb = load_embeddings(str(out))
    assert len(emb) == 29 and "25" not in emb.ids and emb.ids[-1] == "29"


def test_without_ray_the_flag_says_how_to_install(capfd, corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = invoke(capfd, "encode", corpus, "--engine", "ray", "-o", tmp_path / "out")
    assert result.code == 1 and "pip install 'docembed[ray]'" in result.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--num-workers", "2", "-o", "x.npy"), "--num-workers needs --engine ray"),
        (("--engine", "ray"), "pass -o DIR"),
        (("--engine", "ray", "--shard", "0/2", "-o", "out"), "--rows-per-shard"),
        (("--engine", "ray", "--output-format", "npy", "-o", "out"), "Parquet shards only"),
        (("--engine", "spark", "-o", "x.npy"), "expected local or ray"),
    ],
)
def test_engine_usage_errors(capfd, corpus, args, message):
    result = invoke(capfd, "encode", corpus, *args)
    assert result.code == 2 and message in result.err
