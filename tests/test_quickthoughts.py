"""QuickThoughts: the neighbour loss, run batching, the vocabulary (unknown words), training, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from docembed.losses.neighbour_contrastive import NeighbourContrastiveLoss, neighbour_targets
from docembed.text import PAD, UNK, Vocabulary, split_sentences, tokenize
from docembed.training.quickthoughts_recipe import SentenceCorpus, run_batches, sentence_runs

# ----------------------------------------------------------------------------------------------- loss

SCORES = [
    [9.0, 2.0, 0.0, 1.0],
    [1.0, 9.0, 3.0, 0.0],
    [0.5, 1.0, 9.0, 2.0],
    [0.0, 0.0, 4.0, 9.0],
]


def _loss_on(scores, context_size, groups=None):
    # f = the score matrix, g = identity, so f @ g.T reproduces the hand-made scores exactly.
    f = torch.tensor(scores)
    g = torch.eye(len(scores))
    return NeighbourContrastiveLoss(context_size)(f, g, None if groups is None else torch.tensor(groups))


def _row_loss(row, i, neighbours):
    """-mean over neighbours of log softmax over the row without its own (diagonal) entry."""
    others = [j for j in range(len(row)) if j != i]
    log_z = math.log(sum(math.exp(row[j]) for j in others))
    return -sum(row[j] - log_z for j in neighbours) / len(neighbours)


def test_loss_matches_hand_computation_context_1():
    out = _loss_on(SCORES, 1)
    expected = np.mean(
        [
            _row_loss(SCORES[0], 0, [1]),
            _row_loss(SCORES[1], 1, [0, 2]),
            _row_loss(SCORES[2], 2, [1, 3]),
            _row_loss(SCORES[3], 3, [2]),
        ]
    )
    assert out["loss"].item() == pytest.approx(expected, rel=1e-5)
    # argmax without the diagonal: row0 -> 1 (hit), row1 -> 2 (hit), row2 -> 3 (hit), row3 -> 2 (hit)
    assert out["neighbour_acc"].item() == pytest.approx(1.0)


def test_loss_context_2_targets_and_accuracy():
    out = _loss_on(SCORES, 2)
    expected = np.mean(
        [
            _row_loss(SCORES[0], 0, [1, 2]),
            _row_loss(SCORES[1], 1, [0, 2, 3]),
            _row_loss(SCORES[2], 2, [0, 1, 3]),
            _row_loss(SCORES[3], 3, [1, 2]),
        ]
    )
    assert out["loss"].item() == pytest.approx(expected, rel=1e-5)
    expected_targets = torch.tensor(
        [[0, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.float32
    )
    assert torch.equal(neighbour_targets(4, 2), expected_targets)


def test_diagonal_is_excluded():
    # Whatever the sentence scores with itself cannot change the loss: it is not a candidate.
    changed = [row[:] for row in SCORES]
    for i in range(4):
        changed[i][i] = -50.0 if i % 2 else 1000.0
    assert _loss_on(changed, 1)["loss"].item() == pytest.approx(_loss_on(SCORES, 1)["loss"].item(), rel=1e-6)


def test_neighbours_in_other_documents_are_not_targets():
    # Rows 0-1 are document A, rows 2-3 document B: 1 and 2 are adjacent but not neighbours.
    out = _loss_on(SCORES, 1, groups=[0, 0, 1, 1])
    expected = np.mean(
        [
            _row_loss(SCORES[0], 0, [1]),
            _row_loss(SCORES[1], 1, [0]),
            _row_loss(SCORES[2], 2, [3]),
            _row_loss(SCORES[3], 3, [2]),
        ]
    )
    assert out["loss"].item() == pytest.approx(expected, rel=1e-5)
    # row 1's best candidate is row 2 (another document): a miss; the other three rows hit.
    assert out["neighbour_acc"].item() == pytest.approx(0.75)


def test_rows_without_neighbours_are_left_out():
    out = _loss_on(SCORES, 1, groups=[0, 1, 2, 2])
    expected = np.mean([_row_loss(SCORES[2], 2, [3]), _row_loss(SCORES[3], 3, [2])])
    assert out["loss"].item() == pytest.approx(expected, rel=1e-5)


def test_loss_gradient_is_finite_with_masked_diagonal():
    f = torch.randn(5, 3, requires_grad=True)
    g = torch.randn(5, 3, requires_grad=True)
    NeighbourContrastiveLoss(1)(f, g)["loss"].backward()
    assert torch.isfinite(f.grad).all() and torch.isfinite(g.grad).all()


# ------------------------------------------------------------------------------------------- batching


def test_runs_stay_inside_documents():
    doc_offsets = np.array([0, 3, 3, 10, 11])  # documents of 3, 0, 7 and 1 sentences
    runs = sentence_runs(doc_offsets, max_run=4)
    assert runs.tolist() == [[0, 3], [3, 7], [7, 10], [10, 11]]


def test_batches_keep_sentence_order_within_runs():
    doc_offsets = np.array([0, 5, 9, 16, 18, 26])
    runs = sentence_runs(doc_offsets, max_run=6)
    doc_of = np.repeat(np.arange(5), np.diff(doc_offsets))
    seen = []
    for sentences, run_ids in run_batches(runs, batch_size=6, seed=3):
        seen.extend(sentences.tolist())
        for position in range(1, len(sentences)):
            if run_ids[position] == run_ids[position - 1]:
                # same run: the next sentence of the same document
                assert sentences[position] == sentences[position - 1] + 1
                assert doc_of[sentences[position]] == doc_of[sentences[position - 1]]
        for run in np.unique(run_ids):
            start, stop = runs[run]
            assert np.all((sentences[run_ids == run] >= start) & (sentences[run_ids == run] < stop))
    assert sorted(seen) == list(range(26))  # every sentence once per epoch
    # a different epoch seed gives a different order of runs, not of sentences within them
    other = np.concatenate([s for s, _ in run_batches(runs, batch_size=6, seed=4)])
    assert other.tolist() != seen and sorted(other.tolist()) == sorted(seen)


def test_recipe_batches_carry_documents_as_groups():
    from docembed.models.quickthoughts import QuickThoughtsConfig
    from docembed.training.quickthoughts_recipe import QuickThoughtsRecipe

    texts = [
        "The film starts. It is long. It ends well.",
        "Bad plot. Good actors.",
        "I came. I saw it twice. I left. I wrote this.",
    ]
    corpus = SentenceCorpus.build(texts)
    config = QuickThoughtsConfig(vocab_size=len(corpus.vocabulary), embedding_dim=4, hidden_size=3)
    recipe = QuickThoughtsRecipe(corpus, config, batch_size=5, seed=0)
    batches = list(recipe.batches(0))
    assert sum(recipe.batch_units(b) for b in batches) == 9
    assert recipe.num_batches(0) == len(batches)
    for batch in batches:
        assert batch["ids"].shape[0] == batch["lengths"].shape[0] == batch["groups"].shape[0]
        for row, length in enumerate(batch["lengths"].tolist()):
            assert (batch["ids"][row, :length] != Vocabulary.pad_id).all()
            assert (batch["ids"][row, length:] == Vocabulary.pad_id).all()
    assert torch.isfinite(recipe.module(batches[0])["loss"])


# ------------------------------------------------------------------------------ vocabulary and text


def test_unknown_words_map_to_unk_and_are_kept():
    texts = ["The cat sat. The cat ran.", "The dog sat quietly."]
    corpus = SentenceCorpus.build(texts, min_count=2)
    vocab = corpus.vocabulary
    assert vocab.tokens[:2] == [PAD, UNK]
    assert "cat" in vocab and "dog" not in vocab and "quietly" not in vocab
    last = corpus.sentence(corpus.num_sentences - 1)
    # "the dog sat quietly ." keeps all five tokens: the two rare words become <unk>, none is dropped
    assert len(last) == 5
    assert last.tolist() == [vocab.id("the"), vocab.unk_id, vocab.id("sat"), vocab.unk_id, vocab.id(".")]
    assert vocab.ids(["cat", "zebra"]) == [vocab.id("cat"), Vocabulary.unk_id]


def test_vocabulary_round_trip_and_caps(tmp_path):
    from collections import Counter

    vocab = Vocabulary.from_counts(Counter({"a": 5, "b": 5, "c": 1, "d": 3}), min_count=2, max_size=4)
    assert vocab.tokens == [PAD, UNK, "a", "b"]  # c is rare, d beyond the cap; ties alphabetical
    vocab.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json").tokens == vocab.tokens


def test_tokenize_and_split_sentences():
    assert tokenize("I don't think it's 3.5/10!") == [
        "i",
        "do",
        "n't",
        "think",
        "it",
        "'s",
        "3.5",
        "/",
        "10",
        "!",
    ]
    assert tokenize("   ") == []
    assert split_sentences("First one. Second one.\n\nThird\nline.") == [
        "First one.",
        "Second one.",
        "Third line.",
    ]


# ------------------------------------------------------------------------------- model and training


def _tiny_encoder(output="mean"):
    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder

    vocab = Vocabulary([PAD, UNK, "good", "movie", "."])
    config = QuickThoughtsConfig(vocab_size=len(vocab), embedding_dim=6, hidden_size=4, output=output)
    torch.manual_seed(0)
    return QuickThoughtsEncoder(config, vocabulary=vocab)


def test_encoder_outputs_mean_and_sentences():
    encoder = _tiny_encoder()
    texts = ["Good movie. Zorblax movie.", "", "good"]
    dense = encoder.encode(texts)
    assert dense.shape == (3, 8)  # [f; g], 4 each
    assert encoder.sentence_ids("Zorblax movie.") == [Vocabulary.unk_id, 3, 4]
    sentences = encoder.encode_sentences(["Good movie.", "Zorblax movie."])
    np.testing.assert_allclose(np.linalg.norm(sentences, axis=1), math.sqrt(2), rtol=1e-5)
    np.testing.assert_allclose(dense[0], sentences.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.isfinite(dense[1]).all() and np.linalg.norm(dense[1]) > 0  # an empty document is embedded
    encoder.set_output("sentences")
    multi = encoder.encode(texts)
    assert multi.counts.tolist() == [2, 1, 1]
    np.testing.assert_allclose(multi[0], sentences, rtol=1e-5, atol=1e-6)


def test_save_load_round_trip(tmp_path):
    from docembed.models.registry import load_model

    encoder = _tiny_encoder()
    encoder.save(tmp_path / "qt")
    loaded = load_model(str(tmp_path / "qt"))
    texts = ["Good movie.", "movie good movie"]
    np.testing.assert_allclose(loaded.encode(texts), encoder.encode(texts), rtol=1e-6)
    assert json.loads((tmp_path / "qt" / "config.json").read_text())["family"] == "quickthoughts"


def test_training_learns_neighbours(tmp_path):
    """Neighbouring sentences share a word; a few dozen steps lift neighbour accuracy far above chance."""
    from docembed.models.quickthoughts import QuickThoughtsConfig
    from docembed.training.loop import TrainConfig, train
    from docembed.training.quickthoughts_recipe import QuickThoughtsRecipe

    rng = np.random.default_rng(0)
    docs = []
    for _ in range(30):
        words = [f"w{int(i)}" for i in rng.integers(0, 60, size=9)]
        docs.append(" ".join(f"{words[k]} {words[k + 1]}." for k in range(8)))
    corpus = SentenceCorpus.build(docs)
    config = QuickThoughtsConfig(vocab_size=len(corpus.vocabulary), embedding_dim=16, hidden_size=24)
    torch.manual_seed(0)
    recipe = QuickThoughtsRecipe(corpus, config, batch_size=24, seed=0)
    summary = train(
        recipe,
        TrainConfig(
            output_dir=str(tmp_path / "run"),
            epochs=30,
            lr=1e-2,
            log_every=5,
            weight_decay=0.0,
            max_steps=80,
            device="cpu",
        ),
    )
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    # chance is about 2 neighbours among 23 candidates (< 0.1)
    assert summary["last"]["neighbour_acc"] > 0.5
    assert "sentences/s" in log[-1]


def _review_corpus(tmp_path, seed: int):
    """20 documents of 6 five-word sentences (JSONL) and a word2vec-format vectors file with a header."""
    rng = np.random.default_rng(seed)
    words = ["good", "bad", "movie", "film", "plot", "actor", "great", "boring", "story", "scene"]
    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as handle:
        for i in range(20):
            text = " ".join(" ".join(rng.choice(words, size=5)) + "." for _ in range(6))
            handle.write(json.dumps({"id": str(i), "text": text}) + "\n")
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("3 4\ngood 1 0 0 0\nmovie 0 1 0 0\nplot 0 0 1 0\n")
    return corpus, vectors


def test_cli_train_and_encode(tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    corpus, vectors = _review_corpus(tmp_path, seed=1)
    out = tmp_path / "qt"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "-q",
            "--device",
            "cpu",
            "train-quickthoughts",
            str(corpus),
            "-o",
            str(out),
            "--vectors",
            str(vectors),
            "--hidden",
            "8",
            "--batch-size",
            "16",
            "--max-steps",
            "3",
            "--min-count",
            "1",
            "--context",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["context_size"] == 2 and config["embedding_dim"] == 4
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["corpus"]["sentences"] == 120
    from safetensors.torch import load_file

    embedding = load_file(str(out / "model.safetensors"))["embedding.weight"]
    vocab = Vocabulary.load(out / "vocab.json")
    assert torch.equal(embedding[Vocabulary.pad_id], torch.zeros(4))
    encoded = tmp_path / "docs.npy"
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "Good movie. Bad plot."}\n{"id": "b", "text": ""}\n')
    result = runner.invoke(app, ["-q", "encode", str(docs), "-m", str(out), "-o", str(encoded)])
    assert result.exit_code == 0, result.output
    assert np.load(encoded).shape == (2, 16)
    assert len(vocab) == config["vocab_size"]


def test_train_quickthoughts_under_torchrun_two_ranks(tmp_path):
    """Two gloo ranks: each trains on whole global batches (runs of consecutive sentences stay intact), the
    logged loss is the mean over ranks, and rank 0 alone writes the model and the summary."""
    from cli_helpers import torchrun
    from docembed.models.registry import load_model

    corpus, vectors = _review_corpus(tmp_path, seed=2)
    out = tmp_path / "qt"
    args = ["-q", "train-quickthoughts", corpus, "-o", out, "--vectors", vectors, "--hidden", "8"]
    args += ["--min-count", "1"]
    proc = torchrun(*args, "--batch-size", "16", "--epochs", "1", "--log-every", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    # 120 sentences in batches of 16: 7 full global batches + 1 of 8 = 8, i.e. 4 steps of 2 ranks
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert summary["corpus"]["sentences"] == 120
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 4
    assert load_model(str(out)).encode(["a good movie. a bad plot."]).shape[0] == 1


def test_cli_init_continues_a_model_with_its_vocabulary_and_weights(tmp_path):
    """--init: the new corpus is read with the old vocabulary (its new words are <unk>), the architecture is
    the old model's whatever --hidden says, and training starts from its weights (at lr 1e-12 they stay)."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from docembed.cli import app

    corpus, vectors = _review_corpus(tmp_path, seed=1)
    runner = CliRunner()
    common = ["-q", "--device", "cpu", "train-quickthoughts", "--batch-size", "16", "--min-count", "1"]
    first = tmp_path / "first"
    result = runner.invoke(
        app,
        [
            *common,
            str(corpus),
            "-o",
            str(first),
            "--vectors",
            str(vectors),
            "--hidden",
            "8",
            "--max-steps",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    more = tmp_path / "more.jsonl"
    more.write_text(
        json.dumps({"id": "m", "text": "A zyzzyva movie. Good plot here. Bad actor there."}) + "\n"
    )
    second = tmp_path / "second"
    result = runner.invoke(
        app,
        [
            *common,
            str(corpus),
            str(more),
            "-o",
            str(second),
            "--init",
            str(first),
            "--hidden",
            "5",
            "--max-steps",
            "2",
            "--lr",
            "1e-12",
            "--weight-decay",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (second / "vocab.json").read_text() == (first / "vocab.json").read_text()
    before, after = load_file(str(first / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert before.keys() == after.keys() and after["f.weight_hh_l0"].shape[1] == 8
    assert all(torch.allclose(before[k], after[k], atol=1e-8) for k in before)
    summary = json.loads((second / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["corpus"]["init"] == str(first)
    result = runner.invoke(app, [*common, str(corpus), "-o", str(tmp_path / "x"), "--init", "tfidf"])
    assert result.exit_code != 0 and "needs a QuickThoughts model" in str(result.exception)


def test_word_vectors_from_a_text_file_keep_the_vocabulary_words_only(tmp_path):
    from docembed.models.word_vectors import read_word_vectors, vocabulary_rows

    path = tmp_path / "vectors.txt"
    path.write_text("3 2\nfilm 1 2\nzzz 9 9\nfilm 5 5\ngood 3 4\n")
    vocabulary = Vocabulary([PAD, UNK, "good", "film", "absent"])
    words, table = read_word_vectors(path, keep=vocabulary)
    assert words == ["film", "good"]  # the first row of a word wins; words outside the vocabulary are skipped
    matrix, found = vocabulary_rows(words, table, vocabulary)
    assert matrix.tolist() == [[0, 0], [0, 0], [3, 4], [1, 2], [0, 0]]
    assert found.tolist() == [False, False, True, True, False]
    assert len(read_word_vectors(path)[0]) == 4


def test_vocabulary_expansion_maps_unknown_words_through_the_fitted_linear_map(tmp_path):
    """A word outside the vocabulary but among the base vectors enters through the least-squares map from
    the base vectors to the trained embeddings (Kiros et al. 2015): when the trained rows are an exact linear
    image of the base rows, the expanded word gets exactly its image. Without the option it is <unk>; only
    the trained table is saved."""
    from safetensors.torch import load_file

    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder
    from docembed.models.registry import load_model

    rng = np.random.default_rng(0)
    base_words = ["good", "movie", "film", "bad", "plot", "great"]
    base = rng.normal(size=(len(base_words), 3))
    vectors = tmp_path / "vectors.txt"
    vectors.write_text(
        "".join(f"{w} {' '.join(f'{x:.6f}' for x in row)}\n" for w, row in zip(base_words, base, strict=True))
    )
    base = np.asarray([[float(f"{x:.6f}") for x in row] for row in base])  # what the file holds
    mapping = rng.normal(size=(3, 6))
    image = dict(zip(base_words, base @ mapping, strict=True))

    def build(words, expand):
        vocabulary = Vocabulary([PAD, UNK, *words, "."])
        config = QuickThoughtsConfig(
            vocab_size=len(vocabulary),
            embedding_dim=6,
            hidden_size=4,
            expand_vocabulary=expand,
            vectors=str(vectors),
        )
        torch.manual_seed(0)
        encoder = QuickThoughtsEncoder(config, vocabulary=vocabulary)
        with torch.no_grad():
            for word in words:
                encoder.module.embedding.weight[vocabulary.id(word)] = torch.tensor(image[word])
            encoder.module.embedding.weight[vocabulary.id(".")] = 0.5
        return encoder

    known = ["good", "movie", "film", "bad", "plot"]
    expanded, plain = build(known, True), build(known, False)
    reference = build([*known, "great"], False)  # "great" trained with exactly its image
    with torch.no_grad():  # the same GRUs as the other two (the vocabulary size changed the random draws)
        reference.module.f.load_state_dict(plain.module.f.state_dict())
        reference.module.g.load_state_dict(plain.module.g.state_dict())
    text = ["A great movie. Great plot."]
    assert Vocabulary.unk_id in plain.sentence_ids("great movie.")
    assert Vocabulary.unk_id not in expanded.sentence_ids("great movie.")
    np.testing.assert_allclose(expanded.encode(text), reference.encode(text), rtol=1e-4, atol=1e-5)
    assert not np.allclose(plain.encode(text), reference.encode(text), atol=1e-3)

    expanded.save(tmp_path / "qt")
    assert load_file(str(tmp_path / "qt" / "model.safetensors"))["embedding.weight"].shape == (8, 6)
    np.testing.assert_allclose(
        load_model(str(tmp_path / "qt")).encode(text), expanded.encode(text), rtol=1e-5
    )
