"""Training recipe of the retriever: a sentence-transformers model fine-tuned to find the part of a long
document a query is about (issue 45), for passage scoring (`output="windows"`: a document is scored by its
best windows).

Data: (query, window, hard negative) examples from unlabelled documents (training/retrieval_pairs.py: a
passage -> the text around it, a window -> the next one, an opening -> what follows, a summary -> the
opening; the negative mined with BM25). A batch holds examples of one group, so the other examples' windows
are negatives from the same manual or newsgroup, and each query also scores every mined negative of the
batch (losses/in_batch_contrastive.py).

Model: the base's top `train_layers` transformer layers train, the embeddings and the layers below stay as
they are. That halves the backward pass on a CPU, keeps what the base knows about short text, and the zoo
ships only the layers that changed.

Validation (`RetrievalValidation`): held-out examples of validation documents, each query ranked against
every held-out window and negative; the primary metric is their MRR.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.losses.in_batch_contrastive import InBatchContrastiveLoss
from docembed.models.sbert import SBertConfig
from docembed.runtime import log
from docembed.training.document_pairs import PASSAGE_LINES
from docembed.training.loop import Recipe, TrainConfig
from docembed.training.retrieval_pairs import (
    DEFAULT_KINDS,
    LEAD_WORDS,
    RetrievalDocument,
    RetrievalExample,
    RetrieverTraining,
    make_examples,
    mine_negatives,
)


def embed(network: nn.Module, tokenizer, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """The network's sentence embeddings of `texts` (one batch), each cut to `max_length` tokens."""
    device = next(network.parameters()).device
    features = tokenizer(
        list(texts), truncation=True, max_length=max_length, padding=True, return_tensors="pt"
    )
    features = {k: v.to(device) for k, v in features.items() if k in ("input_ids", "attention_mask")}
    return network(features)["sentence_embedding"]


def kind_counts(examples: Sequence[RetrievalExample]) -> dict[str, int]:
    kinds = [e.kind for e in examples]
    return {kind: kinds.count(kind) for kind in sorted(set(kinds))}


class RetrieverObjective(nn.Module):
    """forward(batch of texts) -> {"loss", "pair_acc"}: the contrastive loss of the batch's queries against
    its windows (and its mined negatives)."""

    def __init__(self, network: nn.Module, tokenizer, loss: InBatchContrastiveLoss, query_tokens: int):
        super().__init__()
        self.network = network
        self.tokenizer = tokenizer
        self.loss = loss
        self.window_tokens = int(network.max_seq_length)
        self.query_tokens = min(query_tokens, self.window_tokens)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        queries = embed(self.network, self.tokenizer, batch["queries"], self.query_tokens)
        positives = embed(self.network, self.tokenizer, batch["positives"], self.window_tokens)
        negatives = None
        if batch.get("negatives"):
            negatives = embed(self.network, self.tokenizer, batch["negatives"], self.window_tokens)
        return self.loss(queries, positives, negatives)


def freeze_below(network: nn.Module, train_layers: int) -> int:
    """Freeze every parameter of a sentence-transformers BERT-like model but its top `train_layers`
    encoder layers; returns how many parameters still train."""
    transformer = network[0].auto_model
    layers = transformer.encoder.layer
    if not 1 <= train_layers <= len(layers):
        raise ValueError(f"train_layers must be 1 to {len(layers)}, got {train_layers}")
    for parameter in network.parameters():
        parameter.requires_grad = False
    for layer in layers[len(layers) - train_layers :]:
        for parameter in layer.parameters():
            parameter.requires_grad = True
    return sum(p.numel() for p in network.parameters() if p.requires_grad)


class RetrieverRecipe(Recipe):
    unit = "pairs"

    def __init__(
        self, examples: Sequence[RetrievalExample], encoder, training: RetrieverTraining, seed: int = 0
    ):
        super().__init__()
        if training.batch_size < 2:
            raise ValueError("a batch needs at least 2 examples (in-batch negatives)")
        self.encoder = encoder
        self.training = training
        self.seed = seed
        self.examples = list(examples)
        by_group: dict[str, list[int]] = {}
        for row, example in enumerate(self.examples):
            by_group.setdefault(example.group, []).append(row)
        self.groups = [rows for rows in by_group.values() if len(rows) >= 2]
        if not self.groups:
            raise ValueError("need at least 2 training examples in one group (in-batch negatives)")
        trainable = freeze_below(encoder.model, training.train_layers)
        kinds = kind_counts(self.examples)
        log(
            f"retriever: {len(self.examples)} examples ({', '.join(f'{n} {k}' for k, n in kinds.items())}) "
            f"in {len(self.groups)} groups; {trainable:,} parameters train "
            f"(top {training.train_layers} layers)"
        )
        loss = InBatchContrastiveLoss(training.scale)
        self.module = RetrieverObjective(encoder.model, encoder.tokenizer, loss, training.query_tokens)

    def _order(self, epoch: int) -> list[list[int]]:
        """Epoch `epoch`'s batches: each group's examples shuffled and cut into batches (a last one of fewer
        than 2 dropped), the batches of all groups shuffled together."""
        rng = random.Random(self.seed * 1000 + epoch)
        batches = []
        size = self.training.batch_size
        for rows in self.groups:
            rows = rows[:]
            rng.shuffle(rows)
            batches += [rows[i : i + size] for i in range(0, len(rows), size) if len(rows[i : i + size]) >= 2]
        rng.shuffle(batches)
        return batches

    def num_batches(self, epoch: int) -> int:
        return len(self._order(epoch))

    def batches(self, epoch: int) -> Iterator[dict]:
        for rows in self._order(epoch):
            examples = [self.examples[i] for i in rows]
            negatives = [e.negative for e in examples if e.negative] if self.training.hard_negatives else []
            yield {
                "queries": [e.query for e in examples],
                "positives": [e.positive for e in examples],
                "negatives": negatives,
            }

    def batch_units(self, batch: dict) -> int:
        return len(batch["queries"])

    def save(self, directory: Path) -> None:
        self.encoder.model.eval()
        self.encoder.save(directory)
        kinds = kind_counts(self.examples)
        settings = {
            **asdict(self.training),
            "seed": self.seed,
            "examples": len(self.examples),
            "kinds": kinds,
        }
        (Path(directory) / "retriever_training.json").write_text(json.dumps(settings, indent=2) + "\n")


