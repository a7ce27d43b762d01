"""Fault injection, round three continued (issue #49): nothing lost, nothing wrong in silence. No output lands
inside an input folder; a rebuilt set or index deletes only what docembed wrote; --output-format follows -o;
non-finite weights and vectors, lossy --reuse, degenerate models and a --resume with other settings are
refused; a broken zoo config or config/weights mismatch is one line; empty shards merge; long names fit."""

import json
import os
import shutil
import time

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings
from test_faults import corpus, leftovers, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)


def _newer(path):
    """Make `path` newer than anything written so far (an input that makes outputs stale)."""
    later = time.time() + 5
    os.utime(path, (later, later))
    return path


def _encode(capfd, *args):
    return invoke(capfd, "-q", "encode", *map(str, args))


@pytest.fixture
def indexed(capfd, model, tmp_path):  # noqa: F811
    """e.npy encoded from docs.jsonl, indexed as e.index."""
    docs = corpus(tmp_path / "docs.jsonl", 6)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e.npy").code == 0
    assert (
        invoke(
            capfd, "-q", "index", "build", "--store", "faiss", tmp_path / "e.npy", "-o", tmp_path / "e.index"
        ).code
        == 0
    )
    return tmp_path / "e.index"


# --- 1a: no output inside an input folder ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, extra", [("meta.json", []), ("index.faiss", ["--overwrite"]), ("new.jsonl", [])]
)
def test_search_output_inside_the_index_is_refused(capfd, tmp_path, indexed, name, extra):
    queries = tmp_path / "q.txt"
    queries.write_text("w1 w2\n")
    _newer(queries)
    before = {p.name: p.read_bytes() for p in indexed.iterdir() if p.is_file()}
    result = invoke(capfd, "search", indexed, "--queries", queries, "-o", indexed / name, *extra)
    assert result.code == 1 and "inside the input" in one_line_error(result.err)
    assert {p.name: p.read_bytes() for p in indexed.iterdir() if p.is_file()} == before


def test_encode_output_inside_the_model_folder_is_refused(capfd, model, tmp_path):  # noqa: F811
    own = tmp_path / "m"
    shutil.copytree(model, own)
    docs = corpus(tmp_path / "docs.jsonl", 3)
    result = _encode(capfd, docs, "-m", own, "-o", own / "config.npy")
    assert result.code == 1 and "inside the input" in one_line_error(result.err)
    assert not (own / "config.npy").exists()


# --- 1b: a rebuilt set deletes only the sidecars the old set wrote -----------------------------------------
@pytest.mark.parametrize("extra", [["--overwrite"], []])
def test_a_dense_rebuild_keeps_or_refuses_user_files_at_sidecar_names(capfd, model, tmp_path, extra):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "v.npy").code == 0
    for sidecar in ("v.offsets.npy", "v.positions.npy"):
        (tmp_path / sidecar).write_bytes(b"mine")
    _newer(docs)  # stale: rebuilt without --overwrite too
    result = _encode(capfd, docs, "-m", model, "-o", tmp_path / "v.npy", *extra)
    assert result.code == 1 and "not written by docembed" in one_line_error(result.err)
    assert (tmp_path / "v.offsets.npy").read_bytes() == (tmp_path / "v.positions.npy").read_bytes() == b"mine"


# --- 1c: --output-format follows the extension -------------------------------------------------------------
@pytest.mark.parametrize("suffix, format", [("parquet", "npy"), ("npy", "parquet"), ("jsonl", "npz")])
def test_an_output_format_other_than_the_extension_is_refused(capfd, model, tmp_path, suffix, format):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e2.npy").code == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("e2.")}
    out = tmp_path / f"e2.{suffix}"
    args = ["--reuse", tmp_path / "e2.npy", "-o", out, "--output-format", format, "--overwrite"]
    result = _encode(capfd, docs, "-m", model, *args)
    assert result.code == 2 and "--output-format" in one_line_error(result.err)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("e2.")} == before


