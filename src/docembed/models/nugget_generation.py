"""Decoding from nuggets alone: beam search, and the reconstruction probe scored with sacreBLEU."""

from __future__ import annotations

from collections.abc import Sequence

import torch


@torch.no_grad()
def beam_search(model, out, beams: int, max_new_tokens: int) -> list[list[int]]:
    backbone = model.backbone
    b = out.nuggets.shape[0]
    nuggets = out.nuggets.repeat_interleave(beams, dim=0)
    expanded = type(out)(
        nuggets,
        out.indices,
        out.slots.repeat_interleave(beams, 0),
        out.scores.repeat_interleave(beams, 0),
        None,
    )
    cross = model.cross_mask(expanded, 1)
    device = nuggets.device
    sequences = torch.full((b * beams, 1), backbone.start_id, dtype=torch.long, device=device)
    scores = torch.full((b, beams), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    past = None
    for _ in range(max_new_tokens):
        logits, past = backbone.decode(sequences[:, -1:], nuggets, cross, past, use_cache=True)
        logp = torch.log_softmax(logits[:, -1].float(), dim=-1)
        vocab = logp.shape[-1]
        total = (scores[:, :, None] + logp.view(b, beams, vocab)).view(b, -1)
        top_scores, top_ids = total.topk(2 * beams, dim=1)
        next_rows, next_tokens, next_scores = [], [], []
        for row in range(b):
            picked = 0
            for score, flat in zip(top_scores[row].tolist(), top_ids[row].tolist(), strict=True):
                beam, token = divmod(flat, vocab)
                source = row * beams + beam
                if token == backbone.end_id:
                    if not done[row] and score > float("-inf"):
                        finished[row].append((score, sequences[source, 1:].tolist()))
                    continue
                if picked < beams:
                    next_rows.append(source)
                    next_tokens.append(token)
                    next_scores.append(score)
                    picked += 1
            if len(finished[row]) >= beams:
                done[row] = True
        if all(done):
            break
        beam_index = torch.tensor(next_rows, device=device)
        past.reorder_cache(beam_index)
        sequences = torch.cat(
            [sequences[beam_index], torch.tensor(next_tokens, device=device)[:, None]], dim=1
        )
        scores = torch.tensor(next_scores, device=device).view(b, beams)
    results = []
    for row in range(b):
        if finished[row]:
            results.append(max(finished[row], key=lambda item: item[0])[1])
        else:
            best = int(scores[row].argmax())
            results.append(sequences[row * beams + best, 1:].tolist())
    return results


def token_words(tokenizer, ids: Sequence[int]) -> list[str]:
    """Words of a token id sequence: sub-word pieces joined ("##" continuations for WordPiece, a leading
    "Ġ"/"▁" starting a word for BPE/SentencePiece), special tokens dropped, punctuation kept separate
    (no detokenisation cleanup), so BLEU counts the same units in hypotheses and references."""
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens([i for i in ids if i not in special])
    marked = any(p.startswith(("Ġ", "▁")) for p in pieces)
    words: list[str] = []
    for piece in pieces:
        if piece.startswith("##") and words:
            words[-1] += piece[2:]
        elif marked and not piece.startswith(("Ġ", "▁")) and words:
            words[-1] += piece
        else:
            words.append(piece.lstrip("Ġ▁"))
    return [w for w in words if w]


def reconstruction_bleu(encoder, texts: Sequence[str], beams: int = 5, max_length: int = 128) -> dict:
    """Decode each text from its nuggets (beam search) and score corpus BLEU-4 (sacreBLEU) against the
    text as the model saw it (cut to `max_length` tokens), both as space-joined `token_words`; sacreBLEU's
    own tokeniser is off so both sides are counted in the same units."""
    ids, outputs = encoder.reconstruct_ids(texts, beams=beams, max_length=max_length)
    references = [" ".join(token_words(encoder.tokenizer, i)) for i in ids]
    hypotheses = [" ".join(token_words(encoder.tokenizer, o)) for o in outputs]
    return corpus_bleu(hypotheses, references)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU corpus BLEU-4, one reference per hypothesis, texts already tokenised (split on spaces)."""
    from sacrebleu.metrics import BLEU

    score = BLEU(tokenize="none").corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": score.score,
        "precisions": list(score.precisions),
        "brevity_penalty": score.bp,
        "hyp_len": score.sys_len,
        "ref_len": score.ref_len,
    }
