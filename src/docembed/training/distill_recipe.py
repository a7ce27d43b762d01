"""Distilling the long student from a depth teacher (SBERT) and a breadth teacher (Paragraph Vector).

    L = lambda(x) * L_depth(student(x), sbert(x))  +  L_breadth(student(x), pv(x))

- lambda(x) = depth_weight when the SBERT teacher read x whole (x is no longer than the teacher's max length
  in the teacher's own tokens), else 0: SBERT's vector of a truncated document describes only its start.
- L_depth is losses/distill.py (cosine, MSE or bounded max-margin); L_breadth is losses/soft_cca.py.

Teacher vectors are computed once per corpus and cached on disk (`TeacherCache`), keyed by the teacher's
identity and each document's text hash, so training never recomputes them and a second run on an
overlapping corpus only encodes the new documents.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from docembed.errors import UsageError
from docembed.losses.distill import DepthLoss
from docembed.losses.soft_cca import SoftCCALoss
from docembed.models.student import StudentEncoder, masked_mean, pad_batch
from docembed.runtime import log, progress_bar
from docembed.training.loop import Recipe


# --- teacher vectors, cached ----------------------------------------------------------------------------
def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def teacher_identity(encoder) -> str:
    """A key for 'this teacher with these weights': name, family, config hash and, for a saved model, the
    size and modification time of each of its files (so retraining into the same folder changes it)."""
    parts: dict[str, Any] = {**encoder.metadata(), "source": encoder.source}
    parts.pop("docembed_version", None)
    if encoder.source and Path(encoder.source).is_dir():
        parts["files"] = sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in Path(encoder.source).iterdir()
            if p.is_file()
        )
    max_len = getattr(encoder, "max_seq_length", None)
    parts["max_seq_length"] = max_len
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


class TeacherCache:
    """`<root>/<teacher id>/vectors.npy` + `keys.json` (text hashes, row order). Never pickled."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def vectors(
        self, encoder, texts: Sequence[str], batch_size: int = 16, label: str = "teacher"
    ) -> np.ndarray:
        """The teacher's vector of every text, encoding only those not cached yet."""
        folder = self.root / teacher_identity(encoder)
        keys_path, vectors_path = folder / "keys.json", folder / "vectors.npy"
        keys: list[str] = []
        stored = None
        if keys_path.exists() and vectors_path.exists():
            keys = json.loads(keys_path.read_text(encoding="utf-8"))
            stored = np.load(vectors_path, allow_pickle=False)
            if len(stored) != len(keys):  # an interrupted write: start the cache afresh
                keys, stored = [], None
        row_of = {k: i for i, k in enumerate(keys)}
        wanted = [text_key(t) for t in texts]
        first_row: dict[str, int] = {}
        for i, k in enumerate(wanted):
            if k not in row_of and k not in first_row:
                first_row[k] = i
        missing = list(first_row.items())
        if missing:
            log(f"{label}: encoding {len(missing)} of {len(texts)} documents (cache {folder})")
            new_rows = []
            chunk = 256
            with progress_bar(f"{label} vectors", total=math.ceil(len(missing) / chunk)) as bar:
                for start in range(0, len(missing), chunk):
                    part = [texts[i] for _, i in missing[start : start + chunk]]
                    new_rows.append(np.asarray(encoder.encode(part, batch_size=batch_size), dtype=np.float32))
                    bar.advance()
            new = np.concatenate(new_rows)
            stored = new if stored is None else np.concatenate([stored, new])
            keys = keys + [k for k, _ in missing]
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_save(vectors_path, stored, keys_path, keys, encoder)
            row_of = {k: i for i, k in enumerate(keys)}
        else:
            log(f"{label}: all {len(texts)} documents cached ({folder})")
        return stored[[row_of[k] for k in wanted]]


def _atomic_save(vectors_path: Path, vectors: np.ndarray, keys_path: Path, keys: list[str], encoder) -> None:
    tmp = vectors_path.with_suffix(".tmp.npy")
    np.save(tmp, vectors, allow_pickle=False)
    os.replace(tmp, vectors_path)
    tmp_keys = keys_path.with_suffix(".tmp")
    tmp_keys.write_text(json.dumps(keys), encoding="utf-8")
    os.replace(tmp_keys, keys_path)
    (keys_path.parent / "teacher.json").write_text(
        json.dumps({**encoder.metadata(), "source": encoder.source}, indent=2), encoding="utf-8"
    )


def depth_weights(teacher, texts: Sequence[str], weight: float = 1.0) -> np.ndarray:
    """lambda(x): `weight` for texts the teacher reads whole (in its own tokens, special tokens included),
    0 for longer ones."""
    tokenizer, limit = teacher.tokenizer, teacher.max_seq_length
    lengths = np.array([len(ids) for ids in tokenizer(list(texts), truncation=False)["input_ids"]])
    return np.where(lengths <= limit, weight, 0.0).astype(np.float32)