def test_a_matching_output_format_is_fine(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e.npz", "--output-format", "npz").code == 0
    assert len(load_embeddings(str(tmp_path / "e.npz"))) == 3


# --- 1d: folder outputs keep what docembed did not write; evaluate -o needs --overwrite --------------------
@pytest.mark.parametrize("extra", [["--overwrite"], []])
def test_an_index_rebuild_keeps_a_user_file_inside_it(capfd, tmp_path, indexed, extra):
    (indexed / "notes.txt").write_text("mine\n")
    _newer(tmp_path / "e.npy")
    result = invoke(
        capfd, "-q", "index", "build", "--store", "faiss", tmp_path / "e.npy", "-o", indexed, *extra
    )
    assert result.code == 1 and "notes.txt" in one_line_error(result.err)
    assert (indexed / "notes.txt").read_text() == "mine\n"


def test_evaluate_keeps_existing_result_files_without_overwrite(capfd, tmp_path):
    from docembed.evaluation import EvalResult

    result = EvalResult("stsb", "m", "spearman", 1.0, {}, {}, {}, 0.1, "2026-01-01")
    out = tmp_path / "results"
    from docembed.evaluation import write_result

    write_result(result, out)
    before = (out / "stsb__m.json").read_bytes()
    with pytest.raises(Exception, match="--overwrite"):
        write_result(result, out, overwrite=False)
    assert (out / "stsb__m.json").read_bytes() == before
    write_result(result, out, overwrite=True)


# --- 2a: non-finite weights and vectors --------------------------------------------------------------------
def _setenc_dir(path, dim=8):
    from docembed.models.setenc import SetEncoder, SetEncoderConfig

    config = SetEncoderConfig(num_buckets=64, word_dim=8, heads=2, dim=dim, hidden=8)
    SetEncoder(config).save(path)
    return path


def test_a_model_with_nan_weights_is_refused_at_load(capfd, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    folder = _setenc_dir(tmp_path / "m")
    state = load_file(str(folder / "model.safetensors"))
    save_file(
        {k: torch.full_like(v, float("nan")) for k, v in state.items()}, str(folder / "model.safetensors")
    )
    result = _encode(capfd, corpus(tmp_path / "docs.jsonl", 3), "-m", folder, "-o", tmp_path / "e.npy")
    assert result.code == 1 and "model.safetensors" in one_line_error(result.err)
    assert "not finite" in result.err and not (tmp_path / "e.npy").exists()


def test_non_finite_vectors_are_not_written(capfd, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _setenc_dir(tmp_path / "m")
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v * 1e36 + 1e36 for k, v in state.items()}, str(folder / "model.safetensors"))  # finite
    result = _encode(capfd, corpus(tmp_path / "docs.jsonl", 3), "-m", folder, "-o", tmp_path / "e.npy")
    assert result.code == 1 and "not finite" in one_line_error(result.err) and "'d0'" in result.err
    assert not (tmp_path / "e.npy").exists()


# --- 2b: --reuse never passes int8-rounded rows off as float32 ---------------------------------------------
def test_reuse_of_an_int8_set_into_float32_is_refused(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e8.npy", "--storage", "int8").code == 0
    result = _encode(capfd, docs, "-m", model, "--reuse", tmp_path / "e8.npy", "-o", tmp_path / "f.npy")
    assert result.code == 2 and "int8" in one_line_error(result.err)
    assert not (tmp_path / "f.npy").exists()
    args = ["--reuse", tmp_path / "e8.npy", "-o", tmp_path / "g.npy", "--storage", "int8"]
    assert _encode(capfd, docs, "-m", model, *args).code == 0
    # float16 rows rounded again to int8 are not the int8 values a fresh encode writes
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "e16.npy", "--storage", "float16").code == 0
    args = ["--reuse", tmp_path / "e16.npy", "-o", tmp_path / "h.npy", "--storage", "int8"]
    result = _encode(capfd, docs, "-m", model, *args)
    assert result.code == 2 and "float16" in one_line_error(result.err) and not (tmp_path / "h.npy").exists()


# --- 2c, 2d: train-setenc: no zero-width models; --resume keeps the checkpoint's settings ------------------
SETENC_TINY = ["--buckets", "64", "--word-dim", "8", "--heads", "2", "--dim", "8", "--hidden", "8", "-b", "4"]


@pytest.mark.parametrize("flag", ["--dim", "--word-dim", "--hidden"])
def test_train_setenc_refuses_zero_width(capfd, tmp_path, flag):
    docs = corpus(tmp_path / "docs.jsonl", 8)
    args = [*SETENC_TINY, flag, "0", "--max-steps", "1"]
    result = invoke(capfd, "-q", "train-setenc", docs, "-o", tmp_path / "m", *args)
    assert result.code == 2 and flag in result.err and not (tmp_path / "m").exists()


def test_setenc_config_refuses_zero_width():
    from docembed.errors import CorruptModelError
    from docembed.models.setenc import SetEncoderConfig

    with pytest.raises(CorruptModelError, match="word_dim"):
        SetEncoderConfig(word_dim=0)


@pytest.mark.parametrize("change", [["--counts", "bag"], ["--attention", "softmax"], ["--dim", "16"]])
def test_resume_with_other_settings_is_refused(capfd, tmp_path, change):
    docs = corpus(tmp_path / "docs.jsonl", 8)
    out = tmp_path / "m"
    first = invoke(capfd, "-q", "train-setenc", docs, "-o", out, *SETENC_TINY, "--max-steps", "1")
    assert first.code == 0, first.err
    config = (out / "config.json").read_bytes()
    args = [*SETENC_TINY, *change, "--max-steps", "2", "--resume"]
    result = invoke(capfd, "-q", "train-setenc", docs, "-o", out, *args)
    setting = {"--counts": "counts", "--attention": "attention", "--dim": "dim"}[change[0]]
    assert result.code == 2 and f"{setting}:" in one_line_error(result.err)
    assert (out / "config.json").read_bytes() == config
    again = invoke(capfd, "-q", "train-setenc", docs, "-o", out, *SETENC_TINY, "--max-steps", "2", "--resume")
    assert again.code == 0, again.err


# --- 2e: rerank --docs warns of duplicate ids --------------------------------------------------------------
def test_rerank_docs_with_a_duplicate_id_warn(capfd, model, tmp_path):  # noqa: F811
    docs = tmp_path / "docs.jsonl"
    rows = [{"id": "a", "text": "w1 w2"}, {"id": "b", "text": "w3"}, {"id": "a", "text": "w5 w6"}]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"source": "b", "candidates": ["a"]}) + "\n")
    result = invoke(capfd, "rerank", tasks, "--docs", docs, "-m", model)
    assert result.code == 0, result.err
    assert "warning: 1 duplicate id(s)" in result.err and "'a'" in result.err


