"""NUGGET: each of the paper's mechanisms, on tiny randomly initialised BERT2BERT / BART models."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from docembed.losses.nugget_reconstruction import NuggetReconstructionLoss
from docembed.models.nugget import (
    NuggetConfig,
    NuggetEncoder,
    cross_attention_bias,
    idf_table,
    load_tokenizer,
    nugget_counts,
    select_chunks,
    select_idf,
    select_top_k,
)
from docembed.models.nugget_generation import corpus_bleu
from docembed.models.offline import minilm_path
from docembed.types import MultiVectors

TEXTS = [
    "the cat sat on the mat , and the dog barked .",
    "a much longer document : it has several clauses , some commas ; and then it ends , finally .",
    "",
    "short one .",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(minilm_path())


def bert_configs(layers: int = 4, decoder_layers: int = 2, hidden: int = 32):
    from transformers import BertConfig

    common = dict(
        vocab_size=30522,
        hidden_size=hidden,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    encoder = BertConfig(num_hidden_layers=layers, **common)
    decoder = BertConfig(
        num_hidden_layers=decoder_layers, is_decoder=True, add_cross_attention=True, **common
    )
    return encoder.to_dict(), decoder.to_dict()


def tiny(tokenizer, seed: int = 0, **options) -> NuggetEncoder:
    torch.manual_seed(seed)
    encoder_config, decoder_config = bert_configs()
    values = dict(backbone="config", kind="bert", ratio=0.25, scorer_layer=2, max_length=64)
    values.update(options)
    config = NuggetConfig(encoder_config=encoder_config, decoder_config=decoder_config, **values)
    return NuggetEncoder(config, tokenizer=tokenizer)


def batch_of(encoder: NuggetEncoder, texts=TEXTS) -> dict[str, torch.Tensor]:
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    examples = tokenize_examples(encoder, list(texts), None, 64)
    recipe = NuggetRecipe(encoder, examples, "ae", noise=0.0, batch_size=len(examples))
    return next(iter(recipe.batches(0)))


# --- k = ceil(r n), text order --------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.25, 1 / 3, 1.0])
def test_k_is_ceil_of_ratio_times_tokens(ratio):
    lengths = [1, 2, 3, 9, 10, 20, 30, 64, 129]
    mask = torch.zeros((len(lengths), max(lengths)), dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    expected = [
        max(1, math.ceil(Fraction(str(ratio)) * n)) if ratio != 1 / 3 else math.ceil(n / 3) for n in lengths
    ]
    assert nugget_counts(mask, ratio).tolist() == expected


def test_encoded_documents_carry_ceil_r_n_nuggets_and_grow_with_length(tokenizer):
    encoder = tiny(tokenizer)
    for ratio in (0.1, 0.25):
        encoder.set_ratio(ratio)
        vectors = encoder.encode(TEXTS)
        lengths = [len(ids) for ids in encoder.tokenize(TEXTS)]  # special tokens count, padding does not
        assert vectors.counts.tolist() == [math.ceil(Fraction(str(ratio)) * n) for n in lengths]
    assert vectors.counts[1] > vectors.counts[0]  # the longer document keeps more nuggets


def test_nuggets_are_in_text_order():
    scores = torch.tensor([[0.0, 5.0, 1.0, 9.0, 7.0, 3.0], [9.0, 8.0, 7.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    indices, slots = select_top_k(scores, mask, 0.5)
    assert indices[0].tolist() == [1, 3, 4]  # top 3 by score are 3, 4, 1: returned in text order
    assert indices[1, :2].tolist() == [0, 1] and slots[1].tolist() == [True, True, False]


def test_encode_positions_increase_within_each_document(tokenizer):
    vectors = tiny(tokenizer, seed=3).encode(TEXTS)
    for i in range(len(TEXTS)):
        positions = vectors.positions[vectors.offsets[i] : vectors.offsets[i + 1]]
        assert np.all(np.diff(positions) > 0)


# --- residual connection: the scorer's only gradient ---------------------------------------------------


def scorer_grad_norm(encoder: NuggetEncoder, batch) -> float:
    model = encoder.model.train()
    model.zero_grad(set_to_none=True)
    NuggetReconstructionLoss(model)(batch)["loss"].backward()
    grads = [p.grad for p in model.scorer.parameters()]
    return sum(0.0 if g is None else float(g.norm()) for g in grads)


def test_scorer_learns_only_through_the_residual(tokenizer):
    raw = tiny(tokenizer, residual="raw")
    assert scorer_grad_norm(raw, batch_of(raw)) > 0
    cut = tiny(tokenizer, residual="none")  # same weights, no residual
    assert scorer_grad_norm(cut, batch_of(cut)) == 0


def test_straight_through_residual_gives_gradient_without_changing_the_loss(tokenizer):
    straight, cut = tiny(tokenizer, residual="straight-through"), tiny(tokenizer, residual="none")
    batch = batch_of(straight)
    straight.model.eval(), cut.model.eval()
    loss = [NuggetReconstructionLoss(e.model)(batch)["loss"] for e in (straight, cut)]
    assert torch.allclose(*loss)
    assert scorer_grad_norm(straight, batch) > 0


def test_residual_is_added_to_every_cross_attention_logit(tokenizer):
    encoder = tiny(tokenizer)
    batch = batch_of(encoder)
    model = encoder.model.eval()
    seen = []
    hooks = [
        layer.crossattention.self.register_forward_hook(
            lambda module, args, kwargs, output: seen.append(kwargs["attention_mask"]), with_kwargs=True
        )
        for layer in model.backbone.decoder.bert.encoder.layer
    ]
    out = model.encode_batch(batch["input_ids"], batch["attention_mask"])
    NuggetReconstructionLoss(model)(batch)
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(model.backbone.decoder.bert.encoder.layer)
    for mask in seen:
        assert torch.equal(mask[:, 0, 0][out.slots], out.scores[out.slots])


# --- frozen bottom, feedback -----------------------------------------------------------------------------


def test_training_changes_upper_layers_but_never_the_frozen_bottom(tokenizer, tmp_path):
    from docembed.training.loop import TrainConfig, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny(tokenizer)
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


def capture_layer_io(encoder: NuggetEncoder, batch):
    """(output of layer l-1, input of layer l) on one forward pass."""
    layers = encoder.model.backbone.layers
    scorer_layer = encoder.config.scorer_layer
    got = {}
    h1 = layers[scorer_layer - 1].register_forward_hook(
        lambda m, a, o: got.__setitem__("below", o[0] if isinstance(o, tuple) else o)
    )
    h2 = layers[scorer_layer].register_forward_pre_hook(lambda m, a: got.__setitem__("above", a[0]))
    out = encoder.model.eval().encode_batch(batch["input_ids"], batch["attention_mask"])
    h1.remove(), h2.remove()
    return got["below"], got["above"], out


def test_feedback_adds_type_embeddings_before_the_upper_layers(tokenizer):
    encoder = tiny(tokenizer)
    batch = batch_of(encoder)
    below, above, out = capture_layer_io(encoder, batch)
    types = torch.zeros_like(batch["input_ids"])
    for row in range(len(types)):
        types[row, out.indices[row][out.slots[row]]] = 1
    weights = encoder.model.type_embeddings.weight
    assert torch.allclose(above - below, weights[types], atol=1e-6)
    assert not torch.allclose(weights[0], weights[1])
    plain = tiny(tokenizer, feedback=False)
    below, above, _ = capture_layer_io(plain, batch)
    assert torch.equal(above, below)


# --- fp16 / bf16 safety ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padded_nugget_slots_stay_masked_and_finite(dtype):
    scores = torch.tensor([[-60000.0, 3.0, 2.0], [1.5, -2.0, 0.0]])
    slots = torch.tensor([[True, True, True], [True, False, False]])
    bias = cross_attention_bias(scores, slots, "raw", dtype, queries=2)
    assert bias.shape == (2, 1, 2, 3) and bias.dtype == dtype
    assert torch.isfinite(bias).all()
    logits = torch.full((2, 1, 2, 3), -30.0, dtype=dtype) + bias
    weights = torch.softmax(logits.float(), dim=-1)
    assert torch.isfinite(weights).all()
    assert torch.all(weights[1, :, :, 1:] == 0)
    assert torch.allclose(weights[1, :, :, 0], torch.ones(1, 2))


def test_bf16_forward_is_finite(tokenizer):
    encoder = tiny(tokenizer)
    batch = batch_of(encoder)
    model = encoder.model.to(torch.bfloat16).eval()
    assert torch.isfinite(NuggetReconstructionLoss(model)(batch)["loss"])


# --- encoder interface, files, ablations, decoding ------------------------------------------------------


def test_save_load_round_trip_through_the_registry(tokenizer, tmp_path):
    from docembed.models.registry import load_model

    encoder = tiny(tokenizer, seed=5)
    first = encoder.encode(TEXTS)
    encoder.save(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"))
    again = loaded.encode(TEXTS)
    assert isinstance(loaded, NuggetEncoder) and loaded.multi_vector
    assert np.allclose(first.vectors, again.vectors, atol=1e-5)
    assert np.array_equal(first.positions, again.positions)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["family"] == "nugget"


def test_chunk_selector_takes_the_last_punctuation_of_each_chunk():
    punctuation = torch.zeros(10, dtype=torch.bool)
    punctuation[7] = True
    ids = torch.tensor([[1, 7, 2, 7, 3, 4, 5, 6]])
    indices, slots = select_chunks(ids, torch.ones_like(ids), 0.25, punctuation)
    assert indices.tolist() == [[3, 7]]  # chunk [0, 4): last "7" at 3; chunk [4, 8): none, so its end


def test_chunk_selector_model_encodes(tokenizer):
    vectors = tiny(tokenizer, selector="chunk").encode(TEXTS)
    assert len(vectors) == len(TEXTS)


def test_greedy_beam_search_matches_decoding_without_cache(tokenizer):
    from docembed.models.nugget_generation import beam_search

    encoder = tiny(tokenizer, seed=7)
    model = encoder.model.eval()
    batch = batch_of(encoder, TEXTS[:2])
    with torch.no_grad():
        out = model.encode_batch(batch["input_ids"], batch["attention_mask"])
        searched = beam_search(model, out, beams=1, max_new_tokens=6)
        backbone = model.backbone
        for row in range(2):
            one = type(out)(
                out.nuggets[row : row + 1],
                out.indices[row : row + 1],
                out.slots[row : row + 1],
                out.scores[row : row + 1],
                None,
            )
            sequence = [backbone.start_id]
            for _ in range(6):
                ids = torch.tensor([sequence])
                logits, _ = backbone.decode(ids, one.nuggets, model.cross_mask(one, len(sequence)))
                token = int(logits[0, -1].argmax())
                if token == backbone.end_id:
                    break
                sequence.append(token)
            assert searched[row] == sequence[1:]


def test_reconstruct_returns_one_text_per_input(tokenizer):
    texts = tiny(tokenizer).reconstruct(TEXTS[:2], beams=3, max_length=16)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_bart_backbone_selects_and_learns_through_the_residual(tokenizer):
    from transformers import BartConfig

    torch.manual_seed(0)
    bart = BartConfig(
        vocab_size=30522,
        d_model=32,
        encoder_layers=3,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        decoder_start_token_id=102,
        dropout=0.0,
    )
    config = NuggetConfig(
        backbone="config",
        kind="bart",
        ratio=0.25,
        scorer_layer=1,
        encoder_config=bart.to_dict(),
        max_length=64,
    )
    encoder = NuggetEncoder(config, tokenizer=tokenizer)
    vectors = encoder.encode(TEXTS)
    lengths = [len(ids) for ids in encoder.tokenize(TEXTS)]
    assert vectors.counts.tolist() == [math.ceil(n / 4) for n in lengths]
    assert scorer_grad_norm(encoder, batch_of(encoder)) > 0


# --- BLEU -----------------------------------------------------------------------------------------------


def test_corpus_bleu_by_hand():
    reference = "the cat sat on the mat"
    assert corpus_bleu([reference], [reference])["bleu"] == pytest.approx(100.0)
    hypothesis = "the cat sat on a mat"
    # clipped precisions: 1-grams 5/6, 2-grams 3/5, 3-grams 2/4, 4-grams 1/3; same length, so no penalty
    result = corpus_bleu([hypothesis], [reference])
    assert result["precisions"] == pytest.approx([500 / 6, 60.0, 50.0, 100 / 3])
    assert result["bleu"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    assert corpus_bleu(["x y"], [reference])["bleu"] == 0.0  # no 4-gram match at all
    # two sentences pooled: 1-grams 9/9, 2-grams 7/7, 3-grams 5/5, 4-grams 3/3; c=9 < r=11 -> BP e^(1-11/9)
    pooled = corpus_bleu(["a b c d e", "f g h i"], ["a b c d e x", "f g h i y"])
    assert pooled["bleu"] == pytest.approx(100 * math.exp(1 - 11 / 9))
    assert corpus_bleu(["a , b"], ["a , b"])["hyp_len"] == 3  # tokenised already: no re-tokenisation


# --- CLI ------------------------------------------------------------------------------------------------


def _save_tiny_bert(tokenizer, directory):
    """A 3-layer tiny BERT with the MiniLM tokenizer, saved as a `--backbone` folder."""
    from transformers import BertConfig, BertModel

    encoder_config, _ = bert_configs(layers=3)
    torch.manual_seed(0)
    BertModel(BertConfig.from_dict(encoder_config)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def test_cli_train_nugget_then_encode_and_inspect(tokenizer, tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    _save_tiny_bert(tokenizer, tmp_path / "tiny-bert")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(t or "empty" for t in TEXTS * 3) + "\n")
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "-q",
            "train-nugget",
            str(corpus),
            "-o",
            str(tmp_path / "model"),
            "--backbone",
            str(tmp_path / "tiny-bert"),
            "--kind",
            "bert",
            "--scorer-layer",
            "1",
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--max-length",
            "24",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model" / "train_summary.json").exists()
    result = runner.invoke(
        app,
        [
            "-q",
            "encode",
            str(corpus),
            "-m",
            str(tmp_path / "model"),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--ratio",
            "0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(TEXTS) * 3 and all(len(r["positions"]) == len(r["vectors"]) for r in rows)
    result = runner.invoke(
        app,
        [
            "-q",
            "inspect",
            str(corpus),
            "-m",
            str(tmp_path / "model"),
            "--show",
            "1",
            "--bleu",
            "2",
            "--bleu-max-length",
            "12",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "chosen when seen" in result.output and '"bleu"' in result.output


def test_token_words_join_word_pieces_and_keep_punctuation(tokenizer):
    from docembed.models.nugget_generation import token_words

    ids = tokenizer("Beggin , he said .")["input_ids"]
    assert len(ids) == 8  # [CLS] beg ##gin , he said . [SEP]: pieces to join
    assert token_words(tokenizer, ids) == ["beggin", ",", "he", "said", "."]


def test_train_nugget_under_torchrun_two_ranks(tokenizer, tmp_path):
    from cli_helpers import torchrun
    from docembed.models.registry import load_model

    _save_tiny_bert(tokenizer, tmp_path / "tiny-bert")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(t or "empty" for t in TEXTS * 4) + "\n")
    out = tmp_path / "model"
    args = ["-q", "train-nugget", corpus, "-o", out, "--backbone", tmp_path / "tiny-bert", "--kind", "bert"]
    args += ["--scorer-layer", "1", "--batch-size", "2", "--max-length", "24", "--log-every", "1"]
    proc = torchrun(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4  # 8 global batches of 2, 2 per step
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 4  # rank 0 alone writes the log
    assert load_model(str(out)).encode(["the cat sat ."]).counts.tolist() == [1]


# --- IDF selector and prior ------------------------------------------------------------------------------


def test_idf_table_by_hand():
    table = idf_table([[1, 2, 2], [1, 3]], vocab_size=5)
    # N = 2: df(1) = 2, df(2) = df(3) = 1, df(0) = df(4) = 0; idf = ln((1 + N) / (1 + df)) + 1
    expected = [math.log(3) + 1, 1.0, math.log(1.5) + 1, math.log(1.5) + 1, math.log(3) + 1]
    assert table.tolist() == pytest.approx(expected)


def test_idf_selector_keeps_the_highest_idf_tokens_in_text_order():
    idf = torch.tensor([0.0, 1.0, 5.0, 3.0, 4.0, 2.0])
    ids = torch.tensor([[1, 4, 2, 3, 5, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    indices, slots = select_idf(ids, mask, 0.5, idf)  # k = 3 of 6: ids 2 (5.0), 4 (4.0), 3 (3.0)
    assert indices[0][slots[0]].tolist() == [1, 2, 3]
    tied = torch.tensor([[1, 1, 1, 1]])  # equal IDF: the earlier tokens win
    assert select_idf(tied, torch.ones_like(tied), 0.5, idf)[0].tolist() == [[0, 1]]


def test_idf_selector_model_needs_a_table_and_saves_it(tokenizer, tmp_path):
    from docembed.errors import DocembedError
    from docembed.models.registry import load_model

    encoder = tiny(tokenizer, selector="idf")
    with pytest.raises(DocembedError, match="IDF table"):
        encoder.encode(TEXTS)
    encoder.fit_idf(TEXTS)
    vectors = encoder.encode(TEXTS)
    ids = encoder.tokenize(TEXTS)
    table = idf_table(ids, tokenizer.vocab_size)
    for i, row in enumerate(ids):
        chosen = vectors.positions[vectors.offsets[i] : vectors.offsets[i + 1]]
        k = len(chosen)
        values = table[torch.tensor(row)]
        assert values[chosen].min() >= values.sort(descending=True).values[k - 1]  # the k highest
    encoder.save(tmp_path / "m")
    again = load_model(str(tmp_path / "m")).encode(TEXTS)
    assert np.array_equal(again.positions, vectors.positions)


def test_idf_prior_is_added_to_the_scorer_score(tokenizer):
    plain, prior = tiny(tokenizer), tiny(tokenizer, idf_prior=2.0)
    prior.fit_idf(TEXTS)
    batch = batch_of(plain)
    idf = prior.model.idf[batch["input_ids"]]
    # untrained, the learned part is zero: the model selects exactly what the IDF rule selects
    start = prior.model.eval()(batch["input_ids"], batch["attention_mask"])
    assert torch.allclose(start.all_scores, 2.0 * idf, atol=1e-6)
    prior.model.scorer.load_state_dict(plain.model.scorer.state_dict())
    a = plain.model.eval()(batch["input_ids"], batch["attention_mask"])
    b = prior.model.eval()(batch["input_ids"], batch["attention_mask"])
    assert torch.allclose(b.all_scores, a.all_scores + 2.0 * idf, atol=1e-6)


def test_models_saved_before_the_new_options_still_load(tokenizer, tmp_path):
    from docembed.models.registry import load_model

    encoder = tiny(tokenizer, seed=2)
    encoder.save(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    payload = json.loads(path.read_text())
    for key in ("freeze", "idf_prior"):  # fields older models do not have
        del payload["config"][key]
    path.write_text(json.dumps(payload))
    loaded = load_model(str(tmp_path / "m"))
    assert loaded.config.freeze == "bottom" and loaded.config.idf_prior == 0.0
    assert np.allclose(loaded.encode(TEXTS).vectors, encoder.encode(TEXTS).vectors, atol=1e-5)


# --- freezing options -----------------------------------------------------------------------------------


def _train_steps(encoder, tmp_path, objective="ae", steps=2, **options):
    from docembed.training.loop import TrainConfig, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    targets = None if objective == "ae" else [t[::-1] or "x" for t in TEXTS * 2]
    examples = tokenize_examples(encoder, TEXTS * 2, targets, 32)
    recipe = NuggetRecipe(encoder, examples, objective, noise=0.0, batch_size=3, **options)
    train(recipe, TrainConfig(output_dir=str(tmp_path / "run"), max_steps=steps, lr=1e-2, device="cpu"))
    return recipe


def test_freeze_encoder_trains_only_scorer_value_and_types(tokenizer, tmp_path):
    encoder = tiny(tokenizer, freeze="encoder")
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    _train_steps(encoder, tmp_path)
    after = encoder.model.state_dict()
    for key in before:
        if key.startswith("backbone.encoder."):
            assert torch.equal(before[key], after[key]), key
    for key in ("scorer.0.weight", "value.weight", "type_embeddings.weight"):
        assert not torch.equal(before[key], after[key]), key


def test_freeze_encoder_and_value_trains_only_the_selection(tokenizer, tmp_path):
    encoder = tiny(tokenizer, freeze="encoder+value", feedback=False)
    assert encoder.model.cacheable  # W_V frozen too: token states can still be computed once
    before = {k: v.clone() for k, v in encoder.model.state_dict().items()}
    _train_steps(encoder, tmp_path, objective="sim")
    after = encoder.model.state_dict()
    assert torch.equal(after["value.weight"], torch.eye(after["value.weight"].shape[0]))
    for key in before:
        if key.startswith("backbone.encoder.") or key == "value.weight":
            assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before["scorer.0.weight"], after["scorer.0.weight"])


def test_anchor_penalty_keeps_upper_layers_near_the_warm_start(tokenizer, tmp_path):
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
        encoder = tiny(tokenizer)
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
def test_sim_objective_reaches_the_scorer_only_through_the_residual(tokenizer, residual, learns):
    encoder = tiny(tokenizer, residual=residual)
    recipe, batch = sim_batch(encoder)
    model = encoder.model.train()
    model.zero_grad(set_to_none=True)
    terms = recipe.module(batch)
    terms["loss"].backward()
    grads = [p.grad for p in model.scorer.parameters()]
    norm = sum(0.0 if g is None else float(g.norm()) for g in grads)
    assert (norm > 0) == learns
    assert model.value.weight.grad is not None and float(model.value.weight.grad.norm()) > 0


def test_sim_objective_soft_maxsim_tends_to_mean_maxsim(tokenizer):
    from docembed.losses.nugget_similarity import NuggetSimilarityLoss
    from docembed.scoring import maxsim_one_to_many

    encoder = tiny(tokenizer, residual="none")
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


def test_sim_objective_on_cached_states_matches_the_full_forward(tokenizer):
    encoder = tiny(tokenizer, freeze="encoder", feedback=False)
    assert encoder.model.cacheable and not tiny(tokenizer, freeze="encoder").model.cacheable
    recipe, batch = sim_batch(encoder)
    assert "bottom" in batch and "other_top" in batch  # states computed once, reused every epoch
    encoder.model.eval()
    cached = recipe.module(batch)["loss"]
    plain = {k: v for k, v in batch.items() if not k.endswith(("bottom", "top"))}
    assert torch.allclose(cached, recipe.module(plain)["loss"], atol=1e-2)  # states kept in bf16


def test_sim_pairs_are_counted_once_in_either_direction(tokenizer):
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny(tokenizer)
    examples = tokenize_examples(encoder, ["a b c .", "d e f ."], ["d e f .", "a b c ."], 32)
    assert len(NuggetRecipe(encoder, examples, "sim", batch_size=2).examples) == 1
    assert len(NuggetRecipe(encoder, examples, "mt", batch_size=2).examples) == 2


def test_cli_train_nugget_sim_with_frozen_encoder_and_idf_prior(tokenizer, tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app
    from docembed.models.registry import load_model

    _save_tiny_bert(tokenizer, tmp_path / "tiny-bert")
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"source": t, "target": t.upper() + " ok"} for t in TEXTS if t]
    pairs.write_text("\n".join(json.dumps(r) for r in rows * 2) + "\n")
    args = ["-q", "train-nugget", str(pairs), "-o", str(tmp_path / "model"), "--objective", "sim"]
    args += ["--backbone", str(tmp_path / "tiny-bert"), "--kind", "bert", "--scorer-layer", "1"]
    args += ["--freeze", "encoder", "--no-feedback", "--idf-prior", "1", "--max-steps", "2", "-b", "3"]
    args += ["--max-length", "24", "--decoder-layers", "1", "--ratio", "0.25", "--train-ratio", "0.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    model = load_model(str(tmp_path / "model"))
    assert model.config.idf_prior == 1.0 and model.config.max_length == 24
    assert model.config.ratio == 0.25  # trained selecting at 0.5, it encodes at --ratio
    assert float(model.model.idf.max()) > 1.0  # the table was fitted on the training text and saved


def test_hard_negatives_join_the_batch_and_the_loss(tokenizer):
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    encoder = tiny(tokenizer, residual="raw")
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
def test_train_ratio_widens_what_the_residual_reaches_while_training_only(tokenizer, train_ratio):
    encoder = tiny(tokenizer, ratio=0.25, residual="raw")
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


def test_train_ratio_outside_zero_to_one_is_refused(tokenizer):
    from docembed.errors import UsageError

    with pytest.raises(UsageError, match="train-ratio"):
        sim_batch(tiny(tokenizer), {"train_ratio": 0.0})


def test_cli_train_nugget_refuses_negatives_that_are_not_texts(tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "a b c d", "target": "d c b a", "negatives": "x y z"}) + "\n")
    result = CliRunner().invoke(
        app, ["train-nugget", str(pairs), "-o", str(tmp_path / "m"), "--objective", "sim"]
    )
    assert result.exit_code == 1 and "'negatives' must be a list of texts" in str(result.exception)
