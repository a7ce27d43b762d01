"""Set encoder: the alignment/uniformity loss against hand-computed values, the views, the encoder's
permutation invariance, save/load, and the train-setenc / plot commands end to end (tiny configs)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from docembed.cli import app
from docembed.losses.align_uniform import AlignUniformLoss, alignment, uniformity
from docembed.models.setenc import SetEncoder, SetEncoderConfig, TokenHasher, embed_chunks, pack
from docembed.training.setenc_recipe import SetEncoderRecipe, split_views

TINY = {"num_buckets": 512, "num_hashes": 2, "word_dim": 16, "heads": 2, "dim": 16, "hidden": 32}


# --- the loss -----------------------------------------------------------------------------------------
def test_loss_by_hand_on_three_points():
    # x: three unit vectors; squared distances: e1-e2 = 2, e1-(-e1) = 4, e2-(-e1) = 2.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    y = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # ||x_i - y_i||^2 = 0, 2, 2
    t = 3.0
    assert alignment(x, y).item() == pytest.approx((0 + 2 + 2) / 3)
    expected_x = math.log((math.exp(-t * 2) + math.exp(-t * 4) + math.exp(-t * 2)) / 3)
    assert uniformity(x, t).item() == pytest.approx(expected_x, rel=1e-6)
    # y: pairs (e1, e1) = 0, (e1, e2) = 2, (e1, e2) = 2
    expected_y = math.log((1 + 2 * math.exp(-t * 2)) / 3)
    assert uniformity(y, t).item() == pytest.approx(expected_y, rel=1e-6)
    terms = AlignUniformLoss(t=t, align_weight=0.5, uniform_weight=2.0)(x, y)
    assert terms["align"].item() == pytest.approx(4 / 3)
    assert terms["uniform"].item() == pytest.approx((expected_x + expected_y) / 2, rel=1e-6)
    assert terms["loss"].item() == pytest.approx(0.5 * 4 / 3 + 2.0 * (expected_x + expected_y) / 2, rel=1e-6)


def test_identical_documents_give_zero_align_and_zero_uniform_with_finite_gradients():
    v = torch.nn.functional.normalize(torch.randn(1, 8), dim=-1).repeat(5, 1).requires_grad_(True)
    terms = AlignUniformLoss()(v, v.clone())
    assert terms["align"].item() == pytest.approx(0.0, abs=1e-7)
    assert terms["uniform"].item() == pytest.approx(0.0, abs=1e-6)  # log(mean exp(0)) = log 1
    terms["loss"].backward()
    assert torch.isfinite(v.grad).all()


def test_uniformity_floor_is_reached_by_a_simplex():
    # Four corners of a regular tetrahedron on the unit sphere: every squared distance is 8/3 = 2n/(n-1).
    x = torch.tensor([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=torch.float32) / math.sqrt(3)
    t = 2.0
    assert uniformity(x, t).item() == pytest.approx(-2 * t * 4 / 3, rel=1e-5)


def test_loss_is_float32_and_single_row_batches_have_no_uniformity():
    x = torch.nn.functional.normalize(torch.randn(1, 4), dim=-1).to(torch.bfloat16)
    terms = AlignUniformLoss()(x, x)
    assert terms["loss"].dtype == torch.float32
    assert terms["uniform"].item() == 0.0
    with pytest.raises(ValueError):
        AlignUniformLoss()(torch.zeros(3, 4), torch.zeros(2, 4))


# --- the views ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [2, 3, 10, 11])
def test_views_are_disjoint_halves_whose_union_is_the_document(length):
    tokens = np.array([5, 5, 7, 1, 9, 9, 9, 2, 3, 4, 4][:length])
    rng = np.random.default_rng(0)
    left, right = split_views(tokens, rng)
    assert len(left) == length // 2 and len(right) == length - length // 2
    assert Counter(left.tolist()) + Counter(right.tolist()) == Counter(tokens.tolist())
    # disjoint as positions: tag each token with its position and split the tags the same way
    positions = split_views(np.arange(length), np.random.default_rng(0))
    assert not set(positions[0].tolist()) & set(positions[1].tolist())
    assert sorted(positions[0].tolist() + positions[1].tolist()) == list(range(length))


def test_views_cap_takes_a_random_subset():
    left, right = split_views(np.arange(100), np.random.default_rng(1), max_tokens=10)
    assert len(left) == 5 and len(right) == 5
    assert not set(left.tolist()) & set(right.tolist())


def test_recipe_reshuffles_every_epoch_and_skips_short_documents():
    long_a = " ".join(f"a{i}" for i in range(20))
    long_b = " ".join(f"b{i}" for i in range(20))
    texts = [long_a, "one", "", long_b, "kappa lambda mu"]
    recipe = SetEncoderRecipe(texts, SetEncoderConfig(**TINY), batch_size=2, seed=3)
    assert recipe.skipped == 2 and len(recipe.docs) == 3
    assert recipe.num_batches(0) == 1  # 2 + 1 documents: the lone leftover is dropped
    first, again, other = (list(recipe.batches(e)) for e in (0, 0, 1))
    assert len(first) == 1 and recipe.batch_units(first[0]) == 2
    assert torch.equal(
        first[0]["left"]["chunks"][0]["buckets"], again[0]["left"]["chunks"][0]["buckets"]
    )  # deterministic per epoch
    assert not torch.equal(
        first[0]["left"]["chunks"][0]["buckets"], other[0]["left"]["chunks"][0]["buckets"]
    )  # a new split per epoch
    terms = recipe.module(first[0])
    assert set(terms) == {"loss", "align", "uniform"}


def test_recipe_initialisation_is_seeded():
    texts = ["alpha beta gamma delta", "epsilon zeta eta theta"]
    first = SetEncoderRecipe(texts, SetEncoderConfig(**TINY), batch_size=2, seed=5).module.state_dict()
    torch.manual_seed(123)  # whatever the global state, the seed decides the initial weights
    second = SetEncoderRecipe(texts, SetEncoderConfig(**TINY), batch_size=2, seed=5).module.state_dict()
    other = SetEncoderRecipe(texts, SetEncoderConfig(**TINY), batch_size=2, seed=6).module.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["network.embedding.weight"], other["network.embedding.weight"])


# --- the encoder --------------------------------------------------------------------------------------
def test_hashing_is_stable_and_uses_several_buckets():
    hasher = TokenHasher(1000, 2, seed=0)
    assert hasher("hello") == TokenHasher(1000, 2, seed=0)("hello")  # no per-process randomness
    assert hasher("hello") != TokenHasher(1000, 2, seed=1)("hello")
    assert all(0 <= b < 1000 for b in hasher("hello")) and len(hasher("hello")) == 2


@pytest.mark.parametrize("attention", ["softmax", "kernel"])
def test_encoder_is_permutation_invariant_and_normalised(attention):
    torch.manual_seed(0)
    model = SetEncoder(SetEncoderConfig(**TINY, attention=attention))
    text = "the cat sat on the mat while the dog barked at a passing car"
    words = text.split()
    shuffled = " ".join(words[i] for i in np.random.default_rng(0).permutation(len(words)))
    other = "stock markets fell sharply as interest rates rose"
    out = model.encode([text, shuffled, other, "", "word"])
    assert out.shape == (5, 16) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], out[1], atol=1e-5)
    assert not np.allclose(out[0], out[2], atol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)  # empty doc included
    # the network itself: permuting the padded token slots of a batch changes nothing
    bag = model.bag(text)
    perm = np.random.default_rng(1).permutation(len(bag[0]))
    a = pack([bag])
    b = pack([(bag[0][perm], bag[1][perm])])
    with torch.no_grad():
        torch.testing.assert_close(model.network(**a), model.network(**b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "kernel"])
def test_a_token_seen_c_times_weighs_as_c_copies_in_bag_mode(attention):
    torch.manual_seed(0)
    model = SetEncoder(SetEncoderConfig(**TINY, counts="bag", attention=attention))
    buckets, counts = model.bag("apple apple apple banana cherry")
    assert sorted(counts.tolist()) == [1, 1, 3]
    copies = np.repeat(np.arange(len(counts)), counts.astype(int))  # each token as `count` separate slots
    with torch.no_grad():
        counted = model.network(**pack([(buckets, counts)], "bag"))
        repeated = model.network(**pack([(buckets[copies], np.ones(len(copies), np.float32))], "bag"))
    torch.testing.assert_close(counted, repeated, atol=1e-5, rtol=1e-5)


def test_bag_counts_matter_and_set_mode_ignores_them():
    torch.manual_seed(0)
    bag_model = SetEncoder(SetEncoderConfig(**TINY, counts="bag"))
    set_model = SetEncoder(SetEncoderConfig(**TINY, counts="set"))
    set_model.network.load_state_dict(bag_model.network.state_dict())
    once, thrice = "apple banana cherry", "apple apple apple banana cherry"
    bag_out, set_out = bag_model.encode([once, thrice]), set_model.encode([once, thrice])
    assert not np.allclose(bag_out[0], bag_out[1], atol=1e-4)
    np.testing.assert_allclose(set_out[0], set_out[1], atol=1e-6)


def test_encode_order_and_batching_do_not_change_rows(tmp_path):
    torch.manual_seed(0)
    model = SetEncoder(SetEncoderConfig(**TINY))
    texts = ["a b c", "a much longer document with many more words in it", "x", "b c d e f"]
    np.testing.assert_allclose(
        model.encode(texts, batch_size=1), model.encode(texts, batch_size=3), atol=1e-5
    )
    model.save(tmp_path / "m")
    from docembed.models.registry import load_model

    loaded = load_model(str(tmp_path / "m"))
    np.testing.assert_allclose(loaded.encode(texts), model.encode(texts), atol=1e-6)
    assert loaded.normalized and loaded.dim == 16


# --- the commands -------------------------------------------------------------------------------------
def _corpus(path):
    topics = [
        "space rocket orbit launch nasa moon shuttle satellite",
        "hockey game team season player goal league playoff",
        "windows driver card graphics software install file disk",
    ]
    rng = np.random.default_rng(0)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(60):
            words = topics[i % 3].split()
            text = " ".join(rng.choice(words, size=12).tolist())
            handle.write(json.dumps({"id": f"d{i}", "text": text, "label": f"t{i % 3}"}) + "\n")


def test_train_setenc_cli_end_to_end(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    out = tmp_path / "model"
    args = ["train-setenc", str(corpus), "-o", str(out), "--epochs", "3", "-b", "20", "--buckets", "256"]
    args += ["--dim", "16", "--word-dim", "16", "--heads", "2", "--hidden", "16", "--log-every", "1"]
    result = CliRunner().invoke(app, ["-q", *args])
    assert result.exit_code == 0, result.output
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    logged = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert all("align" in row and "uniform" in row for row in logged) and len(logged) == 9
    assert all(-2 * 3.0 * 20 / 19 - 1e-4 <= row["uniform"] <= 0 for row in logged)
    encoded = tmp_path / "emb.npy"
    result = CliRunner().invoke(app, ["-q", "encode", str(corpus), "-m", str(out), "-o", str(encoded)])
    assert result.exit_code == 0, result.output
    vectors = np.load(encoded)
    assert vectors.shape == (60, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_train_setenc_rejects_bad_options(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    result = CliRunner().invoke(
        app, ["train-setenc", str(corpus), "-o", str(tmp_path / "m"), "--counts", "x"]
    )
    assert result.exit_code != 0
    result = CliRunner().invoke(
        app, ["train-setenc", str(corpus), "-o", str(tmp_path / "m"), "--dim", "10", "--heads", "3"]
    )
    assert result.exit_code != 0


def test_train_setenc_keeps_its_old_option_spellings_as_hidden_aliases(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    out = tmp_path / "model"
    args = ["train-setenc", str(corpus), "--output-dir", str(out), "--t", "2", "--max-steps", "1"]
    args += ["--buckets", "256", "--dim", "16", "--word-dim", "16", "--heads", "2", "--hidden", "16"]
    result = CliRunner().invoke(app, ["-q", *args])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "setenc_training.json").read_text())["t"] == 2.0
    help_text = CliRunner().invoke(app, ["train-setenc", "--help"], terminal_width=200).output
    assert "--temperature" in help_text and "--output-dir" not in help_text and " --t " not in help_text


def test_plot_cli_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 5
    vectors = np.stack([centres[i % 3] + rng.normal(size=8) for i in range(60)]).astype(np.float32)
    from docembed.io.embeddings import save_embeddings
    from docembed.types import EmbeddingSet

    emb = tmp_path / "emb.npz"
    save_embeddings(EmbeddingSet(vectors, [f"d{i}" for i in range(60)], {"model": "test"}), str(emb))
    png = tmp_path / "map.png"
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # t-SNE's OpenMP threads crawl on a busy 2-core machine
        result = CliRunner().invoke(app, ["-q", "plot", str(emb), "--labels", str(corpus), "-o", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels_txt = tmp_path / "labels.txt"
    labels_txt.write_text("".join(f"t{i % 3}\n" for i in range(59)))  # one label short
    result = CliRunner().invoke(
        app, ["plot", str(emb), "--labels", str(labels_txt), "-o", str(tmp_path / "x.png")]
    )
    assert result.exit_code != 0


def test_torchrun_two_ranks_uniformity_is_per_rank_and_resume_with_one(tmp_path):
    """Under DDP "the batch" of the uniformity term is each rank's own batch: the first logged uniformity is
    the mean over the two ranks of the uniformity of global batches 0 and 1, computed here in one process
    from the same seeded initialisation. A 2-rank checkpoint then resumes in 1 process."""
    from cli_helpers import torchrun

    corpus = tmp_path / "corpus.jsonl"
    _corpus(corpus)
    out = tmp_path / "model"
    shape = ["--dim", "16", "--word-dim", "16", "--heads", "2", "--hidden", "16", "--buckets", "256"]
    shape += ["--attention", "kernel", "--temperature", "3"]  # the recipe's t, rebuilt below
    args = ["--seed", "5", "-q", "train-setenc", str(corpus), "-o", str(out), "-b", "10", *shape]
    proc = torchrun(*args, "--epochs", "1", "--log-every", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3  # 6 global batches, 2 per step
    first = json.loads((out / "train_log.jsonl").read_text().splitlines()[0])

    config = SetEncoderConfig(num_buckets=256, word_dim=16, heads=2, dim=16, hidden=16, attention="kernel")
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    recipe = SetEncoderRecipe(texts, config, batch_size=10, seed=5)
    batches = recipe.batches(0)
    pair = [next(batches), next(batches)]
    with torch.no_grad():
        per_rank = [recipe.module(batch)["uniform"].item() for batch in pair]
        network = recipe.encoder.network
        left, right = (torch.cat([embed_chunks(network, b[v]) for b in pair]) for v in ("left", "right"))
        one_batch_of_20 = recipe.module.loss(left, right)["uniform"].item()
    assert first["uniform"] == pytest.approx(sum(per_rank) / 2, abs=1e-4)
    assert abs(first["uniform"] - one_batch_of_20) > 1e-3

    resumed = CliRunner().invoke(app, [*args, "--epochs", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 1 and summary["steps"] == 3 + 6
