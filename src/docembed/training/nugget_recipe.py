"""Training NUGGET (models/nugget.py) through the shared loop.

Objectives (losses/nugget_*.py):
- `ae` (autoencoding): the decoder reconstructs the document from its nuggets; the encoder sees it with
  random token deletion (each non-special token dropped with probability `noise`).
- `mt`: the decoder produces the other text of a JSON Lines pair (a translation, a paraphrase).
- `sim`: the two texts of a pair are paraphrases: a soft mean-MaxSim between their nuggets, with the
  batch's other documents as negatives (each unordered pair counted once), plus the pair's own hard
  negatives when the data gives them (PI train's other candidates).

Both sides are cut to `max_length` tokens. Batches are shuffled with seed + epoch, so every rank sees the
same global sequence (the loop's DDP contract); token deletion draws from a generator seeded by (seed,
epoch, batch index), so a resumed run deletes the same tokens. When the model's token states cannot change
(`NuggetModel.cacheable`: whole encoder frozen, no feedback), `sim` computes them once per document, so an
epoch costs only the scorer and W_V. `anchor_weight` adds an L2 pull of the trainable encoder weights
towards the warm start.

`train_ratio` selects more nuggets while training than the model keeps when it encodes (its `ratio`).
Top-k has no gradient, so the residual only ever reaches the selected tokens: trained at r = 0.1, the
scorer is never told that a token just below the cut should come in. Trained at 0.25, the residual covers
the tokens around the 0.1 cut too, and the scorer learns to order them (zoo/nugget/card.md measures it).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from docembed.errors import DocembedError, UsageError
from docembed.losses.nugget_anchor import NuggetAnchorPenalty
from docembed.losses.nugget_reconstruction import NuggetReconstructionLoss
from docembed.losses.nugget_similarity import NuggetSimilarityLoss
from docembed.models.nugget import NuggetEncoder
from docembed.tensors import pad_sequences
from docembed.training.loop import Recipe

OBJECTIVES = ("ae", "mt", "sim")


@dataclass
class Example:
    source: list[int]  # encoder input ids (special tokens included)
    target: list[int]  # decoder target ids / the paraphrase (special tokens included)
    negatives: list[list[int]] = field(default_factory=list)  # sim: documents that are not paraphrases


def tokenize_examples(
    encoder: NuggetEncoder,
    sources: list[str],
    targets: list[str] | None,
    max_length: int,
    negatives: list[list[str]] | None = None,
) -> list[Example]:
    source_ids = encoder.tokenize(sources, max_length)
    target_ids = source_ids if targets is None else encoder.tokenize(targets, max_length)
    negative_ids = [[] for _ in sources]
    flat = [text for row in negatives or [] for text in row]
    if flat:
        tokenized = iter(encoder.tokenize(flat, max_length))
        negative_ids = [[ids for ids in (next(tokenized) for _ in row) if len(ids) > 2] for row in negatives]
    return [
        Example(s, t, n)
        for s, t, n in zip(source_ids, target_ids, negative_ids, strict=True)
        if len(s) > 2 and len(t) > 2
    ]


def unordered_pairs(examples: list[Example]) -> list[Example]:
    """Each pair once: (a, b) and (b, a) are the same positive for a symmetric objective, and both in one
    batch would make each the other's false negative."""
    kept: dict[frozenset, Example] = {}
    for example in examples:
        key = frozenset((tuple(example.source), tuple(example.target)))
        if key not in kept:
            kept[key] = Example(example.source, example.target, list(example.negatives))
        else:  # the reversed direction's negatives are negatives of the same pair
            known = {tuple(n) for n in kept[key].negatives}
            kept[key].negatives += [n for n in example.negatives if tuple(n) not in known]
    return list(kept.values())


def delete_tokens(ids: list[int], rate: float, generator: random.Random) -> list[int]:
    """Drop each inner token with probability `rate`; the first and last (special) tokens stay, and at
    least one inner token survives."""
    if rate <= 0 or len(ids) <= 3:
        return ids
    inner = [t for t in ids[1:-1] if generator.random() >= rate]
    if not inner:
        inner = [ids[1 + generator.randrange(len(ids) - 2)]]
    return [ids[0], *inner, ids[-1]]


class NuggetObjective(nn.Module):
    """The recipe's module: one objective's loss, plus the anchor penalty when there is one; the model
    selects at `train_ratio` while the loss runs (None: at its own r)."""

    def __init__(
        self,
        loss: nn.Module,
        anchor: NuggetAnchorPenalty | None = None,
        train_ratio: float | None = None,
    ):
        super().__init__()
        self.loss, self.anchor, self.train_ratio = loss, anchor, train_ratio

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with self.loss.model.selecting_at(self.train_ratio):
            terms = self.loss(batch)
        if self.anchor is not None:
            terms["anchor"] = self.anchor()
            terms["loss"] = terms["loss"] + terms["anchor"]
        return terms


