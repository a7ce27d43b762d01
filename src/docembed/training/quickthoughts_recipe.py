"""Training QuickThoughts through the shared loop.

The corpus is read once, streamed: each document is split into sentences (Punkt) and tokenised, and only
token ids are kept, in numpy (`SentenceCorpus`: a flat id array, sentence offsets, document offsets), in
document order. The vocabulary (min count, max size, PAD and UNK) is built from the same pass.

Batches follow the method: a batch is a run of consecutive sentences. Each document (cut into pieces of
at most `batch_size` sentences when longer) is a *run*; an epoch shuffles the order of the runs (seeded by
seed + epoch), never the sentences inside one, lays them end to end and cuts that sequence into batches of
`batch_size` sentences. Every row carries its run id as `groups`, so the loss only counts neighbours
inside the same document as targets. The loop's DDP gives whole global batches to ranks, so runs stay
intact there too.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.errors import DocembedError
from docembed.losses.neighbour_contrastive import NeighbourContrastiveLoss
from docembed.models.quickthoughts import QuickThoughtsConfig, QuickThoughtsEncoder, QuickThoughtsModule
from docembed.runtime import log, progress_bar
from docembed.tensors import pad_sequences
from docembed.text import Vocabulary, split_sentences, tokenize
from docembed.training.loop import Recipe


@dataclass
class SentenceCorpus:
    """Token ids of every sentence, in document order: sentence k is tokens[offsets[k]:offsets[k+1]] and
    document d owns sentences doc_offsets[d]:doc_offsets[d+1]."""

    tokens: np.ndarray  # int32
    offsets: np.ndarray  # int64, n_sentences + 1
    doc_offsets: np.ndarray  # int64, n_documents + 1
    vocabulary: Vocabulary

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def sentence(self, k: int) -> np.ndarray:
        return self.tokens[self.offsets[k] : self.offsets[k + 1]]

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        min_count: int = 1,
        max_vocab: int | None = None,
        max_length: int = 30,
        lowercase: bool = True,
        vocabulary: Vocabulary | None = None,
    ) -> SentenceCorpus:
        """One streamed pass: sentences -> provisional word ids (+ counts), then the vocabulary (unless one
        is given) and a remap of the provisional ids to vocabulary ids (rare words -> UNK)."""
        provisional: dict[str, int] = {}
        counts: list[int] = []
        flat = array("i")
        sentence_ends = array("q", [0])
        doc_ends = array("q", [0])
        with progress_bar("read corpus") as bar:
            for text in texts:
                for sentence in split_sentences(text):
                    words = tokenize(sentence, lowercase=lowercase)
                    if not words:
                        continue
                    for word in words:
                        index = provisional.setdefault(word, len(provisional))
                        if index == len(counts):
                            counts.append(0)
                        counts[index] += 1
                    flat.extend(provisional[w] for w in words[:max_length])
                    sentence_ends.append(len(flat))
                doc_ends.append(len(sentence_ends) - 1)
                bar.advance()
        if len(sentence_ends) < 3:
            raise DocembedError("the corpus holds fewer than two sentences")
        words = list(provisional)
        if vocabulary is None:
            vocabulary = Vocabulary.from_counts(
                Counter(dict(zip(words, counts, strict=True))), min_count=min_count, max_size=max_vocab
            )
        remap = np.fromiter((vocabulary.id(w) for w in words), dtype=np.int32, count=len(words))
        tokens = remap[np.frombuffer(flat, dtype=np.int32)] if len(flat) else np.zeros(0, np.int32)
        return cls(
            tokens.astype(np.int32, copy=False),
            np.frombuffer(sentence_ends, dtype=np.int64).copy(),
            np.frombuffer(doc_ends, dtype=np.int64).copy(),
            vocabulary,
        )


def sentence_runs(doc_offsets: np.ndarray, max_run: int) -> np.ndarray:
    """(n_runs, 2) [start, stop) sentence ranges: each document, cut into pieces of <= max_run sentences;
    empty documents give no run."""
    runs = []
    for start, stop in zip(doc_offsets[:-1].tolist(), doc_offsets[1:].tolist(), strict=True):
        for piece in range(start, stop, max_run):
            runs.append((piece, min(piece + max_run, stop)))
    return np.asarray(runs, dtype=np.int64).reshape(-1, 2)


def run_batches(runs: np.ndarray, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(sentence indices, run id per row) per batch: runs in a seeded random order, laid end to end, cut
    every `batch_size` sentences. Sentence order inside a run is kept. A last batch of one sentence is
    dropped (it has no candidates)."""
    order = np.random.default_rng(seed).permutation(len(runs))
    lengths = runs[order, 1] - runs[order, 0]
    sentences = np.concatenate([np.arange(*runs[r]) for r in order]) if len(order) else np.zeros(0, np.int64)
    run_ids = np.repeat(order, lengths)
    for start in range(0, len(sentences), batch_size):
        if len(sentences) - start < 2:
            break
        yield sentences[start : start + batch_size], run_ids[start : start + batch_size]


class QuickThoughtsObjective(nn.Module):
    """forward(batch) -> {"loss", "neighbour_acc"}: the f and g vectors of a batch of consecutive sentences
    through the neighbour loss (losses/neighbour_contrastive.py); `groups` keeps neighbours in their run."""

    def __init__(self, network: QuickThoughtsModule, loss: NeighbourContrastiveLoss):
        super().__init__()
        self.network = network
        self.loss = loss

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        f_vectors, g_vectors = self.network.encode_pair(batch["ids"], batch["lengths"])
        return self.loss(f_vectors, g_vectors, batch.get("groups"))


class QuickThoughtsRecipe(Recipe):
    unit = "sentences"

    def __init__(
        self,
        corpus: SentenceCorpus,
        config: QuickThoughtsConfig,
        batch_size: int = 400,
        seed: int = 0,
        embeddings: np.ndarray | None = None,
    ):
        super().__init__()
        if batch_size < 2:
            raise DocembedError("QuickThoughts needs batches of at least 2 sentences")
        self.corpus = corpus
        self.config = config
        self.batch_size = batch_size
        self.seed = seed
        self.network = QuickThoughtsModule(config)
        if embeddings is not None:
            with torch.no_grad():
                self.network.embedding.weight.copy_(torch.from_numpy(embeddings))
        self.module = QuickThoughtsObjective(self.network, NeighbourContrastiveLoss(config.context_size))
        self.runs = sentence_runs(corpus.doc_offsets, batch_size)

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        for sentences, run_ids in run_batches(self.runs, self.batch_size, self.seed + epoch):
            ids, mask = pad_sequences(
                [self.corpus.sentence(k) for k in sentences.tolist()], Vocabulary.pad_id
            )
            yield {
                "ids": ids,
                "lengths": mask.sum(dim=1),
                "groups": torch.from_numpy(run_ids.astype(np.int64)),
            }

    def num_batches(self, epoch: int) -> int:
        total = int((self.runs[:, 1] - self.runs[:, 0]).sum())
        return total // self.batch_size + (1 if total % self.batch_size >= 2 else 0)

    def batch_units(self, batch) -> int:
        return int(batch["ids"].shape[0])

    def save(self, directory: Path) -> None:
        encoder = QuickThoughtsEncoder(self.config, vocabulary=self.corpus.vocabulary, module=self.network)
        encoder.save(directory)
        log(f"saved QuickThoughts ({self.config.sentence_dim}-d sentences) to {directory}")