class RetrievalValidation:
    """The loop's validation hook: MRR of held-out queries, each ranked against every held-out window and
    mined negative (ties counted against the query's own window), overall and per view kind."""

    primary_metric = "mrr"

    def __init__(
        self, encoder, examples: Sequence[RetrievalExample], query_tokens: int, batch_size: int = 32
    ):
        if not examples:
            raise ValueError("validation needs at least one example")
        self.encoder = encoder
        self.examples = list(examples)
        self.query_tokens = min(query_tokens, int(encoder.model.max_seq_length))
        self.batch_size = batch_size
        self.candidates = [e.positive for e in self.examples] + sorted(
            {e.negative for e in self.examples if e.negative} - {e.positive for e in self.examples}
        )

    def _vectors(self, texts: list[str], max_length: int) -> np.ndarray:
        network, tokenizer = self.encoder.model, self.encoder.tokenizer
        parts = [
            embed(network, tokenizer, texts[i : i + self.batch_size], max_length).float().cpu().numpy()
            for i in range(0, len(texts), self.batch_size)
        ]
        vectors = np.concatenate(parts)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    def __call__(self, device: str) -> dict[str, float]:
        queries = self._vectors([e.query for e in self.examples], self.query_tokens)
        windows = self._vectors(self.candidates, int(self.encoder.model.max_seq_length))
        scores = queries @ windows.T
        gold = scores[np.arange(len(queries)), np.arange(len(queries))]
        reciprocal = 1.0 / (scores >= gold[:, None]).sum(axis=1)  # the rank, ties against the gold
        out = {"mrr": float(reciprocal.mean())}
        for kind in sorted({e.kind for e in self.examples}):
            rows = [i for i, e in enumerate(self.examples) if e.kind == kind]
            out[f"mrr/{kind}"] = float(reciprocal[rows].mean())
        return out


def fit_retriever(
    documents: Sequence[RetrievalDocument],
    config: SBertConfig,
    output: str | Path,
    training: RetrieverTraining,
    loop: TrainConfig,
    validation_documents: Sequence[RetrievalDocument] = (),
    kinds: Sequence[str] = DEFAULT_KINDS,
):
    """Fine-tune the sbert model of `config` on examples of `documents` and save it to `output`; with
    `validation_documents`, validate on their examples and keep the best weights. Returns the encoder."""
    import dataclasses

    from docembed.errors import UsageError
    from docembed.models.sbert import SBertEncoder
    from docembed.runtime import seed_everything
    from docembed.training.loop import train

    seed_everything(loop.seed)
    loop = dataclasses.replace(loop, output_dir=str(output))
    examples = make_examples(documents, kinds, training.per_document, training.window_words, loop.seed)
    if len(examples) < 2:
        raise UsageError(
            f"{len(documents)} documents gave {len(examples)} training examples: a view needs a document "
            f"of {2 * LEAD_WORDS} words or more (part: {PASSAGE_LINES + 1} lines or more; summary: a summary "
            "field)"
        )
    if training.hard_negatives:
        log(f"retriever: mining a BM25 negative for each of {len(examples)} examples")
        examples = mine_negatives(examples, seed=loop.seed)
    encoder = SBertEncoder(config, device="cpu")
    try:
        recipe = RetrieverRecipe(examples, encoder, training, seed=loop.seed)
    except ValueError as error:  # no group of two examples, a bad --train-layers: the caller's settings
        raise UsageError(str(error)) from None
    hooks = {}
    if validation_documents:
        held_out = make_examples(validation_documents, kinds, 1, training.window_words, loop.seed + 1)
        held_out = mine_negatives(held_out, seed=loop.seed + 1) if training.hard_negatives else held_out
        hooks["validate"] = RetrievalValidation(encoder, held_out, training.query_tokens)
        if not loop.resume:
            with torch.no_grad():
                before = hooks["validate"](loop.device)
            scores = "  ".join(f"{k} {v:.4f}" for k, v in before.items())
            log(f"retriever: {len(held_out)} held-out examples; before training: {scores}")
    summary = train(recipe, loop, **hooks)
    log(
        f"trained {summary['steps']} steps in {summary['seconds']:.0f}s; "
        f"best validation: {summary.get('best')}"
    )
    return encoder
