"""The long student: conversion (positions, windows, global projections), save/load, the distillation recipe
(length weighting, teacher cache, bucketed batches, checkpointed Soft CCA state) and both CLI commands."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli_helpers import tiny_distill_args
from docembed.cli import app
from docembed.encoding import EmbeddingCache, model_identity
from docembed.errors import UsageError
from docembed.models.registry import load_model
from docembed.models.student import (
    StudentConfig,
    StudentEncoder,
    convert_long,
    convert_to_long,
    tile_positions,
)
from docembed.training.distill_recipe import DistillRecipe, DistillSettings, depth_weights
from docembed.training.loop import TrainConfig, train
from tiny_models import TINY_POSITIONS

ORIGINAL = TINY_POSITIONS  # the source model's positions: conftest's session-wide tiny BERT and tiny sbert


@pytest.fixture(scope="module")
def tiny_bert(tiny_bert_dir):
    """The tiny BERT in memory; only read (convert_to_long copies its weights), so shared by the module."""
    from transformers import BertModel

    return BertModel.from_pretrained(tiny_bert_dir).eval()


def test_tile_positions_bert_and_roberta_by_hand():
    old = torch.arange(4, dtype=torch.float32).unsqueeze(1).repeat(1, 2)  # row i = (i, i)
    # BERT: no source offset; pad 0 -> rows 1.. hold positions 0, 1, 2, 3, 0, 1, ...
    bert = tile_positions(old, rows=8, pad=0, source_offset=0)
    assert bert[:, 0].tolist() == [0, 0, 1, 2, 3, 0, 1, 2]
    # RoBERTa: pad 1, positions start at row 2 of the source (usable rows 2, 3), kept rows 0..1.
    roberta = tile_positions(old, rows=8, pad=1, source_offset=2)
    assert roberta[:, 0].tolist() == [0, 1, 2, 3, 2, 3, 2, 3]


def test_converted_model_matches_bert_within_original_length(tiny_bert):
    # With a window wider than the input, sliding-window attention is full attention: the Longformer must
    # reproduce BERT exactly, which holds only if position p of BERT lands on Longformer's position id.
    long_model = convert_to_long(tiny_bert, None, max_length=64, attention_window=2 * ORIGINAL)
    ids = torch.tensor(
        [[101, 2023, 2003, 1037, 3231, 102, 0, 0], [101, 7592, 2088, 999, 2307, 2154, 2000, 102]]
    )
    mask = (ids != 0).long()
    mask[1] = 1
    expected = tiny_bert(input_ids=ids, attention_mask=mask).last_hidden_state
    got = long_model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert torch.allclose(got[real], expected[real], atol=1e-5)


def test_converted_model_global_projections_copied(tiny_bert):
    long_model = convert_to_long(tiny_bert, None, max_length=64, attention_window=8)
    layer = long_model.encoder.layer[1].attention.self
    source = tiny_bert.encoder.layer[1].attention.self
    for name in ("query", "key", "value"):
        assert torch.equal(getattr(layer, f"{name}_global").weight, getattr(source, name).weight)
        assert torch.equal(getattr(layer, name).bias, getattr(source, name).bias)
    assert long_model.config.attention_window == [8, 8]


def test_positions_beyond_original_length_are_finite_and_distinct(tiny_bert):
    long_model = convert_to_long(tiny_bert, None, max_length=64, attention_window=8)
    torch.manual_seed(1)
    shared = torch.randint(1000, 2000, (1, ORIGINAL - 1))  # with [CLS]: every position the source has
    tail_a, tail_b = (
        torch.randint(2000, 3000, (1, 51 - ORIGINAL)),
        torch.randint(3000, 4000, (1, 51 - ORIGINAL)),
    )
    a = torch.cat([torch.tensor([[101]]), shared, tail_a, torch.tensor([[102]])], 1)  # 52 tokens > ORIGINAL
    b = torch.cat([torch.tensor([[101]]), shared, tail_b, torch.tensor([[102]])], 1)
    out_a = long_model(input_ids=a, attention_mask=torch.ones_like(a)).last_hidden_state
    out_b = long_model(input_ids=b, attention_mask=torch.ones_like(b)).last_hidden_state
    assert out_a.shape == (1, 52, 32) and torch.isfinite(out_a).all() and torch.isfinite(out_b).all()
    # Documents differing only beyond the source's ORIGINAL positions get different pooled vectors ...
    assert not torch.allclose(out_a.mean(1), out_b.mean(1), atol=1e-4)
    # ... and a position past ORIGINAL is not a copy of another token's vector.
    assert not torch.allclose(out_a[0, 40], out_a[0, 41], atol=1e-4)
    with pytest.raises(UsageError):
        convert_to_long(tiny_bert, None, max_length=64, attention_window=7)


def test_convert_save_load_encode(tiny_bert_dir, tmp_path):
    student = convert_long(str(tiny_bert_dir), max_length=48, attention_window=8)
    texts = ["a short one", "word " * 200, ""]
    before = student.encode(texts)
    assert before.shape == (3, 32) and np.isfinite(before).all()
    assert np.allclose(np.linalg.norm(before, axis=1), 1.0, atol=1e-5)
    assert len(student.tokenize(["word " * 200])[0]) == 48
    student.save(tmp_path / "student")
    loaded = load_model(str(tmp_path / "student"))
    assert isinstance(loaded, StudentEncoder) and loaded.config.max_length == 48
    assert np.allclose(loaded.encode(texts), before, atol=1e-5)


class _FakeTokenizer:
    def __call__(self, texts, truncation=False):
        return {"input_ids": [[0] + t.split() + [0] for t in texts]}


class _FakeTeacher:
    """Vectors from word counts; counts its encode calls."""

    tokenizer = _FakeTokenizer()
    max_seq_length = 5
    source = None
    name = "fake"

    def __init__(self):
        self.calls = []

    def encode(self, texts, batch_size=16):
        self.calls.append(list(texts))
        return np.array([[len(t.split()), 1.0, 0.5] for t in texts], dtype=np.float32)

    def metadata(self):
        return {"model": "fake", "family": "fake", "config_hash": "x", "normalized": False}


def test_depth_weights_follow_teacher_length():
    # max 5 teacher tokens incl. 2 special tokens: 3 words are read whole, 4 are not.
    weights = depth_weights(_FakeTeacher(), ["a b c", "a b c d", "a"], weight=0.5)
    assert weights.tolist() == [0.5, 0.0, 0.5]


def test_teacher_cache_computes_once(tmp_path):
    teacher = _FakeTeacher()
    cache = EmbeddingCache(tmp_path)
    first = cache.vectors(teacher, ["a b", "c", "a b"])
    assert teacher.calls == [["a b", "c"]]  # duplicates encoded once
    second = cache.vectors(teacher, ["c", "d e f", "a b"])
    assert teacher.calls[1] == ["d e f"]  # only the new document
    assert second[:, 0].tolist() == [1.0, 3.0, 2.0] and first[:, 0].tolist() == [2.0, 1.0, 2.0]
    assert cache.vectors(teacher, ["c"])[0, 0] == 1.0 and len(teacher.calls) == 2
    assert len(list(tmp_path.rglob("*.pkl"))) == 0 and len(list(tmp_path.rglob("vectors.npy"))) == 1
    assert model_identity(teacher) == model_identity(_FakeTeacher())


def _tiny_student(tiny_bert_dir):
    return convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)


def test_length_weighting_in_the_module(tiny_bert_dir):
    student = _tiny_student(tiny_bert_dir)
    texts = ["one two three", "four five six seven eight nine ten eleven"]
    rng = np.random.default_rng(0)
    sbert = rng.normal(size=(2, 32)).astype(np.float32)
    recipe = DistillRecipe(
        student,
        texts,
        DistillSettings(batch_size=2),
        sbert_vectors=sbert,
        sbert_weights=np.array([1.0, 0.0], dtype=np.float32),
    )
    recipe.module.eval()
    batch = recipe.collate([0, 1])
    with torch.no_grad():
        terms = recipe.module(batch)
        pooled = student.forward(batch["input_ids"], batch["attention_mask"])
    cos0 = torch.nn.functional.cosine_similarity(pooled[0], torch.from_numpy(sbert[0]), dim=0)
    assert float(terms["depth"]) == pytest.approx(float(1 - cos0) / 2, rel=1e-4)  # 2nd input weighs 0
    assert float(terms["loss"]) == pytest.approx(float(terms["depth"]), rel=1e-6)
    assert float(terms["depth_share"]) == 0.5


def test_bucketed_batches_are_deterministic_and_length_sorted(tiny_bert_dir):
    student = _tiny_student(tiny_bert_dir)
    texts = [" ".join(["w"] * n) for n in range(1, 33)]
    pv = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32)
    recipe = DistillRecipe(student, texts, DistillSettings(batch_size=4, bucket_batches=8), pv_vectors=pv)
    order = recipe._order(0)
    assert order == recipe._order(0) and order != recipe._order(1)
    assert sorted(i for b in order for i in b) == list(range(32))
    for rows in order:  # one pool of 32: each batch holds 4 consecutive lengths
        lengths = sorted(len(recipe.token_ids[i]) for i in rows)
        assert lengths[-1] - lengths[0] == 3


def test_training_runs_and_checkpoints_soft_cca_state(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file

    student = _tiny_student(tiny_bert_dir)
    texts = [f"document {i} " + "text " * (i % 7) for i in range(12)]
    rng = np.random.default_rng(0)
    recipe = DistillRecipe(
        student,
        texts,
        DistillSettings(batch_size=4, gradient_checkpointing=True),
        sbert_vectors=rng.normal(size=(12, 32)).astype(np.float32),
        sbert_weights=np.ones(12, dtype=np.float32),
        pv_vectors=rng.normal(size=(12, 5)).astype(np.float32),
    )
    summary = train(
        recipe, TrainConfig(output_dir=str(tmp_path), epochs=1, lr=1e-3, log_every=1, device="cpu")
    )
    assert summary["steps"] == 3
    state = load_file(str(tmp_path / "checkpoint" / "model.safetensors"))
    assert float(state["breadth.count"]) > 0 and state["breadth.phi_student"].shape == (5, 5)
    logged = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert {"loss", "depth", "breadth", "cca_l2", "cca_decorrelation"} <= set(logged[0])
    assert isinstance(load_model(str(tmp_path)), StudentEncoder)


def test_cli_convert_long_and_train_distill(tiny_bert_dir, tiny_sbert_dir, tmp_path):
    runner = CliRunner()
    student_dir = tmp_path / "student"
    result = runner.invoke(
        app,
        [
            "-q",
            "convert-long",
            str(tiny_bert_dir),
            "-o",
            str(student_dir),
            "--max-length",
            "64",
            "--attention-window",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((student_dir / "config.json").read_text())["family"] == "student"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(f"the review number {i} says the film is {'good' if i % 2 else 'bad'}" for i in range(10))
        + "\n"
    )
    out = tmp_path / "trained"
    args = tiny_distill_args(corpus, out, student_dir, tiny_sbert_dir, tmp_path / "cache")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").exists() and (out / "train_summary.json").exists()
    assert load_model(str(out)).encode(["a film"]).shape == (1, 32)
    # Without --pv-model, a PV teacher is trained on the corpus first (train-pv), then distilled from.
    out_pv = tmp_path / "trained-pv"
    args = ["-q", "train-distill", str(corpus), "-o", str(out_pv), "--student", str(student_dir)]
    args += ["--teacher", "pv", "--pv-mode", "dbow", "--pv-dim", "8", "--batch-size", "5"]
    result = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert (out_pv / "pv-teacher" / "config.json").exists() and (out_pv / "model.safetensors").exists()
    assert (out_pv / "pv-teacher" / "train_log.jsonl").exists()  # trained as train-pv trains
    logged = json.loads((out_pv / "train_log.jsonl").read_text().splitlines()[-1])
    assert "breadth" in logged and "depth" not in logged
    again = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert again.exit_code != 0  # a finished student is not trained over
    # a kept PV teacher of other settings (a resumed or a failed run's) is never distilled from in silence
    other = [a if a != "8" else "16" for a in args]  # --pv-dim 16
    result = runner.invoke(app, [*other, "--cache-dir", str(tmp_path / "cache"), "--resume"])
    assert result.exit_code != 0 and "holds a PV teacher of mode dbow, dim 8" in str(result.exception)
    # a loss that is nothing is refused before the student loads: no folder made
    bogus = [*args[:4], str(tmp_path / "bogus"), *args[5:], "--depth-loss", "bogus"]
    result = runner.invoke(app, bogus)
    assert result.exit_code != 0 and "--depth-loss is one of" in str(result.exception)
    assert not (tmp_path / "bogus").exists()
    bad = runner.invoke(app, ["train-distill", str(corpus), "-o", str(tmp_path / "x"), "--teacher", "bert"])
    assert bad.exit_code != 0


def test_student_without_longformer_config_is_a_usage_error():
    with pytest.raises(UsageError):
        StudentEncoder(StudentConfig())


def test_unsupported_source_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2Model

    with pytest.raises(UsageError):
        convert_to_long(GPT2Model(GPT2Config(n_layer=1, n_embd=8, n_head=2)), None, 32, 8)


def test_depth_head_when_teacher_is_wider(tiny_bert_dir):
    student = _tiny_student(tiny_bert_dir)
    recipe = DistillRecipe(
        student,
        ["a b", "c d e"],
        DistillSettings(batch_size=2),
        sbert_vectors=np.ones((2, 48), dtype=np.float32),
    )
    assert recipe.module.depth_head is not None and recipe.module.depth_head.out_features == 48
    assert torch.isfinite(recipe.module(recipe.collate([0, 1]))["loss"])


def test_resume_keeps_the_running_covariance(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file

    texts = [f"document {i} " + "text " * (i % 5) for i in range(12)]
    pv = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)

    def run(**kwargs):
        recipe = DistillRecipe(
            _tiny_student(tiny_bert_dir), texts, DistillSettings(batch_size=4), pv_vectors=pv
        )
        train(recipe, TrainConfig(output_dir=str(tmp_path), lr=1e-3, device="cpu", **kwargs))
        return load_file(str(tmp_path / "checkpoint" / "model.safetensors"))

    first = run(max_steps=2)
    assert float(first["breadth.count"]) == pytest.approx(1.95)  # c = 0.95 * 1 + 1 after two batches
    second = run(resume=True)  # one batch left in the epoch
    assert float(second["breadth.count"]) == pytest.approx(0.95 * 1.95 + 1)


def test_longformer_checkpoint_is_wrapped_as_is(tiny_bert, tiny_bert_dir, tmp_path):
    # The allenai/longformer-base-4096 path: a saved Longformer is loaded, not converted again.
    from transformers import AutoTokenizer

    long_model = convert_to_long(tiny_bert, None, max_length=64, attention_window=8)
    long_model.save_pretrained(tmp_path / "longformer")
    AutoTokenizer.from_pretrained(str(tiny_bert_dir)).save_pretrained(tmp_path / "longformer")
    student = convert_long(str(tmp_path / "longformer"), max_length=64, attention_window=16)
    assert student.model.config.attention_window == [16, 16]
    assert torch.equal(
        student.model.embeddings.position_embeddings.weight, long_model.embeddings.position_embeddings.weight
    )
    with pytest.raises(UsageError):
        convert_long(str(tmp_path / "longformer"), max_length=65, attention_window=16)


def test_train_distill_under_torchrun_two_ranks(tiny_bert_dir, tiny_sbert_dir, tmp_path):
    """Two gloo ranks: rank 0 trains the PV teacher and fills the teacher cache first, rank 1 then finds
    every vector cached; the Soft CCA history is shared (identical buffers), rank 0 alone writes."""
    from safetensors.torch import load_file

    from cli_helpers import torchrun

    student_dir = tmp_path / "student"
    _tiny_student(tiny_bert_dir).save(student_dir)
    corpus = tmp_path / "corpus.txt"
    lines = [f"review {i} says the film is {'good' if i % 2 else 'bad'} and {i % 5} stars" for i in range(16)]
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "trained"
    args = ["train-distill", corpus, "-o", out, "--student", student_dir, "--teacher", "sbert,pv"]
    args += ["--sbert-model", tiny_sbert_dir, "--pv-mode", "dbow", "--pv-dim", "8", "--batch-size", "4"]
    proc = torchrun(*args, "--cache-dir", tmp_path / "cache", "--log-every", "1", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("all 16 texts cached") == 2  # rank 1, for each teacher
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2  # 4 global batches of 4
    logged = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    assert {"depth", "breadth", "cca_l2", "cca_decorrelation"} <= set(logged)
    state = load_file(str(out / "checkpoint" / "model.safetensors"))
    phi = [v for k, v in state.items() if k.endswith("phi_student")]
    assert len(phi) == 1 and phi[0].abs().sum() > 0
    assert (out / "pv-teacher" / "config.json").exists() and (out / "distill.json").exists()


def test_depth_target_chunks_gives_every_document_a_target(tiny_sbert_dir, tmp_path):
    from docembed.encoding import EmbeddingCache
    from docembed.training.distill_recipe import sbert_teacher

    cache = EmbeddingCache(tmp_path / "cache")
    teacher = load_model(str(tiny_sbert_dir))
    limit = teacher.max_seq_length
    texts = ["a short film review", " ".join(["the long film goes on"] * limit)]
    whole_vectors, whole = sbert_teacher(cache, str(tiny_sbert_dir), texts, 0.5, "cpu", "whole")
    chunk_vectors, chunks = sbert_teacher(cache, str(tiny_sbert_dir), texts, 0.5, "cpu", "chunks")
    assert whole.tolist() == [0.5, 0.0] and chunks.tolist() == [
        0.5,
        0.5,
    ]  # the thesis' lambda vs every document
    teacher.config.output = "chunks"
    np.testing.assert_allclose(chunk_vectors, teacher.encode(texts), atol=1e-6)
    np.testing.assert_allclose(chunk_vectors[0], whole_vectors[0], atol=1e-5)  # one window: the same vector
    assert not np.allclose(chunk_vectors[1], whole_vectors[1], atol=1e-3)  # the long one: all its windows
