"""train-retriever (issue 45): its views, BM25-mined negatives, the loss with negatives, the recipe's frozen
layers, validation, the command end to end, and its refusals before a model loads."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli_helpers import invoke
from docembed.cli import app
from docembed.losses.in_batch_contrastive import InBatchContrastiveLoss
from docembed.training.retrieval_pairs import (
    DEFAULT_KINDS,
    LEAD_WORDS,
    RetrievalDocument,
    RetrievalExample,
    make_examples,
    mine_negatives,
    read_documents,
    view,
)

TOPICS = {
    "space": "rocket orbit launch nasa moon shuttle satellite astronaut telescope mars",
    "hockey": "hockey game team season player goal league playoff puck coach",
    "disk": "windows driver card graphics software install file disk partition format",
}


def _document(topic: str, rng: random.Random, lines: int = 8, words: int = 15) -> str:
    vocabulary = [*TOPICS[topic].split(), "the", "a", "of", "and", "to", "in", "is", "for", "on", "with"]
    return "\n".join(" ".join(rng.choice(vocabulary) for _ in range(words)) for _ in range(lines))


def _documents(count: int = 12, seed: int = 0) -> list[RetrievalDocument]:
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    return [
        RetrievalDocument(_document(topics[i % 3], rng), group=f"g{i % 2}", summary=f"about {topics[i % 3]}")
        for i in range(count)
    ]


def test_each_view_is_a_query_about_one_part_and_the_window_it_is_in():
    text = "\n".join(f"line{i} " + " ".join(f"w{i}_{j}" for j in range(29)) for i in range(12))
    document = RetrievalDocument(text, summary="a page of numbered words")
    rng = random.Random(0)
    passage, around = view(document, "part", rng, window_words=40)
    assert passage in text and passage not in around and 60 <= len(passage.split()) <= 230
    first, second = view(document, "next", rng, window_words=40)
    joined = " ".join(first.split() + second.split())
    assert joined in " ".join(text.split()) and len(first.split(" ")) == len(second.split(" ")) == 40
    lead, rest = view(document, "lead", rng, window_words=40)
    words = text.split()
    assert lead.split() == words[:LEAD_WORDS] and rest.split() == words[LEAD_WORDS : LEAD_WORDS + 40]
    snippet, around = view(document, "snippet", random.Random(1), window_words=40)
    passage, around_passage = view(document, "part", random.Random(1), window_words=40)  # the same draw
    assert snippet.split() == passage.split()[:LEAD_WORDS] and around == around_passage
    summary, opening = view(document, "summary", rng, window_words=40)
    assert summary == "a page of numbered words" and opening.split() == text.split()[:40]
    assert view(RetrievalDocument(text), "summary", rng, 40) is None  # no summary, no such view
    assert view(RetrievalDocument("too short"), "lead", rng, 40) is None
    with pytest.raises(ValueError, match="unknown view kind"):
        view(document, "title", rng, 40)


def test_examples_are_seeded_of_distinct_kinds_per_document_and_keep_their_group():
    documents = _documents()
    first = make_examples(documents, per_document=2, window_words=20, seed=3)
    assert first == make_examples(documents, per_document=2, window_words=20, seed=3)
    assert first != make_examples(documents, per_document=2, window_words=20, seed=4)
    for index in range(len(documents)):
        kinds = [e.kind for e in first if e.document == index]
        assert len(kinds) == 2 and len(set(kinds)) == 2
    assert all(e.group == documents[e.document].group for e in first)
    assert {e.kind for e in first} <= set(DEFAULT_KINDS)  # snippet only when asked for: the shipped recipe
    only = make_examples(documents, kinds=("summary",), per_document=3, window_words=20)
    assert len(only) == len(documents) and {e.kind for e in only} == {"summary"}


def test_a_mined_negative_is_a_high_bm25_window_of_another_document():
    # the query's words occur in its own window and in exactly one other document's window
    examples = [
        RetrievalExample("kernel module signing", "signing a kernel module with keys", 0, "g", "part"),
        RetrievalExample("bake bread", "flour water yeast bread oven", 1, "g", "part"),
        RetrievalExample("kernel signing keys", "module signing keys for the kernel", 2, "g", "part"),
        RetrievalExample("river fish", "salmon trout river", 3, "g", "part"),
    ]
    mined = mine_negatives(examples, seed=0, depth=1)
    assert mined[0].negative == examples[2].positive and mined[2].negative == examples[0].positive
    assert all(m.negative != m.positive for m in mined)
    lone = mine_negatives([RetrievalExample("q", "p", 0, "g", "part")], depth=3)
    assert lone[0].negative is None  # nothing but its own document's window


def test_loss_with_negatives_scores_them_against_every_query():
    torch.manual_seed(0)
    queries = torch.randn(4, 8)
    positives = queries + 0.1 * torch.randn(4, 8)
    loss = InBatchContrastiveLoss(scale=20.0)
    plain = loss(queries, positives)
    far = loss(queries, positives, -queries)  # negatives far from every query: nearly no change
    near = loss(queries, positives, queries[[1, 2, 3, 0]])  # each query's neighbour's exact copy
    assert far["loss"] == pytest.approx(float(plain["loss"]), abs=1e-3)
    assert near["loss"] > plain["loss"] + 0.2
    copies = loss(queries, positives, queries.clone())  # a negative equal to the query outranks the positive
    assert copies["pair_acc"] == 0.0
    with pytest.raises(ValueError, match="negatives"):
        loss(queries, positives, torch.randn(4, 5))


def test_read_documents_takes_group_from_the_id_and_refuses_a_bad_record(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"id": "man1/ls", "text": "list files"}, {"text": "x", "group": "g", "summary": "s"}]
    rows.append({"text": " "})  # an empty document is skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    documents = read_documents(str(path))
    assert [(d.group, d.summary) for d in documents] == [("man1", None), ("g", "s")]
    path.write_text(json.dumps({"text": "x", "summary": 3}) + "\n")
    with pytest.raises(Exception, match=r"docs\.jsonl:1: needs a string 'text'"):
        read_documents(str(path))


def _corpus(path, count: int, seed: int) -> None:
    rows = [
        {"id": f"g{i % 2}/d{i}", "text": d.text, "summary": d.summary}
        for i, d in enumerate(_documents(count, seed))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_train_retriever_end_to_end_trains_the_top_layer_only(tiny_sbert_dir, tmp_path, capfd):
    from safetensors.torch import load_file

    import docembed

    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    _corpus(train, 16, 0)
    _corpus(val, 6, 1)
    out = tmp_path / "retriever"
    base = str(tiny_sbert_dir / "sentence_transformer")
    args = ["--seed", "0", "train-retriever", str(train), "--val", str(val), "-o", str(out), "--base", base]
    args += ["--train-layers", "1", "-b", "4", "--max-steps", "3", "--eval-every", "2", "--lr", "1e-3"]
    args += ["--passage-temperature", "0.05"]
    result = CliRunner().invoke(app, ["-q", *args])
    assert result.exit_code == 0, result.output
    logged = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    evals = [row["eval"] for row in logged if "eval" in row]
    assert len(evals) == 2 and all(0 < e["mrr"] <= 1 and "mrr/part" in e for e in evals)
    settings = json.loads((out / "retriever_training.json").read_text())
    assert settings["train_layers"] == 1 and settings["examples"] == 32

    before = load_file(str(tiny_sbert_dir / "sentence_transformer" / "model.safetensors"))
    after = load_file(str(out / "sentence_transformer" / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("encoder.layer.1.") for k in changed)  # the top of 2 layers

    model = docembed.load(str(out))
    assert model.encoder.config.output == "windows" and model.encoder.config.passage_temperature == 0.05
    vectors = model.encode(["rocket orbit launch", "hockey puck goal"])
    assert vectors.offsets.tolist() == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(vectors.vectors, axis=1), 1.0, atol=1e-5)

    # a --resume may change how the model is read (its passage temperature), not what trains (its base)
    resume = [*args[: args.index("--max-steps")], "--max-steps", "4", "--resume"]
    other_base = [a if a != base else base + "/" for a in resume]
    refused = invoke(capfd, "-q", *other_base)
    assert refused.code == 2 and "model_name_or_path:" in refused.err
    resumed = invoke(capfd, "-q", *resume, "--passage-temperature", "0.02")
    assert resumed.code == 0, resumed.err
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 4
    assert docembed.load(str(out)).encoder.config.passage_temperature == 0.02


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kinds", "part,title"], "--kinds"),
        (["--eval-every", "5"], "--val"),
        (["--eval-task", "stsb-dev"], "--val, not --eval-task"),
        (["--passage-temperature", "-1"], "passage_temperature is between 0"),
    ],
)
def test_train_retriever_refuses_before_a_model_loads(tmp_path, capfd, monkeypatch, extra, message):
    from docembed.models import sbert

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(sbert.SBertEncoder, "__init__", no_model)
    train = tmp_path / "train.jsonl"
    _corpus(train, 4, 0)
    result = invoke(capfd, "train-retriever", train, "-o", tmp_path / "m", *extra)
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1


def test_train_retriever_says_why_short_documents_give_no_examples(tiny_sbert_dir, tmp_path, capfd):
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps({"id": f"d{i}", "text": "a short text"}) + "\n" for i in range(4)))
    base = tiny_sbert_dir / "sentence_transformer"
    result = invoke(capfd, "train-retriever", short, "-o", tmp_path / "m", "--base", base)
    assert result.code == 2 and "4 documents gave 0 training examples" in result.err


def test_train_retriever_names_a_corpus_that_is_not_jsonl(tmp_path, capfd):
    bad = tmp_path / "train.jsonl"
    bad.write_text("not json\n")
    result = invoke(capfd, "train-retriever", bad, "-o", tmp_path / "m")
    assert result.code != 0 and "train.jsonl:1: malformed JSON" in result.err


def test_a_tuned_minilm_ships_as_an_overlay_of_its_changed_layers(tmp_path):
    """The zoo's `retriever`: the offline MiniLM rebuilt, plus the tensors training changed."""
    from safetensors.torch import load_file

    from docembed.errors import ModelNotFoundError
    from docembed.models import zoo
    from docembed.models.registry import load_model
    from docembed.models.sbert import SBertConfig, SBertEncoder
    from docembed.zoo import export as zoo_export

    try:
        tuned = SBertEncoder(SBertConfig(output="windows", passage_temperature=0.05))
    except Exception as error:  # the offline MiniLM package is missing
        raise pytest.skip.Exception(f"all-MiniLM-L6-v2 offline: {error}") from None
    assert SBertEncoder.offline_base(tuned.config.to_dict()) == "minilm"
    assert SBertEncoder.offline_base({"model_name_or_path": "/some/folder"}) is None
    with torch.no_grad():
        for parameter in tuned.model[0].auto_model.encoder.layer[5].parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    run = tmp_path / "run"
    tuned.save(run)
    try:
        zoo_export.export(run, "retriever", zoo_dir=tmp_path / "zoo")
    except ModelNotFoundError as error:
        pytest.skip(str(error))
    overlay = load_file(str(tmp_path / "zoo" / "retriever" / zoo.OVERLAY_NAME))
    assert overlay and all(".encoder.layer.5." in k for k in overlay)
    shipped, original = load_model(str(tmp_path / "zoo" / "retriever")), load_model(str(run))
    assert shipped.config.passage_temperature == 0.05
    texts = ["a window about disks " * 80, "short text"]
    a, b = shipped.encode(texts), original.encode(texts)
    assert a.offsets.tolist() == b.offsets.tolist()
    assert np.abs((a.vectors * b.vectors).sum(1) - 1).max() < 1e-4