class NuggetRecipe(Recipe):
    unit = "tokens"  # encoder input tokens

    def __init__(
        self,
        encoder: NuggetEncoder,
        examples: list[Example],
        objective: str = "ae",
        noise: float = 0.1,
        batch_size: int = 16,
        seed: int = 0,
        anchor_weight: float = 0.0,
        attention_temperature: float = 0.05,
        temperature: float = 0.05,
        negatives_per_pair: int = 3,
        train_ratio: float | None = None,
    ):
        super().__init__()
        if objective not in OBJECTIVES:
            raise UsageError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        if train_ratio is not None and not 0 < train_ratio <= 1:
            raise UsageError(f"--train-ratio must be in (0, 1], got {train_ratio}")
        if objective == "sim":
            examples = unordered_pairs(examples)
        if not examples:
            raise DocembedError("no training examples (every document was empty?)")
        self.encoder = encoder
        model = encoder.model
        if objective == "sim":
            loss = NuggetSimilarityLoss(model, attention_temperature, temperature)
        else:
            loss = NuggetReconstructionLoss(model)
        anchored = [p for p in model.backbone.encoder_stack.parameters() if p.requires_grad]
        anchor = NuggetAnchorPenalty(anchored, anchor_weight) if anchor_weight > 0 and anchored else None
        self.module = NuggetObjective(loss, anchor, train_ratio)
        self.examples = examples
        self.objective = objective
        self.noise = noise if objective == "ae" else 0.0
        self.batch_size = batch_size
        self.seed = seed
        self.negatives_per_pair = negatives_per_pair
        self.states: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] | None = None

    def num_batches(self, epoch: int) -> int:
        return -(-len(self.examples) // self.batch_size)

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        if self.objective == "sim" and self.encoder.model.cacheable and self.states is None:
            self.states = self.compute_states()
        order = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        for number, start in enumerate(range(0, len(order), self.batch_size)):
            noise = random.Random(f"{self.seed}:{epoch}:{number}")
            chunk = [self.examples[i] for i in order[start : start + self.batch_size]]
            yield self.collate(chunk, noise)

    def batch_negatives(self, chunk: list[Example], generator: random.Random) -> list[list[int]]:
        """A seeded draw of up to `negatives_per_pair` given negatives per pair, pooled for the whole batch
        (every query scores against all of them); documents that are a positive of the batch are left out."""
        positives = {tuple(ids) for e in chunk for ids in (e.source, e.target)}
        pool: dict[tuple[int, ...], None] = {}
        for example in chunk:
            candidates = [n for n in example.negatives if tuple(n) not in positives]
            for ids in generator.sample(candidates, min(self.negatives_per_pair, len(candidates))):
                pool[tuple(ids)] = None
        return [list(ids) for ids in pool]

    def collate(self, chunk: list[Example], generator: random.Random) -> dict[str, torch.Tensor]:
        backbone = self.encoder.model.backbone
        if self.objective == "sim":
            batch = {}
            sides = [("", [e.source for e in chunk]), ("other_", [e.target for e in chunk])]
            negatives = self.batch_negatives(chunk, generator) if self.negatives_per_pair else []
            if negatives:
                sides.append(("negative_", negatives))
            for side, rows in sides:
                batch[f"{side}input_ids"], batch[f"{side}attention_mask"] = pad_sequences(
                    rows, backbone.pad_id
                )
                if self.states is not None:
                    batch[f"{side}bottom"] = _pad_states([self.states[tuple(r)][0] for r in rows])
                    batch[f"{side}top"] = _pad_states([self.states[tuple(r)][1] for r in rows])
            return batch
        sources = [delete_tokens(e.source, self.noise, generator) for e in chunk]
        targets = [e.target[1:] if backbone.labels_drop_first else e.target for e in chunk]
        decoder_inputs = [[backbone.start_id, *t[:-1]] for t in targets]
        input_ids, attention = pad_sequences(sources, backbone.pad_id)
        decoder_input_ids, _ = pad_sequences(decoder_inputs, backbone.pad_id)
        labels, _ = pad_sequences(targets, -100)
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "decoder_input_ids": decoder_input_ids,
            "labels": labels,
        }

    @torch.no_grad()
    def compute_states(
        self, batch_size: int = 32
    ) -> dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]]:
        """Layer l's and the last layer's states of every distinct document (bf16, on the CPU)."""
        from docembed.runtime import log

        model = self.encoder.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        docs = {tuple(ids) for e in self.examples for ids in (e.source, e.target, *e.negatives)}
        docs = sorted(docs, key=len)
        states = {}
        for start in range(0, len(docs), batch_size):
            chunk = [list(d) for d in docs[start : start + batch_size]]
            ids, mask = pad_sequences(chunk, model.backbone.pad_id)
            bottom, encoder_mask = model.bottom_states(ids.to(device), mask.to(device))
            top = model.upper_states(bottom, encoder_mask)
            for row, doc in enumerate(chunk):
                n = len(doc)
                states[tuple(doc)] = (
                    bottom[row, :n].to("cpu", torch.bfloat16),
                    top[row, :n].to("cpu", torch.bfloat16),
                )
        model.train(was_training)
        log(f"train-nugget: token states of {len(states)} documents computed once (frozen encoder)")
        return states

    def batch_units(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    def save(self, directory: Path) -> None:
        self.encoder.save(directory)


def _pad_states(rows: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros((len(rows), max(len(r) for r in rows), rows[0].shape[1]), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row.float()
    return out


# --- training pairs from PI train (what `make zoo` trains the shipped model on) ----------------------------
HELD_OUT_QUERIES = 256  # the last 256 PI *train* queries and their documents: never trained on
STS_MIN_SCORE = {"senteval/stsb-train": 4.0, "senteval/sick-train": 4.0}  # STS-B 0-5, SICK 1-5


def held_out_train_documents(tasks: list[dict]) -> set[str]:
    """Ids of the source and gold documents of the last HELD_OUT_QUERIES of the PI train `tasks`. (Their
    other candidates are drawn from the whole split, most of them the gold of some training pair: they stay
    in training.)"""
    return {i for t in tasks[-HELD_OUT_QUERIES:] for i in (t["source"], t["candidates"][t["answer"]])}


def pi_train_pairs(docs: dict[str, str], tasks, held: set[str]) -> Iterator[tuple[str, str, list[str]]]:
    """(source, gold, negatives) texts of every PI task whose source and gold documents are not in `held`;
    the negatives are the task's other candidates outside `held` (what PI asks a model to rank below the
    paraphrase). Tasks with an empty source or gold are skipped."""
    for task in tasks:
        source, gold = task["source"], task["candidates"][task["answer"]]
        if source in held or gold in held or not docs[source].strip() or not docs[gold].strip():
            continue
        others = [docs[c] for c in task["candidates"] if c != gold and c not in held and docs[c].strip()]
        yield docs[source], docs[gold], others


def halves_pairs(documents: Sequence[str]) -> list[tuple[str, str, list[str]]]:
    """(first half, second half, no negatives) of each document, cut at its middle word: two parts of one
    text about the same thing, made without labels (the batch's other documents are the negatives)."""
    pairs = []
    for text in documents:
        words = text.split()
        middle = len(words) // 2
        if middle:
            pairs.append((" ".join(words[:middle]), " ".join(words[middle:]), []))
    return pairs


def write_training_pairs(
    path: str | Path,
    sts: bool = True,
    data_root: str | None = None,
    halves_of: Sequence[str] = (),
) -> dict[str, int]:
    """Write JSON Lines {"source", "target"[, "negatives"]} paraphrase pairs, both directions, for
    `train-nugget`: PI train (task source -> gold candidate, the task's other candidates as negatives; the
    held-out queries' documents excluded), (`sts`) the STS-B / SICK *train* pairs scored >= 4, and the two
    halves of each of `halves_of` (long documents the caller chose away from its validation tasks). No PI
    dev text. Returns the pair count of each source."""
    import json

    from docembed import datasets

    docs = {d.id: d.text for d in datasets.documents("paraphrase_identification/train/docs", data_root)}
    tasks = list(datasets.records("paraphrase_identification/train/task", data_root))
    pairs = {"pi_train": list(pi_train_pairs(docs, tasks, held_out_train_documents(tasks)))}
    for name, minimum in STS_MIN_SCORE.items() if sts else ():
        rows = datasets.records(name, data_root)
        pairs[name] = [(r["s1"], r["s2"], []) for r in rows if r["score"] >= minimum]
    if halves_of:
        pairs["halves"] = halves_pairs(halves_of)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for rows in pairs.values():
            for a, b, negatives in rows:
                for source, target in ((a, b), (b, a)):
                    row = {"source": source, "target": target}
                    if negatives:
                        row["negatives"] = negatives
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {name: len(rows) for name, rows in pairs.items()}
