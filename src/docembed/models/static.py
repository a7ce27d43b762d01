"""`static`: one vector per WordPiece token, a document = the mean of its tokens' vectors (model2vec's idea:
Tulkens & van Dongen, MinishLab 2024, github.com/MinishLab/model2vec; the distillation is our own code in
docembed.training.static_distill). No transformer runs at encode time, so it reads every token of every
document at tens of thousands of documents per second on one CPU thread.

The table is distilled from a sentence transformer (the offline MiniLM): each vocabulary token through the
model, PCA, then a weight per token from its frequency in a corpus (rare tokens count more, as in SIF).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.errors import CorruptModelError
from docembed.models.base import (
    WEIGHTS_NAME,
    Encoder,
    EncoderConfig,
    read_config,
    refuse_non_finite,
    save_state_dict,
)
from docembed.models.families import register
from docembed.tensors import is_long, tokenized_blocks
from docembed.types import l2_normalize


@dataclass
class StaticConfig(EncoderConfig):
    base: str = "minilm"  # the offline sentence transformer distilled; its tokenizer reads the texts
    vocab_size: int = 30522
    dim: int = 256
    normalize: bool = True
    # How the table was made (recorded for the card; encode does not use them). The defaults were chosen on
    # STS-B dev and SICK-R dev (scripts/static_selection.py, bench/results/static/selection.json).
    token_pooling: str = "token"  # the token position's output of [CLS] token [SEP], or "mean" of all three
    weighting: str = "zipf"  # none | zipf (log(1 + frequency rank)) | sif (a / (a + p))
    sif_a: float = 1e-3
    weights_corpus: str = ""

    def __post_init__(self):
        if self.dim < 1 or self.vocab_size < 1:
            raise CorruptModelError(
                f"static dim and vocab_size must be positive, got {self.dim}, {self.vocab_size}"
            )


@register
class StaticEncoder(Encoder):
    family = "static"
    config_class = StaticConfig

    def __init__(self, config: StaticConfig, name: str | None = None, tokenizer=None):
        super().__init__(config, name)
        self.tokenizer = tokenizer if tokenizer is not None else _base_tokenizer(config.base)
        self.table = nn.Embedding(config.vocab_size, config.dim)
        nn.init.zeros_(self.table.weight)
        self.table.requires_grad_(False)
        self.special_ids = np.array(sorted(set(self.tokenizer.all_special_ids)), dtype=np.int64)

    # --- rebuilding from the offline base (the zoo ships the table as an overlay) ---------------------
    @classmethod
    def offline_base(cls, config: dict) -> str | None:
        return config.get("base", "minilm") if isinstance(config, dict) else config.base

    @classmethod
    def from_base(cls, config, files: Path | None = None, seed: int = 0) -> StaticEncoder:
        """The base's tokenizer and an all-zero table: distillation (or the zoo's overlay) fills it."""
        if not isinstance(config, StaticConfig):
            config = StaticConfig.from_dict(config)
        return cls(config)

    @property
    def weights_module(self) -> nn.Module:
        return self.table

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def normalized(self) -> bool:
        return self.config.normalize

    def set_table(self, vectors: np.ndarray) -> StaticEncoder:
        if vectors.shape != (self.config.vocab_size, self.config.dim):
            raise CorruptModelError(f"a static table must be {self.config.vocab_size} x {self.config.dim}")
        self.table.weight.data = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
        return self

    # --- encoding ----------------------------------------------------------------------------------------
    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's WordPiece ids, all of them (no truncation), special tokens left out."""
        return self.tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)[
            "input_ids"
        ]

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        texts = list(texts)
        long = [i for i, text in enumerate(texts) if is_long(text)]
        if not long:
            return self._encode_at_once(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        short = [i for i in range(len(texts)) if i not in set(long)]
        if short:
            out[short] = self._encode_at_once([texts[i] for i in short])
        for i in long:
            out[i] = self._encode_streamed(texts[i])
        return out

    def _encode_at_once(self, texts: list[str]) -> np.ndarray:
        from scipy.sparse import csr_matrix

        ids = self.token_ids(texts)
        counts = np.fromiter((len(t) for t in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter((i for t in ids for i in t), dtype=np.int64, count=int(counts.sum()))
        # texts x vocabulary token counts times the table: the sums without a (tokens x dim) array in memory
        bag = csr_matrix(
            (np.ones(len(flat), dtype=np.float32), flat, np.concatenate([[0], np.cumsum(counts)])),
            shape=(len(ids), self.config.vocab_size),
        )
        sums = np.asarray(bag @ self.table.weight.detach().numpy(), dtype=np.float32)
        return self._means(sums, counts)

    def _encode_streamed(self, text: str) -> np.ndarray:
        """One long text, tokenized block by block. The sum runs on in token order, one float32 addition
        per token as the sparse product above makes them, so the vector is the one `_encode_at_once` gives."""
        table = self.table.weight.detach().numpy()
        total = np.zeros(self.dim, dtype=np.float32)
        count = 0
        for ids in tokenized_blocks(lambda block: self.token_ids([block])[0], text):
            ids = np.asarray(ids, dtype=np.int64)
            for start in range(0, len(ids), 4096):  # a few MB of table rows at a time
                rows = table[ids[start : start + 4096]]
                total = np.add.reduce(np.concatenate([total[None], rows]), axis=0)  # row after row, in order
            count += len(ids)
        return self._means(total[None], np.array([count], dtype=np.int64))[0]

    def _means(self, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        out = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
        return l2_normalize(out) if self.config.normalize else out

    # --- files ---------------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.write_config(directory)
        self.tokenizer.save_pretrained(str(directory))
        save_state_dict(self.table, directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> StaticEncoder:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        directory = Path(directory)
        config = StaticConfig.from_dict(read_config(directory)["config"])
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
            state = load_file(str(directory / WEIGHTS_NAME))
        except Exception as error:  # missing or truncated files: the folder is damaged
            raise CorruptModelError(f"{directory} is not a complete static model: {error}") from None
        refuse_non_finite(state, directory / WEIGHTS_NAME)
        encoder = cls(config, tokenizer=tokenizer)
        if state.get("weight") is None or tuple(state["weight"].shape) != (config.vocab_size, config.dim):
            raise CorruptModelError(
                f"{directory / WEIGHTS_NAME} does not hold a {config.vocab_size} x {config.dim} table"
            )
        encoder.table.weight.data = state["weight"].float()
        return encoder


def _base_tokenizer(base: str):
    from transformers import AutoTokenizer

    from docembed.models.offline import minilm_path

    if base != "minilm":
        raise CorruptModelError(f"unknown static base {base!r} (known: minilm)")
    return AutoTokenizer.from_pretrained(str(minilm_path()))
