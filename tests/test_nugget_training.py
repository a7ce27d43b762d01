"""NUGGET's training: the frozen bottom, the freezing options and the anchor, the similarity objective
(residual-only scorer gradient, soft MaxSim, cached states, hard negatives, the training ratio)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from docembed.types import MultiVectors
from nugget_helpers import TEXTS
from tiny_models import tiny_nugget

# --- the frozen bottom ----------------------------------------------------------------------------------


def test_training_changes_upper_layers_but_never_the_frozen_bottom(minilm_tokenizer, tmp_path):
    from docembed.training.loop import TrainConfig, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny_nugget(minilm_tokenizer)
    model = encoder.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    examples = tokenize_examples(encoder, TEXTS * 2, None, 32)
    recipe = NuggetRecipe(encoder, examples, "ae", noise=0.2, batch_size=3)
    train(recipe, TrainConfig(output_dir=str(tmp_path / "run"), max_steps=2, lr=1e-2, device="cpu"))
    after = model.state_dict()
    frozen = [
        "backbone.encoder.embeddings.",
        "backbone.encoder.encoder.layer.0.",
        "backbone.encoder.encoder.layer.1.",
    ]
    upper = "backbone.encoder.encoder.layer.2.attention.self.query.weight"
    for key in before:
        if key.startswith(tuple(frozen)):
            assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before[upper], after[upper])
    assert not torch.equal(before["scorer.0.weight"], after["scorer.0.weight"])
    assert (tmp_path / "run" / "model.safetensors").exists()


# --- freezing options -----------------------------------------------------------------------------------


def _train_steps(encoder, tmp_path, objective="ae", steps=2, **options):
    from docembed.training.loop import TrainConfig, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    targets = None if objective == "ae" else [t[::-1] or "x" for t in TEXTS * 2]
    examples = tokenize_examples(encoder, TEXTS * 2, targets, 32)
    recipe = NuggetRecipe(encoder, examples, objective, noise=0.0, batch_size=3, **options)
    train(recipe, TrainConfig(output_dir=str(tmp_path / "run"), max_steps=steps, lr=1e-2, device="cpu"))
    return recipe


def test_freeze_encoder_trains_only_scorer_value_and_types(minilm_tokenizer, tmp_path):
    encoder = tiny_nugget(minilm_tokenizer, freeze="encoder")
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    _train_steps(encoder, tmp_path)
    after = encoder.model.state_dict()
    for key in before:
        if key.startswith("backbone.encoder."):
            assert torch.equal(before[key], after[key]), key
    for key in ("scorer.0.weight", "value.weight", "type_embeddings.weight"):
        assert not torch.equal(before[key], after[key]), key


def test_freeze_encoder_and_value_trains_only_the_selection(minilm_tokenizer, tmp_path):
    encoder = tiny_nugget(minilm_tokenizer, freeze="encoder+value", feedback=False)
    assert encoder.model.cacheable  # W_V frozen too: token states can still be computed once
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    _train_steps(encoder, tmp_path, objective="sim")
    after = encoder.model.state_dict()
    assert torch.equal(after["value.weight"], torch.eye(after["value.weight"].shape[0]))
    for key in before:
        if key.startswith("backbone.encoder.") or key == "value.weight":
            assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before["scorer.0.weight"], after["scorer.0.weight"])


def test_anchor_penalty_keeps_upper_layers_near_the_warm_start(minilm_tokenizer, tmp_path):
    from docembed.losses.nugget_anchor import NuggetAnchorPenalty

    weight = torch.nn.Parameter(torch.ones(3))
    penalty = NuggetAnchorPenalty([weight], 0.5)
    assert float(penalty().detach()) == 0.0
    with torch.no_grad():
        weight.add_(torch.tensor([1.0, 0.0, -2.0]))
    assert float(penalty().detach()) == pytest.approx(0.5 * (1 + 4))
    key = "backbone.encoder.encoder.layer.3.attention.self.query.weight"
    drift = {}
    for anchor in (0.0, 1e4):
        encoder = tiny_nugget(minilm_tokenizer)
        start = encoder.model.state_dict()[key].clone()
        recipe = _train_steps(encoder, tmp_path / str(anchor), steps=3, anchor_weight=anchor)
        assert (recipe.module.anchor is not None) == (anchor > 0)
        drift[anchor] = float((encoder.model.state_dict()[key] - start).norm())
    assert drift[1e4] < drift[0.0]


# --- the similarity objective ---------------------------------------------------------------------------


def sim_batch(encoder, recipe_options=None):
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    sources = ["the cat sat on the mat .", "a dog barked at night , loudly .", "rain fell all day long ."]
    targets = ["on the mat the cat sat .", "loudly , at night a dog barked .", "all day long rain fell ."]
    examples = tokenize_examples(encoder, sources, targets, 32)
    recipe = NuggetRecipe(encoder, examples, "sim", batch_size=3, **(recipe_options or {}))
    return recipe, next(iter(recipe.batches(0)))


@pytest.mark.parametrize("residual, learns", [("raw", True), ("straight-through", True), ("none", False)])
def test_sim_objective_reaches_the_scorer_only_through_the_residual(minilm_tokenizer, residual, learns):
    encoder = tiny_nugget(minilm_tokenizer, residual=residual)
    recipe, batch = sim_batch(encoder)
    model = encoder.model.train()
    model.zero_grad(set_to_none=True)
    terms = recipe.module(batch)
    terms["loss"].backward()
    grads = [p.grad for p in model.scorer.parameters()]
    norm = sum(0.0 if g is None else float(g.norm()) for g in grads)
    assert (norm > 0) == learns
    assert model.value.weight.grad is not None and float(model.value.weight.grad.norm()) > 0


def test_sim_objective_soft_maxsim_tends_to_mean_maxsim(minilm_tokenizer):
    from docembed.losses.nugget_similarity import NuggetSimilarityLoss
    from docembed.scoring import maxsim_one_to_many

    encoder = tiny_nugget(minilm_tokenizer, residual="none")
    loss = NuggetSimilarityLoss(encoder.model, attention_temperature=1e-4)
    _, batch = sim_batch(encoder)
    model = encoder.model.eval()
    with torch.no_grad():
        a = model(batch["input_ids"], batch["attention_mask"])
        b = model(batch["other_input_ids"], batch["other_attention_mask"])
        soft = loss.soft_maxsim(a, b)
    docs = MultiVectors.from_list([b.nuggets[j][b.slots[j]].numpy() for j in range(3)])
    for i in range(3):
        exact = maxsim_one_to_many(a.nuggets[i][a.slots[i]].numpy(), docs)
        assert np.allclose(soft[i].numpy(), exact, atol=1e-4)


def test_sim_objective_on_cached_states_matches_the_full_forward(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer, freeze="encoder", feedback=False)
    assert encoder.model.cacheable and not tiny_nugget(minilm_tokenizer, freeze="encoder").model.cacheable
    recipe, batch = sim_batch(encoder)
    assert "bottom" in batch and "other_top" in batch  # states computed once, reused every epoch
    encoder.model.eval()
    cached = recipe.module(batch)["loss"]
    plain = {k: v for k, v in batch.items() if not k.endswith(("bottom", "top"))}
    assert torch.allclose(cached, recipe.module(plain)["loss"], atol=1e-2)  # states kept in bf16


def test_sim_pairs_are_counted_once_in_either_direction(minilm_tokenizer):
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny_nugget(minilm_tokenizer)
    examples = tokenize_examples(encoder, ["a b c .", "d e f ."], ["d e f .", "a b c ."], 32)
    assert len(NuggetRecipe(encoder, examples, "sim", batch_size=2).examples) == 1
    assert len(NuggetRecipe(encoder, examples, "mt", batch_size=2).examples) == 2


def test_hard_negatives_join_the_batch_and_the_loss(minilm_tokenizer):
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny_nugget(minilm_tokenizer, residual="raw")
    sources = ["the cat sat on the mat .", "a dog barked at night , loudly ."]
    targets = ["on the mat the cat sat .", "loudly , at night a dog barked ."]
    negatives = [
        ["the cat ran off the mat .", "a cat is on a mat .", targets[1]],
        ["a dog slept all night ."],
    ]
    examples = tokenize_examples(encoder, sources, targets, 32, negatives)
    assert [len(e.negatives) for e in examples] == [3, 1]
    recipe = NuggetRecipe(encoder, examples, "sim", batch_size=2, negatives_per_pair=2)
    batch = next(iter(recipe.batches(0)))
    pooled = {
        tuple(int(t) for t in row[mask.bool()])
        for row, mask in zip(batch["negative_input_ids"], batch["negative_attention_mask"], strict=True)
    }
    positives = {tuple(ids) for e in examples for ids in (e.source, e.target)}
    # two drawn for the first pair (never the other pair's paraphrase, a positive here), one for the second
    assert len(pooled) == 3 and not pooled & positives
    encoder.model.eval()
    with_negatives = recipe.module(batch)["loss"]
    without = recipe.module({k: v for k, v in batch.items() if not k.startswith("negative_")})["loss"]
    assert float(with_negatives) > float(without)  # more columns to lose probability mass to
    none = NuggetRecipe(encoder, examples, "sim", batch_size=2, negatives_per_pair=0)
    assert "negative_input_ids" not in next(iter(none.batches(0)))


@pytest.mark.parametrize("train_ratio", [None, 0.5])
def test_train_ratio_widens_what_the_residual_reaches_while_training_only(minilm_tokenizer, train_ratio):
    encoder = tiny_nugget(minilm_tokenizer, ratio=0.25, residual="raw")
    recipe, batch = sim_batch(encoder, {"train_ratio": train_ratio})
    scored = []  # every token's score, per forward of the scorer (one per side of the batch)

    def keep(module, inputs, out):
        out.retain_grad()
        scored.append(out)

    hook = encoder.model.scorer.register_forward_hook(keep)
    terms = recipe.module(batch)
    terms["loss"].backward()
    hook.remove()
    r = train_ratio or 0.25
    for out, side in zip(scored, ("", "other_"), strict=False):
        n = batch[f"{side}attention_mask"].sum(1)
        k = torch.ceil(n * r - 1e-9).long()
        # the scorer hears only through the residual: exactly the k(train r) selected tokens get a gradient
        assert (out.grad.squeeze(-1) != 0).sum(1).tolist() == k.tolist()
    assert float(terms["nuggets_per_doc"]) == pytest.approx(float(k.float().mean()))
    assert encoder.model.ratio == 0.25 and encoder.config.ratio == 0.25  # encoding keeps the model's r
    assert encoder.encode(["a b c d e f g h ."]).counts.tolist() == [math.ceil(0.25 * 11)]


def test_train_ratio_outside_zero_to_one_is_refused(minilm_tokenizer):
    from docembed.errors import UsageError

    with pytest.raises(UsageError, match="train-ratio"):
        sim_batch(tiny_nugget(minilm_tokenizer), {"train_ratio": 0.0})
