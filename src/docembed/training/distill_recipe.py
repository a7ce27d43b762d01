"""Distilling the long student from a depth teacher (SBERT) and a breadth teacher (Paragraph Vector).

    L = lambda(x) * L_depth(student(x), sbert(x))  +  L_breadth(student(x), pv(x))

- lambda(x) = depth_weight when the SBERT teacher read x whole (x is no longer than the teacher's max length
  in the teacher's own tokens), else 0: SBERT's vector of a truncated document describes only its start.
- L_depth is losses/distill.py (cosine, MSE or bounded max-margin); L_breadth is losses/soft_cca.py.

With pair documents (`--pairs-from`, issue 35), every step also draws `pair_batch_size` of them, makes a
(query, positive) view of each (training/document_pairs.py: first half -> second half, passage -> page) and
adds pair_weight * L_pairs, the in-batch contrastive loss of losses/in_batch_contrastive.py: the teachers
keep what the student learnt on their corpus while the pairs teach it the documents' own structure, on
text where imitating a teacher cannot beat the teacher.

Teacher vectors are computed once per corpus and cached on disk (`docembed.encoding.EmbeddingCache`), keyed
by the teacher's identity and each document's text hash, so training never recomputes them and a second
run on an overlapping corpus only encodes the new documents. `student_to_train` and `teacher_vectors` set up
what `docembed train-distill` trains from.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from docembed.errors import UsageError
from docembed.io.readers import batched
from docembed.losses.distill import DepthLoss
from docembed.losses.in_batch_contrastive import InBatchContrastiveLoss
from docembed.losses.soft_cca import SoftCCALoss
from docembed.models.student import StudentConfig, StudentEncoder, masked_mean
from docembed.tensors import PackedSequences, pad_sequences
from docembed.training.document_pairs import document_view
from docembed.training.loop import Recipe, main_process_first


# --- which teacher vectors count (the vectors themselves: docembed.encoding.EmbeddingCache) ---------------
def depth_weights(teacher, texts: Sequence[str], weight: float = 1.0) -> np.ndarray:
    """lambda(x): `weight` for texts the teacher reads whole (in its own tokens, special tokens included),
    0 for longer ones."""
    tokenizer, limit = teacher.tokenizer, teacher.max_seq_length
    lengths = np.array([len(ids) for ids in tokenizer(list(texts), truncation=False)["input_ids"]])
    return np.where(lengths <= limit, weight, 0.0).astype(np.float32)


# --- the student and the teachers' vectors (what train-distill starts from) --------------------------------
def student_to_train(
    student: str, max_length: int | None = None, attention_window: int = 256, seed: int = 0
) -> StudentEncoder:
    """A saved student folder (convert-long's output; `max_length` caps its length), or else the source
    `student` converted to a long student as convert-long does (`max_length` tokens, default 4096)."""
    if Path(student).is_dir() and (Path(student) / "config.json").exists():
        model = StudentEncoder.load(student)
        if max_length:
            model.config.max_length = min(max_length, model.config.max_length)
        return model
    config = StudentConfig(max_length=max_length or 4096, attention_window=attention_window, source=student)
    return StudentEncoder.from_base(config, seed=seed)


@dataclass
class TeacherVectors:
    """The teachers' vectors of the training texts (None for a teacher not used)."""

    sbert: np.ndarray | None = None
    sbert_weights: np.ndarray | None = None  # lambda(x) per text
    pv: np.ndarray | None = None
    pv_model: str | None = None  # the PV teacher's folder (trained here when none was given)


def teacher_vectors(
    cache,
    texts: list[str],
    teachers: set[str],
    device: str = "cpu",
    sbert_model: str = "sbert",
    depth_weight: float = 1.0,
    depth_target: str = "whole",
    pv_model: str | None = None,
    pv_corpus: Iterable | None = None,
    pv_dir: str | Path | None = None,
    pv_mode: str = "concat",
    pv_dim: int = 100,
    seed: int = 0,
) -> TeacherVectors:
    """The vectors of `teachers` ("sbert", "pv") for `texts`, from `cache` (an EmbeddingCache) or computed
    into it. Without `pv_model`, a PV teacher is first fitted on `pv_corpus` (the whole corpus) into `pv_dir`.
    Under torchrun rank 0 fills the cache first and the other ranks read it."""
    found = TeacherVectors()
    with main_process_first(device):
        if "sbert" in teachers:
            found.sbert, found.sbert_weights = sbert_teacher(
                cache, sbert_model, texts, depth_weight, device, depth_target
            )
        if "pv" in teachers:
            found.pv_model, found.pv = pv_teacher(
                cache, pv_model, texts, pv_dir, pv_corpus, pv_mode, pv_dim, seed
            )
    return found


def sbert_teacher(
    cache, sbert_model: str, texts: list[str], depth_weight: float, device: str, depth_target: str = "whole"
):
    """The depth teacher's vectors of `texts` (cached) and each text's depth-loss weight lambda(x)."""
    from docembed.models.registry import load_model
    from docembed.runtime import log

    sbert = load_model(sbert_model, device=device)
    if not hasattr(sbert, "tokenizer") or not hasattr(sbert, "max_seq_length"):
        raise UsageError(f"--sbert-model {sbert_model!r} is not an SBERT model")
    if depth_target not in ("whole", "chunks"):
        raise UsageError(f"--depth-target must be whole or chunks, got {depth_target!r}")
    if depth_target == "chunks":
        # a target for every document: the teacher averaged over consecutive windows it reads whole
        sbert.config.output = "chunks"
        vectors = cache.vectors(sbert, texts, label=f"sbert-chunks teacher ({sbert.name})")
        log(
            f"depth loss applies to all {len(texts)} documents (targets: {sbert.name} over 256-token windows)"
        )
        return vectors, np.full(len(texts), depth_weight, dtype=np.float32)
    # the thesis' target: one pass, used only for documents it reads whole (lambda(x) below)
    sbert.config.output = "mean"
    vectors = cache.vectors(sbert, texts, label=f"sbert teacher ({sbert.name})")
    weights = depth_weights(sbert, texts, depth_weight)
    log(
        f"depth loss applies to {int((weights > 0).sum())} of {len(texts)} documents "
        f"(<= {sbert.max_seq_length} {sbert.name} tokens)"
    )
    return vectors, weights


def pv_teacher(
    cache,
    pv_model: str | None,
    texts: list[str],
    pv_dir: str | Path | None,
    corpus: Iterable | None,
    mode: str = "concat",
    dim: int = 100,
    seed: int = 0,
):
    """The breadth teacher's path and its vectors of `texts` (cached). Without `pv_model`, a PV teacher is
    first fitted on `corpus` into `pv_dir` (kept, so a resumed run reuses it)."""
    from docembed.models.paragraph_vector import PVConfig, fit_pv
    from docembed.models.registry import load_model
    from docembed.runtime import log

    if pv_model is None:
        pv_model = str(pv_dir)
        kept = Path(pv_model) / "config.json"
        if kept.exists():  # a resumed run's teacher (or a failed run's): it must be the one asked for
            config = json.loads(kept.read_text(encoding="utf-8")).get("config", {})
            if (config.get("mode"), config.get("vector_size")) != (mode, dim):
                raise UsageError(
                    f"{pv_model} holds a PV teacher of mode {config.get('mode')}, dim "
                    f"{config.get('vector_size')}; this run asks for {mode}, dim {dim}: give the same "
                    "--pv-mode and --pv-dim, or remove it to train another"
                )
        else:
            name = getattr(corpus, "name", "the corpus")
            log(f"no --pv-model: training a PV teacher ({mode}, dim {dim}) on {name} -> {pv_model}")
            # train-pv's defaults, one worker thread so the teacher is reproducible
            fit_pv(corpus, PVConfig(mode=mode, vector_size=dim, workers=1, seed=seed), pv_model)
    pv = load_model(pv_model)
    return pv_model, cache.vectors(pv, texts, label=f"pv teacher ({pv.name})")


# --- the module the loop trains ---------------------------------------------------------------------------
class DistillModule(nn.Module):
    def __init__(
        self,
        student,
        depth: DepthLoss | None,
        breadth: SoftCCALoss | None,
        depth_dim: int | None,
        pairs: InBatchContrastiveLoss | None = None,
        pair_weight: float = 0.0,
    ):
        super().__init__()
        self.student = student
        self.depth = depth
        self.breadth = breadth
        self.pairs = pairs
        self.pair_weight = pair_weight
        hidden = student.config.hidden_size
        # A student narrower or wider than the SBERT teacher needs a map into the teacher's space.
        self.depth_head = (
            nn.Linear(hidden, depth_dim) if depth and depth_dim and depth_dim != hidden else None
        )

    def pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.student(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return masked_mean(hidden, attention_mask)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pooled = self.pool(batch["input_ids"], batch["attention_mask"])
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
        if self.pairs is not None and "query_ids" in batch:
            queries = self.pool(batch["query_ids"], batch["query_mask"])
            positives = self.pool(batch["positive_ids"], batch["positive_mask"])
            pairs = self.pairs(queries, positives)
            terms["pairs"] = pairs["loss"].detach()
            terms["pair_acc"] = pairs["pair_acc"]
            loss = loss + self.pair_weight * pairs["loss"]
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
    freeze_embeddings: bool = False  # embeddings stay the base model's (the zoo ships layers only)
    pair_weight: float = 1.0  # weight of the contrastive loss on pair documents (when there are any)
    pair_batch_size: int = 16  # pair documents per step (each gives a query and a positive)
    pair_scale: float = 20.0  # the contrastive loss' inverse temperature
    pair_max_words: int = 1400  # words per view (the student's 2,048 tokens hold about 1,500)
    seed: int = 0

    def __post_init__(self):
        # checked when the command starts, not after the student loads and the teachers encode
        from docembed.losses.distill import KINDS
        from docembed.losses.soft_cca import OBJECTIVES

        for option, value, allowed in (
            ("--depth-loss", self.depth_loss, KINDS),
            ("--breadth-loss", self.breadth_loss, OBJECTIVES),
            ("--pv-projection", self.pv_projection, ("identity", "linear")),
        ):
            if value not in allowed:
                raise UsageError(f"{option} is one of {', '.join(allowed)}, not {value!r}")
        if self.breadth_loss == "mse" and self.pv_projection != "identity":
            raise UsageError(
                "--breadth-loss mse needs --pv-projection identity (two free projections collapse)"
            )


class DistillRecipe(Recipe):
    unit = "tokens"

    def __init__(
        self,
        student: StudentEncoder,
        texts: Iterable[str],
        settings: DistillSettings,
        sbert_vectors: np.ndarray | None = None,
        sbert_weights: np.ndarray | None = None,
        pv_vectors: np.ndarray | None = None,
        pair_texts: Sequence[str] | None = None,
        pair_groups: Sequence[str] | None = None,
    ):
        super().__init__()
        if sbert_vectors is None and pv_vectors is None:
            raise UsageError("distillation needs at least one teacher (sbert, pv)")
        pair_texts = list(pair_texts or ())
        pair_groups = list(pair_groups) if pair_groups is not None else [""] * len(pair_texts)
        if len(pair_groups) != len(pair_texts):
            raise ValueError(f"{len(pair_groups)} pair groups for {len(pair_texts)} pair documents")
        kept = [(text, group) for text, group in zip(pair_texts, pair_groups, strict=True) if text.strip()]
        if pair_texts and len(kept) < 2:
            raise UsageError("pair documents: need at least 2 non-empty documents (in-batch negatives)")
        self.pair_texts = [text for text, _ in kept]
        # a batch's pairs come from one group, so its negatives are its hardest: pages of the same manual
        # (a group of one page has no negatives: left out, unless no group has two)
        rows_by_group: dict[str, list[int]] = {}
        for row, (_, group) in enumerate(kept):
            rows_by_group.setdefault(group, []).append(row)
        self.pair_group_rows = [rows for rows in rows_by_group.values() if len(rows) > 1] or [
            list(range(len(kept)))
        ]
        self.student = student
        self.settings = settings
        # Token ids as compact arrays (the length buckets need random access), tokenized a chunk at a time.
        chunks = (student.tokenize(chunk) for chunk in batched(texts, 1024))
        self.token_ids = PackedSequences.from_chunks(chunks)
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
        if settings.freeze_embeddings:
            student.model.embeddings.requires_grad_(False)
        pairs = InBatchContrastiveLoss(settings.pair_scale) if self.pair_texts else None
        self.module = DistillModule(
            student.model,
            depth,
            breadth,
            self.sbert.shape[1] if self.sbert is not None else None,
            pairs,
            settings.pair_weight,
        )

    def _order(self, epoch: int) -> list[list[int]]:
        """Length-bucketed batches: shuffle, sort each pool of `bucket_batches` batches by length, cut, and
        shuffle the batches (seeded by seed + epoch, identical on every rank)."""
        rng = random.Random(self.settings.seed + epoch)
        index = list(range(len(self.token_ids)))
        rng.shuffle(index)
        lengths = self.token_ids.lengths.tolist()
        size = self.settings.batch_size
        pool = size * self.settings.bucket_batches
        batches = []
        for start in range(0, len(index), pool):
            chunk = sorted(index[start : start + pool], key=lengths.__getitem__)
            batches.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
        rng.shuffle(batches)
        return batches

    def num_batches(self, epoch: int) -> int:
        return len(self._order(epoch))

    def batches(self, epoch: int) -> Iterator[dict[str, torch.Tensor]]:
        for number, rows in enumerate(self._order(epoch)):
            batch = self.collate(rows)
            if self.pair_texts:
                batch.update(self.pair_batch(epoch, number))
            yield batch

    def pair_batch(self, epoch: int, number: int) -> dict[str, torch.Tensor]:
        """Batch `number` of `epoch`'s views: distinct pair documents of one group and their views, drawn by
        an rng seeded with (seed, epoch, number), so a resumed run sees the same views whichever batch it
        starts at."""
        rng = random.Random(f"{self.settings.seed}/{epoch}/{number}")
        # the group with odds by its size
        rows = rng.choices(self.pair_group_rows, weights=[len(g) for g in self.pair_group_rows])[0]
        size = min(self.settings.pair_batch_size, len(rows))
        views = [
            document_view(self.pair_texts[i], rng, self.settings.pair_max_words)
            for i in rng.sample(rows, size)
        ]
        out = {}
        for side, texts in (("query", [q for q, _ in views]), ("positive", [p for _, p in views])):
            ids, mask = pad_sequences(self.student.tokenize(texts), self.student.pad_id)
            out[f"{side}_ids"], out[f"{side}_mask"] = ids, mask
        return out

    def collate(self, rows: list[int]) -> dict[str, torch.Tensor]:
        input_ids, mask = pad_sequences([self.token_ids[i] for i in rows], self.student.pad_id)
        batch = {"input_ids": input_ids, "attention_mask": mask}
        if self.sbert is not None:
            batch["sbert"] = self.sbert[rows]
            batch["depth_weight"] = self.weights[rows] if self.weights is not None else torch.ones(len(rows))
        if self.pv is not None:
            batch["pv"] = self.pv[rows]
        return batch

    def batch_units(self, batch: dict[str, torch.Tensor]) -> int:
        masks = ("attention_mask", "query_mask", "positive_mask")
        return sum(int(batch[name].sum()) for name in masks if name in batch)

    def save(self, directory: Path) -> None:
        if self.settings.gradient_checkpointing:
            model = self.student.model
            getattr(model, "activation_checkpointing_disable", model.gradient_checkpointing_disable)()
        self.student.model.eval()
        self.student.save(directory)
