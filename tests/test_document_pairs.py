"""Contrastive pairs for the student (issue 35): the views of one document, the in-batch loss, and the pair
batches DistillRecipe adds to its distillation batches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cli_helpers import tiny_distill_args
from docembed.losses.in_batch_contrastive import InBatchContrastiveLoss
from docembed.models.student import convert_long
from docembed.training.distill_recipe import DistillRecipe, DistillSettings
from docembed.training.document_pairs import document_view, halves_view, part_view
from docembed.training.loop import TrainConfig, train


def _page(lines: int, words_per_line: int = 30) -> str:
    return "\n".join(" ".join(f"w{line}_{i}" for i in range(words_per_line)) for line in range(lines))


def test_halves_view_splits_a_window_of_the_document_in_two():
    text = " ".join(f"w{i}" for i in range(100))
    first, second = halves_view(text, random.Random(0), max_words=1000)
    assert first.split() == [f"w{i}" for i in range(50)] and second.split() == [
        f"w{i}" for i in range(50, 100)
    ]
    first, second = halves_view(text, random.Random(3), max_words=10)
    words = (first + " " + second).split()
    start = int(words[0][1:])
    assert words == [f"w{i}" for i in range(start, start + 20)] and len(first.split()) == 10


def test_part_view_is_a_passage_and_the_page_around_it_without_it():
    text = _page(40)
    for seed in range(20):
        passage, rest = part_view(text, random.Random(seed), max_words=300)
        passage_words, rest_words = passage.split(), rest.split()
        assert 60 <= len(passage_words) <= 200 + 30 and len(passage.split("\n")) >= 3
        assert not set(passage_words) & set(rest_words) and len(rest_words) == 300
        # the rest is contiguous around the gap: what it keeps before the passage ends where it starts
        page = text.split()
        start = page.index(passage_words[0])
        before = [w for w in rest_words if page.index(w) < start]
        assert not before or page.index(before[-1]) == start - 1
    assert part_view("one line\ntwo\nthree", random.Random(0), 100) is None


def test_document_view_is_seeded_and_falls_back_to_halves():
    text = _page(30)
    assert document_view(text, random.Random(5)) == document_view(text, random.Random(5))
    # a part view's rest is joined by spaces, a halves view keeps the page's lines
    kinds = {"\n" in document_view(text, random.Random(s))[1] for s in range(20)}
    assert kinds == {True, False}  # both kinds of view occur
    single = "a b c d e f"
    assert document_view(single, random.Random(0)) == ("a b c", "d e f")


def test_in_batch_loss_rewards_matching_pairs():
    loss = InBatchContrastiveLoss(scale=20.0)
    queries = torch.nn.functional.normalize(
        torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), dim=1
    )
    matched = loss(queries, queries)
    shuffled = loss(queries, queries.roll(1, dims=0))
    assert float(matched["pair_acc"]) == 1.0 and float(shuffled["pair_acc"]) == 0.0
    assert float(matched["loss"]) < float(shuffled["loss"])
    # symmetric: the mean of both directions' cross-entropy
    scores = 20.0 * queries @ queries.roll(1, dims=0).T
    gold = torch.arange(8)
    expected = (
        torch.nn.functional.cross_entropy(scores, gold) + torch.nn.functional.cross_entropy(scores.T, gold)
    ) / 2
    assert float(shuffled["loss"]) == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(ValueError):
        loss(queries, queries[:4])


def _pair_recipe(tiny_bert_dir, groups=None, **settings):
    student = convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)
    texts = [f"document {i} " + "text " * (i % 7) for i in range(8)]
    pages = [_page(8, 6).replace("w", f"p{i}x") for i in range(6)]
    pv = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    options = {"batch_size": 4, "pair_batch_size": 3, "pair_max_words": 20, **settings}
    return DistillRecipe(
        student, texts, DistillSettings(**options), pv_vectors=pv, pair_texts=pages, pair_groups=groups
    )


def test_pair_batches_are_seeded_per_batch_and_drawn_from_one_group(tiny_bert_dir):
    recipe = _pair_recipe(tiny_bert_dir, groups=["a", "a", "a", "b", "b", "b"])
    first = recipe.pair_batch(0, 1)
    assert torch.equal(first["query_ids"], recipe.pair_batch(0, 1)["query_ids"])
    assert not torch.equal(first["query_ids"], recipe.pair_batch(0, 2)["query_ids"])
    tokenizer = recipe.student.tokenizer
    for number in range(10):
        batch = recipe.pair_batch(0, number)
        pages = {tokenizer.decode(row).split()[1][:2] for row in batch["query_ids"]}
        assert pages in ({"p0", "p1", "p2"}, {"p3", "p4", "p5"})  # one group, three distinct pages
    batch = next(iter(recipe.batches(0)))
    assert {"input_ids", "query_ids", "query_mask", "positive_ids", "positive_mask"} <= set(batch)
    units = int(batch["attention_mask"].sum() + batch["query_mask"].sum() + batch["positive_mask"].sum())
    assert recipe.batch_units(batch) == units


def test_training_with_pairs_logs_and_lowers_the_pair_loss(tiny_bert_dir, tmp_path):
    recipe = _pair_recipe(tiny_bert_dir, pair_weight=5.0)
    batch = recipe.pair_batch(0, 0)

    def pair_loss() -> float:
        module = recipe.module.eval()
        with torch.no_grad():
            queries = module.pool(batch["query_ids"], batch["query_mask"])
            positives = module.pool(batch["positive_ids"], batch["positive_mask"])
            return float(module.pairs(queries, positives)["loss"])

    before = pair_loss()
    summary = train(
        recipe, TrainConfig(output_dir=str(tmp_path), epochs=4, lr=3e-3, log_every=1, device="cpu")
    )
    assert summary["steps"] == 8 and {"pairs", "pair_acc"} <= set(summary["last"])
    assert pair_loss() < before


def test_pair_documents_need_two(tiny_bert_dir):
    from docembed.errors import UsageError

    student = convert_long(str(tiny_bert_dir), max_length=40, attention_window=8)
    pv = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(UsageError, match="at least 2"):
        DistillRecipe(student, ["a", "b"], DistillSettings(), pv_vectors=pv, pair_texts=["only one", "  "])


def test_cli_train_distill_with_pairs_from(tiny_bert_dir, tiny_sbert_dir, tmp_path):
    import json

    from typer.testing import CliRunner

    from docembed.cli import app

    student_dir = tmp_path / "student"
    convert_long(str(tiny_bert_dir), max_length=48, attention_window=8).save(student_dir)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the review number {i} says the film is good" for i in range(8)) + "\n")
    pages = tmp_path / "pages.jsonl"
    rows = [
        {"id": f"docs/{'ab'[i % 2]}/page{i}", "text": _page(6, 5).replace("w", f"q{i}")} for i in range(6)
    ]
    pages.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "trained"
    args = tiny_distill_args(corpus, out, student_dir, tiny_sbert_dir, tmp_path / "c")
    result = CliRunner().invoke(app, [*args, "--pairs-from", str(pages), "--pair-batch-size", "2"])
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "distill.json").read_text())
    assert recorded["pair_documents"] == 6 and recorded["pair_groups"] == ["docs/a", "docs/b"]
    logged = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    assert {"pairs", "pair_acc", "depth"} <= set(logged)
    args[args.index(str(out))] = str(tmp_path / "other")
    result = CliRunner().invoke(app, [*args, "--pairs-from", "-"])
    assert result.exit_code != 0 and "not stdin" in result.output + str(result.exception)
