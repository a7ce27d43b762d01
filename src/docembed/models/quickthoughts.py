"""QuickThoughts (Logeswaran & Lee, ICLR 2018): two GRU sentence encoders f and g, trained so that
f(s) . g(s') picks s's neighbours out of a batch of consecutive sentences (losses/neighbour_contrastive.py,
training/quickthoughts_recipe.py).

A sentence's embedding is, as in the reference code (lajanugen/S2V, s2v_encoder.encode with use_norm),
[f(s)/|f(s)| ; g(s)/|g(s)|]: 2 * hidden_size (x2 when bidirectional) dimensions, norm sqrt(2).
A document is split into sentences (Punkt) and embedded as the *mean of its sentence embeddings* (not
re-normalised); an empty document is one empty sentence. With `output="sentences"` the model returns the
sentence embeddings themselves as a multi-vector embedding (positions = sentence index).

With `expand_vocabulary` (what train-quickthoughts writes), words outside the training vocabulary are not
<unk>: as in skip-thoughts' vocabulary expansion (Kiros et al. 2015, section 2.2), a linear map from the base
word vectors the embeddings started from (GloVe) to the trained embeddings is fitted by least squares on the
words both know, and every other base word enters through it. The map is refitted at first use (the same
least-squares problem, so the same map); only the trained table is saved.

The saved directory holds config.json, model.safetensors (word embeddings, f, g) and vocab.json.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.errors import CorruptModelError, UsageError
from docembed.models.base import Encoder, EncoderConfig, load_state_dict, read_config, save_state_dict
from docembed.models.families import register
from docembed.runtime import log, report_batch
from docembed.tensors import is_long, pad_sequences
from docembed.text import Vocabulary, iter_sentences, split_sentences, tokenize
from docembed.types import MultiVectors, Vectors

VOCAB_NAME = "vocab.json"
# A long text's sentences are encoded this many at a time (and only their running mean is kept).
SENTENCE_GROUP = 4096
OUTPUTS = ("mean", "sentences")


@dataclass
class QuickThoughtsConfig(EncoderConfig):
    vocab_size: int = 2
    embedding_dim: int = 50
    hidden_size: int = 300  # per direction
    bidirectional: bool = False
    freeze_embeddings: bool = False
    lowercase: bool = True
    max_length: int = 30  # tokens per training sentence (the reference's sequence_length)
    max_encode_length: int = 128  # tokens per sentence at encode time (longer ones are cut)
    context_size: int = 1  # neighbours on each side that are targets in training
    output: str = "mean"  # "mean" (one vector per document) | "sentences" (multi-vector)
    # Map words outside the vocabulary in from the base word vectors (see the module docstring). False in
    # the dataclass because models saved before the option existed did not.
    expand_vocabulary: bool = False
    vectors: str | None = None  # the base word vectors' text file; None: the offline GloVe 6B 50d

    def __post_init__(self):
        if self.output not in OUTPUTS:
            raise UsageError(f"quickthoughts output must be 'mean' or 'sentences', got {self.output!r}")
        if self.context_size < 1:
            raise UsageError("quickthoughts context_size must be >= 1")

    @property
    def sentence_dim(self) -> int:
        return 2 * self.hidden_size * (2 if self.bidirectional else 1)


class QuickThoughtsModule(nn.Module):
    """Shared word embeddings and the two GRUs f and g (trained by training/quickthoughts_recipe.py)."""

    def __init__(self, config: QuickThoughtsConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=Vocabulary.pad_id)
        self.embedding.weight.requires_grad = not config.freeze_embeddings
        gru = dict(batch_first=True, bidirectional=config.bidirectional)
        self.f = nn.GRU(config.embedding_dim, config.hidden_size, **gru)
        self.g = nn.GRU(config.embedding_dim, config.hidden_size, **gru)

    @staticmethod
    def _final_state(gru: nn.GRU, packed) -> torch.Tensor:
        _, state = gru(packed)  # (directions, batch, hidden)
        return state.transpose(0, 1).reshape(state.shape[1], -1)

    def encode_pair(
        self, ids: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f(s), g(s)) for padded token ids (batch, length) with true lengths >= 1; `table` replaces the
        embedding matrix (the expanded vocabulary's)."""
        embedded = self.embedding(ids) if table is None else nn.functional.embedding(ids, table)
        packed = nn.utils.rnn.pack_padded_sequence(
            embedded, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        return self._final_state(self.f, packed), self._final_state(self.g, packed)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_pair(ids, lengths)


def pad_batch(sequences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> (ids (n, longest) padded with the pad id, lengths (n,)); empty lists become one
    pad token, so an empty sentence still gets a (fixed) embedding."""
    ids, mask = pad_sequences(sequences, Vocabulary.pad_id)
    return ids, mask.sum(dim=1).clamp_(min=1)


@register
class QuickThoughtsEncoder(Encoder):
    family = "quickthoughts"
    config_class = QuickThoughtsConfig

    def __init__(
        self,
        config: QuickThoughtsConfig,
        name: str | None = None,
        vocabulary: Vocabulary | None = None,
        module: QuickThoughtsModule | None = None,
        device: str = "cpu",
    ):
        super().__init__(config, name)
        self.vocabulary = vocabulary or Vocabulary(["<pad>", "<unk>"])
        if len(self.vocabulary) != config.vocab_size:
            raise CorruptModelError(
                f"the vocabulary has {len(self.vocabulary)} words, the config says {config.vocab_size}"
            )
        self.module = (module or QuickThoughtsModule(config)).to(device).eval()
        self.device = device
        self._expanded: tuple[Vocabulary, torch.Tensor | None] | None = None  # built at first use

    # --- built from GloVe 6B 50d (the zoo starts here) -------------------------------------------------
    base_files = (VOCAB_NAME,)

    @classmethod
    def offline_base(cls, config: dict) -> str | None:
        return "glove-6b-50d" if config.get("vectors") is None else None

    @classmethod
    def from_base(
        cls, config, files: Path | None = None, seed: int = 0, vocabulary: Vocabulary | None = None
    ) -> QuickThoughtsEncoder:
        """Word embeddings initialised from the base vectors for `vocabulary` (or `files`/vocab.json), the
        GRUs drawn from `seed`."""
        from docembed.models.word_vectors import initial_embeddings

        if not isinstance(config, QuickThoughtsConfig):
            config = QuickThoughtsConfig.from_dict(config)
        qt_config = config
        if vocabulary is None:
            if files is None:
                raise UsageError("quickthoughts.from_base needs a vocabulary or the folder of its vocab.json")
            vocabulary = Vocabulary.load(Path(files) / VOCAB_NAME)
        torch.manual_seed(seed)
        matrix, _ = initial_embeddings(vocabulary, qt_config.embedding_dim, qt_config.vectors, seed=seed)
        module = QuickThoughtsModule(qt_config)
        with torch.no_grad():
            module.embedding.weight.copy_(torch.from_numpy(matrix))
        return cls(qt_config, vocabulary=vocabulary, module=module)

    @property
    def weights_module(self) -> nn.Module:
        return self.module

    @property
    def multi_vector(self) -> bool:
        return self.config.output == "sentences"

    @property
    def dim(self) -> int:
        return self.config.sentence_dim

    def set_output(self, output: str) -> None:
        """Switch between one mean vector per document and the sentence vectors (multi-vector)."""
        if output not in OUTPUTS:
            raise UsageError(f"quickthoughts output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        self.config.output = output

    def to(self, device: str) -> QuickThoughtsEncoder:
        self.module.to(device)
        self.device = device
        self._expanded = None
        return self

    def expanded_vocabulary(self) -> tuple[Vocabulary, torch.Tensor | None]:
        """(vocabulary, embedding table) used at encode time: the trained ones, or with `expand_vocabulary`
        the trained ones followed by every other base word, mapped in by the least-squares linear map."""
        if not self.config.expand_vocabulary:
            return self.vocabulary, None
        if self._expanded is None:
            from docembed.models.word_vectors import base_word_vectors, vocabulary_rows

            words, base = base_word_vectors(self.config.vectors)
            trained = self.module.embedding.weight.detach().float().cpu().numpy()
            rows, found = vocabulary_rows(words, base, self.vocabulary)
            found[[Vocabulary.pad_id, Vocabulary.unk_id]] = False
            if found.sum() < base.shape[1]:  # too few to fit the map: encode with the trained vocabulary
                log(
                    f"quickthoughts: vocabulary not expanded: {int(found.sum())} words shared with the base"
                    f" vectors, fewer than their {base.shape[1]} dimensions"
                )
                self._expanded = (self.vocabulary, None)
                return self._expanded
            mapping = np.linalg.lstsq(rows[found], trained[found], rcond=None)[0]
            extra, seen = [], set(self.vocabulary.index)
            for row, word in enumerate(words):  # the first row of each word the vocabulary lacks
                if word not in seen:
                    seen.add(word)
                    extra.append(row)
            table = np.concatenate([trained, base[extra] @ mapping]).astype(np.float32)
            vocabulary = Vocabulary(self.vocabulary.tokens + [words[row] for row in extra])
            self._expanded = (vocabulary, torch.from_numpy(table).to(self.device))
        return self._expanded

    def sentence_ids(self, sentence: str) -> list[int]:
        tokens = tokenize(sentence, lowercase=self.config.lowercase)[: self.config.max_encode_length]
        return self.expanded_vocabulary()[0].ids(tokens)

    @torch.inference_mode()
    def encode_sentences(self, sentences: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """[f/|f| ; g/|g|] for each sentence as given (no further splitting)."""
        token_ids = [self.sentence_ids(s) for s in sentences]
        table = self.expanded_vocabulary()[1]
        out = np.zeros((len(token_ids), self.dim), dtype=np.float32)
        # Sorting by length keeps padding (and wasted GRU steps) small; rows go back to input order.
        order = np.argsort([len(t) for t in token_ids], kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            ids, lengths = pad_batch([token_ids[i] for i in rows])
            f_vectors, g_vectors = self.module.encode_pair(ids.to(self.device), lengths, table)
            vectors = torch.cat(
                [nn.functional.normalize(f_vectors, dim=1), nn.functional.normalize(g_vectors, dim=1)], dim=1
            )
            out[rows] = vectors.float().cpu().numpy()
            report_batch(start + len(rows), len(order))
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        texts = list(texts)
        long = [i for i, text in enumerate(texts) if is_long(text)]
        if not long:
            return self._encode_at_once(texts, batch_size)
        # the usual texts together as always; each long one read sentence group by sentence group
        short = [i for i in range(len(texts)) if i not in set(long)]
        done = self._encode_at_once([texts[i] for i in short], batch_size) if short else None
        items: list = [None] * len(texts)
        for k, i in enumerate(short):
            items[i] = done[k]
        for i in long:
            items[i] = self._encode_streamed(texts[i], batch_size)
        if self.config.output == "sentences":
            return MultiVectors.from_list(items, [np.arange(len(v), dtype=np.int64) for v in items])
        return np.stack(items).astype(np.float32)

    def _encode_streamed(self, text: str, batch_size: int) -> np.ndarray:
        """A long text's sentence vectors (output "sentences") or their mean (summed in float64 as
        `_encode_at_once` sums), SENTENCE_GROUP sentences at a time."""
        total, count, parts = np.zeros(self.dim, dtype=np.float64), 0, []
        sentences = iter_sentences(text)
        while group := list(itertools.islice(sentences, SENTENCE_GROUP)):
            vectors = self.encode_sentences(group, batch_size=max(batch_size, 128))
            if self.config.output == "sentences":
                parts.append(vectors)
            total += vectors.sum(axis=0, dtype=np.float64)
            count += len(group)
        if not count:  # no sentence: the empty sentence's vector, as split_sentences(...) or [""] gives
            parts = [self.encode_sentences([""], batch_size=1)]
            total, count = parts[0][0].astype(np.float64), 1
        if self.config.output == "sentences":
            return np.concatenate(parts)
        return (total / count).astype(np.float32)

    def _encode_at_once(self, texts: list[str], batch_size: int) -> Vectors:
        per_doc = [split_sentences(text) or [""] for text in texts]
        flat = [s for sentences in per_doc for s in sentences]
        # The GRU batch is in sentences; a document batch of 32 holds many more, so widen it.
        vectors = self.encode_sentences(flat, batch_size=max(batch_size, 128))
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in per_doc])]).astype(np.int64)
        if self.config.output == "sentences":
            positions = np.concatenate([np.arange(len(s)) for s in per_doc]) if per_doc else np.zeros(0)
            return MultiVectors(vectors, offsets, positions.astype(np.int64))
        if not per_doc:
            return np.zeros((0, self.dim), dtype=np.float32)
        # summed in float64: the mean is then the same whatever the order of the additions (a long text's,
        # streamed, adds group after group), and float32's rounding no longer grows with the sentence count
        sums = np.add.reduceat(vectors.astype(np.float64), offsets[:-1], axis=0)
        return (sums / np.diff(offsets)[:, None]).astype(np.float32)

    def save(self, directory: str | Path) -> None:
        directory = self.write_config(directory)
        save_state_dict(self.module, directory)
        self.vocabulary.save(directory / VOCAB_NAME)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> QuickThoughtsEncoder:
        payload = read_config(directory)
        config = QuickThoughtsConfig.from_dict(payload["config"])
        vocabulary = Vocabulary.load(Path(directory) / VOCAB_NAME)
        module = QuickThoughtsModule(config)
        load_state_dict(module, directory, device="cpu")
        return cls(config, vocabulary=vocabulary, module=module, device=device)