# --- 3a, 3b: broken model folders are one line -------------------------------------------------------------
def test_a_zoo_config_without_its_base_hash_is_one_line(capfd, tmp_path):
    from docembed.models.zoo import model_dir

    if not (model_dir("static") / "overlay.safetensors").exists():
        pytest.skip("the static zoo model is not shipped here")
    own = tmp_path / "static"
    shutil.copytree(model_dir("static"), own)
    payload = json.loads((own / "config.json").read_text())
    del payload["zoo"]["base"]["sha256"]
    (own / "config.json").write_text(json.dumps(payload))
    result = _encode(capfd, corpus(tmp_path / "docs.jsonl", 2), "-m", own, "-o", tmp_path / "e.npy")
    assert result.code == 1 and "sha256" in one_line_error(result.err)


def test_a_config_dim_that_disagrees_with_the_weights_is_one_line(capfd, tmp_path):
    folder = _setenc_dir(tmp_path / "m")
    payload = json.loads((folder / "config.json").read_text())
    payload["config"]["dim"] = 16
    (folder / "config.json").write_text(json.dumps(payload))
    result = _encode(capfd, corpus(tmp_path / "docs.jsonl", 2), "-m", folder, "-o", tmp_path / "e.npy")
    assert result.code == 1 and str(folder) in one_line_error(result.err)
    assert "size mismatch" in result.err


