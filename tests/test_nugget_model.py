"""NUGGET's model, on tiny randomly initialised BERT2BERT / BART models (tiny_models.tiny_nugget, built
fresh per test: most tests change it): k = ceil(r n) in text order, the residual, feedback, fp16/bf16,
save/load, the selectors (chunk, IDF) and the IDF prior, decoding and BLEU."""

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
    nugget_counts,
    select_chunks,
    select_idf,
    select_top_k,
)
from docembed.models.nugget_generation import corpus_bleu
from nugget_helpers import TEXTS, batch_of
from tiny_models import tiny_nugget

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


def test_encoded_documents_carry_ceil_r_n_nuggets_and_grow_with_length(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer)
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


def test_encode_positions_increase_within_each_document(minilm_tokenizer):
    vectors = tiny_nugget(minilm_tokenizer, seed=3).encode(TEXTS)
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


def test_scorer_learns_only_through_the_residual(minilm_tokenizer):
    raw = tiny_nugget(minilm_tokenizer, residual="raw")
    assert scorer_grad_norm(raw, batch_of(raw)) > 0
    cut = tiny_nugget(minilm_tokenizer, residual="none")  # same weights, no residual
    assert scorer_grad_norm(cut, batch_of(cut)) == 0


def test_straight_through_residual_gives_gradient_without_changing_the_loss(minilm_tokenizer):
    straight = tiny_nugget(minilm_tokenizer, residual="straight-through")
    cut = tiny_nugget(minilm_tokenizer, residual="none")
    batch = batch_of(straight)
    straight.model.eval(), cut.model.eval()
    loss = [NuggetReconstructionLoss(e.model)(batch)["loss"] for e in (straight, cut)]
    assert torch.allclose(*loss)
    assert scorer_grad_norm(straight, batch) > 0


def test_residual_is_added_to_every_cross_attention_logit(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer)
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


def test_feedback_adds_type_embeddings_before_the_upper_layers(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer)
    batch = batch_of(encoder)
    below, above, out = capture_layer_io(encoder, batch)
    types = torch.zeros_like(batch["input_ids"])
    for row in range(len(types)):
        types[row, out.indices[row][out.slots[row]]] = 1
    weights = encoder.model.type_embeddings.weight
    assert torch.allclose(above - below, weights[types], atol=1e-6)
    assert not torch.allclose(weights[0], weights[1])
    plain = tiny_nugget(minilm_tokenizer, feedback=False)
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


def test_bf16_forward_is_finite(minilm_tokenizer):
    encoder = tiny_nugget(minilm_tokenizer)
    batch = batch_of(encoder)
    model = encoder.model.to(torch.bfloat16).eval()
    assert torch.isfinite(NuggetReconstructionLoss(model)(batch)["loss"])


# --- encoder interface, files, ablations, decoding ------------------------------------------------------


def test_save_load_round_trip_through_the_registry(minilm_tokenizer, tmp_path):
    from docembed.models.registry import load_model

    encoder = tiny_nugget(minilm_tokenizer, seed=5)
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


def test_chunk_selector_model_encodes(minilm_tokenizer):
    vectors = tiny_nugget(minilm_tokenizer, selector="chunk").encode(TEXTS)
    assert len(vectors) == len(TEXTS)


def test_greedy_beam_search_matches_decoding_without_cache(minilm_tokenizer):
    from docembed.models.nugget_generation import beam_search

    encoder = tiny_nugget(minilm_tokenizer, seed=7)
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


def test_reconstruct_returns_one_text_per_input(minilm_tokenizer):
    texts = tiny_nugget(minilm_tokenizer).reconstruct(TEXTS[:2], beams=3, max_length=16)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_bart_backbone_selects_and_learns_through_the_residual(minilm_tokenizer):
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
    encoder = NuggetEncoder(config, tokenizer=minilm_tokenizer)
    vectors = encoder.encode(TEXTS)
    lengths = [len(ids) for ids in encoder.tokenize(TEXTS)]
    assert vectors.counts.tolist() == [math.ceil(n / 4) for n in lengths]
    assert scorer_grad_norm(encoder, batch_of(encoder)) > 0