# --- the module the loop trains ---------------------------------------------------------------------------
class DistillModule(nn.Module):
    def __init__(self, student, depth: DepthLoss | None, breadth: SoftCCALoss | None, depth_dim: int | None):
        super().__init__()
        self.student = student
        self.depth = depth
        self.breadth = breadth
        hidden = student.config.hidden_size
        # A student narrower or wider than the SBERT teacher needs a map into the teacher's space.
        self.depth_head = (
            nn.Linear(hidden, depth_dim) if depth and depth_dim and depth_dim != hidden else None
        )

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.student(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        pooled = masked_mean(hidden, batch["attention_mask"])
        terms: dict[str, torch.Tensor] = {}
        loss = pooled.sum() * 0.0
        if self.depth is not None:
            mapped = self.depth_head(pooled) if self.depth_head is not None else pooled
            depth = self.depth(mapped, batch["sbert"], batch["depth_weight"])
            terms["depth"] = depth.detach()
            terms["depth_share"] = (batch["depth_weight"] > 0).float().mean()
            loss = loss + depth
        if self.breadth is not None:
            breadth = self.breadth(pooled, batch["pv"])
            terms["breadth"] = breadth["loss"].detach()
            terms["cca_l2"] = breadth["l2"]
            terms["cca_decorrelation"] = breadth["decorrelation"]
            loss = loss + breadth["loss"]
        return {"loss": loss, **terms}


@dataclass
class DistillSettings:
    depth_loss: str = "cosine"
    margin: float = 0.2
    depth_weight: float = 1.0
    breadth_loss: str = "soft-cca"
    cca_dim: int | None = None
    pv_projection: str = "identity"
    alpha: float = 0.95
    decorrelation_weight: float = 1.0
    batch_size: int = 8
    bucket_batches: int = 32  # length buckets: sort this many batches' worth of documents by length
    gradient_checkpointing: bool = False
    seed: int = 0


class DistillRecipe(Recipe):
    unit = "tokens"

    def __init__(
        self,
        student: StudentEncoder,
        texts: Sequence[str],
        settings: DistillSettings,
        sbert_vectors: np.ndarray | None = None,
        sbert_weights: np.ndarray | None = None,
        pv_vectors: np.ndarray | None = None,
    ):
        super().__init__()
        if sbert_vectors is None and pv_vectors is None:
            raise UsageError("distillation needs at least one teacher (sbert, pv)")
        self.student = student
        self.settings = settings
        self.token_ids = student.tokenize(texts)
        self.sbert = (
            torch.from_numpy(np.asarray(sbert_vectors, dtype=np.float32))
            if sbert_vectors is not None
            else None
        )
        self.weights = (
            torch.from_numpy(np.asarray(sbert_weights, dtype=np.float32))
            if sbert_weights is not None
            else None
        )
        self.pv = (
            torch.from_numpy(np.asarray(pv_vectors, dtype=np.float32)) if pv_vectors is not None else None
        )
        depth = DepthLoss(settings.depth_loss, settings.margin) if self.sbert is not None else None
        breadth = None
        if self.pv is not None:
            breadth = SoftCCALoss(
                student.dim,
                self.pv.shape[1],
                dim=settings.cca_dim,
                teacher_projection=settings.pv_projection,
                objective=settings.breadth_loss,
                alpha=settings.alpha,
                decorrelation_weight=settings.decorrelation_weight,
            )
        if settings.gradient_checkpointing:
            # transformers 5 renamed gradient_checkpointing_enable (still there, deprecated).
            model = student.model
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
        student.model.train()
        self.module = DistillModule(
            student.model, depth, breadth, self.sbert.shape[1] if self.sbert is not None else None
        )

    def _order(self, epoch: int) -> list[list[int]]:
        """Length-bucketed batches: shuffle, sort each pool of `bucket_batches` batches by length, cut, and
        shuffle the batches (seeded by seed + epoch, identical on every rank)."""
        rng = random.Random(self.settings.seed + epoch)
        index = list(range(len(self.token_ids)))
        rng.shuffle(index)
        size = self.settings.batch_size
        pool = size * self.settings.bucket_batches
        batches = []
        for start in range(0, len(index), pool):
            chunk = sorted(index[start : start + pool], key=lambda i: len(self.token_ids[i]))
            batches.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
        rng.shuffle(batches)
        return batches

    def num_batches(self, epoch: int) -> int:
        return len(self._order(epoch))

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        for rows in self._order(epoch):
            yield self.collate(rows)

    def collate(self, rows: list[int]) -> dict[str, torch.Tensor]:
        input_ids, mask = pad_batch([self.token_ids[i] for i in rows], self.student.pad_id)
        batch = {"input_ids": input_ids, "attention_mask": mask}
        if self.sbert is not None:
            batch["sbert"] = self.sbert[rows]
            batch["depth_weight"] = self.weights[rows] if self.weights is not None else torch.ones(len(rows))
        if self.pv is not None:
            batch["pv"] = self.pv[rows]
        return batch

    def batch_units(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["attention_mask"].sum())

    def save(self, directory: Path) -> None:
        if self.settings.gradient_checkpointing:
            model = self.student.model
            getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
        self.student.model.eval()
        self.student.save(directory)