# --- 3c: an empty shard is a valid empty part ---------------------------------------------------------------
def test_more_shards_than_rows_merge(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    parts = []
    for i in range(10):
        parts.append(tmp_path / f"part{i}.npy")
        result = _encode(capfd, docs, "-m", model, "--shard", f"{i}/10", "-o", parts[-1])
        assert result.code == 0, result.err
    assert invoke(capfd, "-q", "merge", *parts, "-o", tmp_path / "whole.npy").code == 0
    assert _encode(capfd, docs, "-m", model, "-o", tmp_path / "direct.npy").code == 0
    whole, direct = (
        load_embeddings(str(tmp_path / "whole.npy")),
        load_embeddings(str(tmp_path / "direct.npy")),
    )
    assert whole.ids == direct.ids and np.array_equal(whole.data, direct.data)


# --- 3d: long output names ----------------------------------------------------------------------------------
def test_a_long_output_name_is_written_when_it_fits(capfd, model, tmp_path):  # noqa: F811
    docs = corpus(tmp_path / "docs.jsonl", 3)
    out = tmp_path / ("x" * 242 + ".parquet")  # 250 bytes: its `.NAME.tmpPID` would not fit
    result = _encode(capfd, docs, "-m", model, "-o", out)
    assert result.code == 0, result.err
    assert len(load_embeddings(str(out))) == 3 and leftovers(tmp_path) == []
    assert _encode(capfd, docs, "-m", model, "-o", out, "--overwrite").code == 0
    folder = tmp_path / ("i" * 250)
    assert invoke(capfd, "-q", "index", "build", "--store", "faiss", out, "-o", folder).code == 0
    assert (
        invoke(capfd, "-q", "index", "build", "--store", "faiss", out, "-o", folder, "--overwrite").code == 0
    )
    assert (folder / "index.faiss").exists() and leftovers(tmp_path) == []


def test_a_set_whose_sidecar_name_is_too_long_is_refused_before_the_work(capfd, model, tmp_path):  # noqa: F811
    out = tmp_path / ("x" * 246 + ".npy")  # fits; its .meta.json sidecar does not
    result = _encode(capfd, corpus(tmp_path / "docs.jsonl", 3), "-m", model, "-o", out)
    assert result.code == 1 and "too long" in one_line_error(result.err) and "x" * 246 in result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_a_resume_with_nothing_left_to_train_says_so(capfd, tmp_path):
    """A checkpoint already at --max-steps (or --epochs) trains nothing: said in one line, the model and the
    summary's last losses kept (a script may always pass --resume)."""
    docs = corpus(tmp_path / "docs.jsonl", 8)
    out = tmp_path / "se"
    assert invoke(capfd, "-q", "train-setenc", docs, "-o", out, *SETENC_TINY, "--max-steps", "2").code == 0
    weights = (out / "model.safetensors").read_bytes()
    last = json.loads((out / "train_summary.json").read_text())["last"]
    again = invoke(capfd, "train-setenc", docs, "-o", out, *SETENC_TINY, "--max-steps", "2", "--resume")
    assert again.code == 0 and "nothing left to train with --epochs 10, --max-steps 2" in again.err
    assert "nan" not in again.err and (out / "model.safetensors").read_bytes() == weights
    assert last and json.loads((out / "train_summary.json").read_text())["last"] == last