# --- BLEU and the words it scores ---------------------------------------------------------------------


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


def test_token_words_join_word_pieces_and_keep_punctuation(minilm_tokenizer):
    from docembed.models.nugget_generation import token_words

    ids = minilm_tokenizer("Beggin , he said .")["input_ids"]
    assert len(ids) == 8  # [CLS] beg ##gin , he said . [SEP]: pieces to join
    assert token_words(minilm_tokenizer, ids) == ["beggin", ",", "he", "said", "."]


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


def test_idf_selector_model_needs_a_table_and_saves_it(minilm_tokenizer, tmp_path):
    from docembed.errors import DocembedError
    from docembed.models.registry import load_model

    encoder = tiny_nugget(minilm_tokenizer, selector="idf")
    with pytest.raises(DocembedError, match="IDF table"):
        encoder.encode(TEXTS)
    encoder.fit_idf(TEXTS)
    vectors = encoder.encode(TEXTS)
    ids = encoder.tokenize(TEXTS)
    table = idf_table(ids, minilm_tokenizer.vocab_size)
    for i, row in enumerate(ids):
        chosen = vectors.positions[vectors.offsets[i] : vectors.offsets[i + 1]]
        k = len(chosen)
        values = table[torch.tensor(row)]
        assert values[chosen].min() >= values.sort(descending=True).values[k - 1]  # the k highest
    encoder.save(tmp_path / "m")
    again = load_model(str(tmp_path / "m")).encode(TEXTS)
    assert np.array_equal(again.positions, vectors.positions)


def test_idf_prior_is_added_to_the_scorer_score(minilm_tokenizer):
    plain, prior = tiny_nugget(minilm_tokenizer), tiny_nugget(minilm_tokenizer, idf_prior=2.0)
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


