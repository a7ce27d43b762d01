"""SBERT: sentence-transformers models as docembed encoders.

`output="mean"` gives the model's own pooled (and, for the MiniLM/MPNet models, normalised) vector;
`output="tokens"` gives every token's contextual vector, L2-normalised, as a multi-vector embedding - the
all-token MaxSim reference ("ColBART") that the NUGGET paper compares against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from docembed.errors import CorruptModelError, DocembedError, UsageError
from docembed.io.embeddings import MultiVectors, Vectors
from docembed.models.base import Encoder, EncoderConfig, l2_normalize, read_config
from docembed.models.offline import resolve_sbert
from docembed.models.registry import register

ST_SUBDIR = "sentence_transformer"


@dataclass
class SBertConfig(EncoderConfig):
    model_name_or_path: str = "all-MiniLM-L6-v2"
    output: str = "mean"  # "mean" | "tokens"
    max_seq_length: int | None = None  # None keeps the model's own limit
    normalize: bool = True

    def __post_init__(self):
        if self.output not in ("mean", "tokens"):
            raise UsageError(f"sbert output must be 'mean' or 'tokens', got {self.output!r}")


@register
class SBertEncoder(Encoder):
    family = "sbert"
    config_class = SBertConfig

    def __init__(self, config: SBertConfig, name: str | None = None, device: str = "cpu", _path=None):
        super().__init__(config, name)
        from sentence_transformers import SentenceTransformer

        source = _path or resolve_sbert(config.model_name_or_path)
        try:
            self.model = SentenceTransformer(source, device=device)
        except Exception as error:  # hub errors, missing files, truncated safetensors all land here
            error_type = CorruptModelError if _path else DocembedError
            raise error_type(f"cannot load sentence-transformers model {source!r}: {error}") from None
        if config.max_seq_length:
            self.model.max_seq_length = config.max_seq_length

    @property
    def multi_vector(self) -> bool:
        return self.config.output == "tokens"

    @property
    def normalized(self) -> bool:
        return self.config.normalize

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def to(self, device: str) -> SBertEncoder:
        self.model.to(device)
        return self

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        texts = list(texts)
        if self.config.output == "mean":
            if not texts:
                return np.zeros((0, self.dim), dtype=np.float32)
            vectors = self.model.encode(
                texts,
                batch_size=batch_size,
                show_progress_bar=False,
                convert_to_numpy=True,
                normalize_embeddings=self.config.normalize,
            )
            return np.asarray(vectors, dtype=np.float32)
        tokens = self.model.encode(
            texts, batch_size=batch_size, show_progress_bar=False, output_value="token_embeddings"
        )
        items = [t.float().cpu().numpy() for t in tokens]
        if self.config.normalize:
            items = [l2_normalize(t) for t in items]
        return MultiVectors.from_list(items, [np.arange(len(t)) for t in items])

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.model.save(str(directory / ST_SUBDIR))
        self.write_config(directory)

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> SBertEncoder:
        payload = read_config(directory)
        config = SBertConfig.from_dict(payload["config"])
        st_dir = Path(directory) / ST_SUBDIR
        if not (st_dir / "modules.json").exists():
            raise CorruptModelError(f"{directory}: {ST_SUBDIR}/ is missing or incomplete")
        return cls(config, device=device, _path=str(st_dir))