def test_models_saved_before_the_new_options_still_load(minilm_tokenizer, tmp_path):
    from docembed.models.registry import load_model

    encoder = tiny_nugget(minilm_tokenizer, seed=2)
    encoder.save(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    payload = json.loads(path.read_text())
    for key in ("freeze", "idf_prior"):  # fields older models do not have
        del payload["config"][key]
    path.write_text(json.dumps(payload))
    loaded = load_model(str(tmp_path / "m"))
    assert loaded.config.freeze == "bottom" and loaded.config.idf_prior == 0.0
    assert np.allclose(loaded.encode(TEXTS).vectors, encoder.encode(TEXTS).vectors, atol=1e-5)


# --- the rules NUGGET is measured against: static pruning, token pooling, a cap ----------------------------


def test_pruning_drops_the_most_frequent_vocabulary_entries_everywhere():
    from docembed.models.nugget import select_unfrequent

    idf = torch.tensor([0.5, 1.0, 5.0, 3.0, 4.0, 2.0])  # entries 0 and 1 are the two most frequent
    ids = torch.tensor([[1, 4, 2, 1, 5, 3], [1, 0, 1, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    indices, slots = select_unfrequent(ids, mask, idf, frequent=2)
    assert indices[0][slots[0]].tolist() == [1, 2, 4, 5]  # k varies: every token but ids 0 and 1
    assert indices[1][slots[1]].tolist() == [0]  # nothing left: the token of highest IDF stays
    capped, capped_slots = select_unfrequent(ids, mask, idf, frequent=2, cap=2)
    assert capped[0][capped_slots[0]].tolist() == [1, 2]  # the two of highest IDF, in text order


def test_hierarchical_pooling_averages_clusters_in_text_order():
    from docembed.models.nugget import pool_hierarchical

    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    states = torch.stack([b, a, a * 2, b * 3, a])[None]  # two directions: tokens {1, 2, 4} and {0, 3}
    mask = torch.ones((1, 5), dtype=torch.long)
    means, positions, slots = pool_hierarchical(states, mask, torch.tensor([2]))
    assert positions[0].tolist() == [0, 1] and slots[0].tolist() == [True, True]
    assert torch.allclose(means[0], torch.stack([b, a]))  # means of the unit vectors of each cluster
    same, _, _ = pool_hierarchical(states, mask, torch.tensor([5]))  # k = n: every token, unchanged
    assert torch.allclose(same[0], torch.nn.functional.normalize(states[0], dim=-1))


@pytest.mark.parametrize("selector", ["idf", "prune", "pool", "chunk", "scorer"])
def test_every_selector_encodes_through_the_model_and_caps(minilm_tokenizer, selector):
    encoder = tiny_nugget(minilm_tokenizer, selector=selector, feedback=selector != "pool", idf_prior=1.0)
    encoder.fit_idf(TEXTS)
    vectors = encoder.encode(TEXTS)
    n = [len(ids) for ids in encoder.tokenize(TEXTS)]
    counts = np.diff(vectors.offsets)
    if selector != "prune":
        assert counts.tolist() == [math.ceil(0.25 * length - 1e-9) for length in n]
    assert np.isfinite(vectors.vectors).all()
    assert np.allclose(np.linalg.norm(vectors.vectors, axis=1), 1.0, atol=1e-5)
    encoder.set_ratio(1.0)
    encoder.set_selection(max_nuggets=3)
    assert np.diff(encoder.encode(TEXTS).offsets).max() <= 3
    encoder.set_selection(max_nuggets=None)
    if selector != "prune":
        assert np.diff(encoder.encode(TEXTS).offsets).tolist() == n


def test_selection_needs_an_idf_table_and_pooling_no_feedback(minilm_tokenizer):
    from docembed.errors import UsageError

    plain = tiny_nugget(minilm_tokenizer)  # trained scorer, no IDF table
    with pytest.raises(UsageError, match="IDF table"):
        plain.set_selection("prune")
    with pytest.raises(UsageError, match="feedback"):
        plain.set_selection("pool")
    with pytest.raises(UsageError, match="max_nuggets"):
        plain.set_selection(max_nuggets=0)


def test_shared_token_states_give_what_encode_gives_for_every_selection_and_windows(minilm_tokenizer):
    encoder = tiny_nugget(
        minilm_tokenizer, freeze="encoder+value", feedback=False, idf_prior=1.0, max_length=16
    )
    encoder.fit_idf(TEXTS)
    long_texts = [*TEXTS, " ".join(TEXTS * 4)]  # the last one spans several 16-token windows
    states: dict = {}
    windows = []
    for selector, aggregate in (("scorer", "none"), ("idf", "none"), ("pool", "none"), ("prune", "assign")):
        encoder.set_selection(selector, aggregate=aggregate)
        direct = encoder.encode(long_texts)
        with encoder.sharing_states(states):
            shared = encoder.encode(long_texts)
        windows.append(len(states))
        assert np.array_equal(direct.offsets, shared.offsets)
        assert np.array_equal(direct.positions, shared.positions)
        assert np.allclose(direct.vectors, shared.vectors, atol=1e-5)
    # one entry per distinct window, computed by the first model only; the long text has several
    assert windows == [windows[0]] * 4 and windows[0] > len(long_texts)


def test_assign_makes_each_nugget_the_mean_of_the_tokens_nearest_it():
    from docembed.models.nugget import assign_to_nuggets

    a, b, c = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.6, 0.8])
    states = torch.stack([a, b * 2, c, a * 3, b])[None]  # padding: the last token
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    seeds = torch.stack([a, b])[None]  # nuggets at tokens 0 and 1
    slots = torch.tensor([[True, True]])
    means = assign_to_nuggets(states, mask, seeds, slots)
    # a joins {0, 3}; b joins {1, 2} (c is nearer b: 0.8 > 0.6); the padded b is nobody's member
    assert torch.allclose(means[0], torch.stack([a, (b + c) / 2]))
    half = assign_to_nuggets(states, mask, seeds, slots, weight=0.5)
    assert torch.allclose(half[0], torch.stack([a, 0.5 * b + 0.25 * (b + c)]))
    assert torch.allclose(assign_to_nuggets(states, mask, seeds, slots, weight=0.0), seeds)
