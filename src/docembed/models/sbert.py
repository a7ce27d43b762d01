"""SBERT: sentence-transformers models as docembed encoders.

`output="mean"` gives the model's own pooled (and, for the MiniLM/MPNet models, normalised) vector;
`output="tokens"` gives every token's contextual vector, L2-normalised, as a multi-vector embedding - the
all-token MaxSim reference ("ColBART") that the NUGGET paper compares against.
`output="chunks"` reads documents of any length: consecutive windows of `max_seq_length` tokens ([CLS] and
[SEP] included, no overlap, the last one shorter), each pooled as `mean` pools a text, averaged over the
windows and normalised.
`backend`/`precision` choose the engine that runs the transformer on the CPU (inference_backends.py: OpenVINO
static int8 2.4-5x the documents per second of PyTorch fp32); pooling stays sentence-transformers' own.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from docembed.errors import CorruptModelError, DocembedError, UsageError
from docembed.io.outputs import DirectoryKind
from docembed.models import inference_backends
from docembed.models.base import (
    LONG_MODES,
    Encoder,
    EncoderConfig,
    NotSupportedError,
    check_long_queries,
    check_temperature,
    read_config,
)
from docembed.models.families import register
from docembed.models.offline import resolve_sbert
from docembed.runtime import report_batch, reporting_texts
from docembed.tensors import (
    is_long,
    stream_batch,
    streamed_token_windows,
    token_windows,
    tokenized_blocks,
)
from docembed.types import MultiVectors, Vectors, l2_normalize

ST_SUBDIR = "sentence_transformer"
# What `docembed export` writes: replaced (with --overwrite) only when it holds a sentence-transformers model.
SENTENCE_TRANSFORMERS_DIRECTORY = DirectoryKind(
    "sentence-transformers model", "modules.json", lambda folder: (folder / "modules.json").is_file()
)
# mean: one vector of the first max_seq_length tokens; tokens: one per token of those; chunks: the mean of
# windows over the whole text; windows: one vector per window (multi-vector: MaxSim scores a query against
# a document's best windows, MaxP when the query is one window)
OUTPUTS = ("mean", "tokens", "chunks", "windows")


@dataclass
class SBertConfig(EncoderConfig):
    model_name_or_path: str = "all-MiniLM-L6-v2"
    # "chunks" | "mean" | "tokens" | "windows" (see OUTPUTS). The whole document by default (chunks: the mean
    # of its windows), chosen on the long validation tasks over one pass of the first tokens (mean).
    output: str = "chunks"
    max_seq_length: int | None = None  # None keeps the model's own limit
    window_overlap: int = 0  # chunks / windows: tokens each window shares with the one before
    # windows: how a document's windows pool when scored: 0 the best window (MaxP), > 0 smoother (scoring.py)
    passage_temperature: float = 0.0
    # a long query (scoring.LONG_QUERY_PASSAGES, a half): "passages" scores each, "whole" the texts' means
    long_queries: str = "passages"
    normalize: bool = True
    backend: str = "auto"  # auto | torch | openvino | onnx (inference only; the weights are the same)
    precision: str = "fp32"  # fp32 | int8

    INFERENCE_SETTINGS: ClassVar[tuple[str, ...]] = (
        "passage_temperature",
        "long_queries",
        "backend",
        "precision",
    )

    def __post_init__(self):
        if self.output not in OUTPUTS:
            raise UsageError(f"sbert output must be one of {', '.join(OUTPUTS)}, got {self.output!r}")
        inference_backends.check_choice(self.backend, self.precision)
        check_temperature(self.passage_temperature)
        check_long_queries(self.long_queries)


def _refuse_non_finite_weights(model, source: str) -> None:
    """sentence-transformers loads the weights itself: NaN or infinite ones would encode NaN vectors."""
    import torch

    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            files = [p for p in Path(source).glob("*.safetensors")] if Path(source).is_dir() else []
            where = files[0] if len(files) == 1 else source
            raise CorruptModelError(f"{where} holds weights that are not finite (NaN or infinite) in {key}")


@register
class SBertEncoder(Encoder):
    family = "sbert"
    config_class = SBertConfig
    capabilities = frozenset({"backends", "long", "passages"})

    def __init__(self, config: SBertConfig, name: str | None = None, device: str = "cpu", _path=None):
        super().__init__(config, name)
        from sentence_transformers import SentenceTransformer

        source = _path or resolve_sbert(config.model_name_or_path)
        try:
            self.model = SentenceTransformer(source, device=device)
        except Exception as error:  # hub errors, missing files, truncated safetensors all land here
            error_type = CorruptModelError if _path else DocembedError
            raise error_type(f"cannot load sentence-transformers model {source!r}: {error}") from None
        _refuse_non_finite_weights(self.model, source)
        if config.max_seq_length:
            self.model.max_seq_length = config.max_seq_length
        if not 0 <= config.window_overlap < self.model.max_seq_length - 2:
            raise UsageError(
                f"window_overlap must be at least 0 and below the window's {self.model.max_seq_length - 2} "
                f"tokens, got {config.window_overlap}"
            )
        self.weights_dir = source if Path(source).is_dir() else self.model[0].auto_model.name_or_path
        self.device = device
        self._runner = None  # built on first use: `to()` and `set_inference()` may still change it

    # --- built from MiniLM (the zoo's `retriever` and train-retriever start here) -----------------------
    @classmethod
    def offline_base(cls, config: dict) -> str | None:
        name = str(config.get("model_name_or_path", "")).removeprefix("sentence-transformers/")
        return "minilm" if name == "all-MiniLM-L6-v2" else None

    @classmethod
    def from_base(cls, config, files: Path | None = None, seed: int = 0) -> SBertEncoder:
        """all-MiniLM-L6-v2 from its offline package, with the trained model's settings (nothing is drawn at
        random: `seed` is unused)."""
        config = config if isinstance(config, SBertConfig) else SBertConfig.from_dict(config)
        return cls(config)

    @property
    def weights_module(self):
        return self.model

    def set_inference(self, backend: str | None = None, precision: str | None = None) -> SBertEncoder:
        """Choose the engine and precision the transformer runs with (see inference_backends)."""
        backend = backend or self.config.backend
        precision = precision or self.config.precision
        inference_backends.resolve_backend(backend, precision, self.device)  # fail now, not mid-corpus
        self.config.backend, self.config.precision = backend, precision
        self._runner = None
        return self

    def set_long_documents(self, mode: str) -> None:
        """truncate: one pass over the first max_seq_length tokens; windows: all of it in windows (the mean
        output becomes the mean of the windows; the windows output reads windows already)."""
        if mode not in LONG_MODES:
            raise UsageError(f"--long must be one of {', '.join(LONG_MODES)}, got {mode!r}")
        # mean <-> chunks is the one pair that differs only in how much is read; the others keep their kind
        switch = {("windows", "mean"): "chunks", ("truncate", "chunks"): "mean"}
        output = self.config.output
        if (mode, output) in switch:
            self.config.output = switch[mode, output]
        elif (mode, output) in (("windows", "tokens"), ("truncate", "windows")):
            raise NotSupportedError(f"--long {mode} is not available for this model's {output} output")

    @property
    def backend(self) -> str:
        """The engine actually running: `auto` resolved on this machine."""
        return inference_backends.resolve_backend(self.config.backend, self.config.precision, self.device)

    def _engine(self):
        """None for PyTorch, else the exported model's runner (exported once, then read from the cache)."""
        backend = self.backend
        if backend == "torch":
            return None
        if self._runner is None:
            int8 = self.config.precision == "int8"
            calibration = self._calibration_batches() if int8 else [self._example()]
            self._runner = inference_backends.build_runner(
                self.model[0].auto_model,
                backend,
                self.config.precision,
                inference_backends.weights_fingerprint(self.weights_dir),
                calibration,
            )
        return self._runner

    def _tokenize(self, texts: list[str]) -> dict:
        # sentence-transformers 6 calls it preprocess; truncation and padding as its encode() does
        features = (getattr(self.model, "preprocess", None) or self.model.tokenize)(texts)
        return {k: v for k, v in features.items() if k in self.tokenizer.model_input_names}

    def _example(self) -> dict:
        texts = ["An example to trace.", "Two texts, so that the batch size is not traced as a constant."]
        return {k: v.numpy() for k, v in self._tokenize(texts).items()}

    def _calibration_batches(self, batch_size: int = 8):
        texts = inference_backends.calibration_texts()
        for start in range(0, len(texts), batch_size):
            yield {k: v.numpy() for k, v in self._tokenize(texts[start : start + batch_size]).items()}

    def _run_modules(self, features: dict, engine) -> dict:
        """The whole sentence-transformers pipeline on one tokenised batch, the transformer on `engine`."""
        import torch

        hidden = engine({k: v.numpy() for k, v in features.items()})
        features = {**features, "token_embeddings": torch.from_numpy(hidden)}
        with torch.inference_mode():
            for module in list(self.model)[1:]:  # pooling, normalize, dense...
                features = module(features)
        return features

    def _encode_with_engine(self, texts: list[str], batch_size: int, engine) -> Vectors:
        order = np.argsort([-len(t) for t in texts], kind="stable")  # similar lengths share a batch
        dense, tokens = [None] * len(texts), [None] * len(texts)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            features = self._run_modules(self._tokenize([texts[i] for i in rows]), engine)
            lengths = features["attention_mask"].sum(1).tolist()
            for i, row in enumerate(rows):
                if self.config.output == "tokens":
                    tokens[row] = features["token_embeddings"][i, : lengths[i]].float().numpy()
                else:
                    dense[row] = features["sentence_embedding"][i].float().numpy()
            report_batch(start + len(rows), len(texts))
        if self.config.output == "tokens":
            items = [l2_normalize(t) for t in tokens] if self.config.normalize else tokens
            return MultiVectors.from_list(items, [np.arange(len(t)) for t in items])
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = np.stack(dense).astype(np.float32)
        return l2_normalize(vectors) if self.config.normalize else vectors

    @property
    def multi_vector(self) -> bool:
        return self.config.output in ("tokens", "windows")

    @property
    def vectors_are_passages(self) -> bool:
        return self.config.output == "windows"

    @property
    def normalized(self) -> bool:
        return self.config.normalize

    @property
    def dim(self) -> int:
        model = self.model  # sentence-transformers 6 renamed the method
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    @property
    def max_tokens(self) -> int | None:
        return None if self.config.output in ("chunks", "windows") else self.max_seq_length

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def to(self, device: str) -> SBertEncoder:
        self.model.to(device)
        self.device = device
        self._runner = None
        return self

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        texts = list(texts)
        if self.config.output == "chunks":
            return self._encode_chunks(texts, batch_size)
        if self.config.output == "windows":
            return self._encode_windows(texts, batch_size)
        engine = self._engine()
        if engine is not None:
            return self._encode_with_engine(texts, batch_size, engine)
        if self.config.output == "mean":
            if not texts:
                return np.zeros((0, self.dim), dtype=np.float32)
            with self._reporting_batches(len(texts)):
                vectors = self.model.encode(
                    texts,
                    batch_size=batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                    normalize_embeddings=self.config.normalize,
                )
            return np.asarray(vectors, dtype=np.float32)
        with self._reporting_batches(len(texts)):
            tokens = self.model.encode(
                texts, batch_size=batch_size, show_progress_bar=False, output_value="token_embeddings"
            )
        items = [t.float().cpu().numpy() for t in tokens]
        if self.config.normalize:
            items = [l2_normalize(t) for t in items]
        return MultiVectors.from_list(items, [np.arange(len(t)) for t in items])

    @contextmanager
    def _reporting_batches(self, total: int):
        """sentence-transformers' encode runs its batches itself: each forward pass reports its rows."""
        done = 0

        def batch_done(module, args, output):
            nonlocal done
            done += len(output["attention_mask"])
            report_batch(done, total)

        hook = self.model.register_forward_hook(batch_done)
        try:
            yield
        finally:
            hook.remove()

    def windows(self, texts: Sequence[str]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """Each text's token ids cut into windows of at most `max_seq_length` tokens (sharing
        `window_overlap` with the one before), each wrapped in [CLS] ... [SEP]; returns the windows, per
        window the index of its text, and per window the position of its first token in the text."""
        tokenizer = self.tokenizer
        ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        windows, owners, starts = [], [], []
        for index, tokens in enumerate(ids):
            for start, window in token_windows(tokens, self.max_seq_length - 2, self.config.window_overlap):
                windows.append([tokenizer.cls_token_id, *window, tokenizer.sep_token_id])
                owners.append(index)
                starts.append(start)
        return windows, np.asarray(owners, dtype=np.int64), np.asarray(starts, dtype=np.int64)

    def passage_token_ranges(self, length: int) -> list[tuple[int, int]]:
        """The windows the windows output reads (see windows())."""
        width = self.max_seq_length - 2
        return [
            (start, start + len(window))
            for start, window in token_windows(range(length), width, self.config.window_overlap)
        ]

    def _encode_windows(self, texts: list[str], batch_size: int) -> MultiVectors:
        long = [i for i, text in enumerate(texts) if is_long(text)]
        if not long:
            return self._encode_windows_at_once(texts, batch_size)
        # the usual texts together as always; each long one streamed, its windows a batch at a time
        items: list = [None] * len(texts)
        positions: list = [None] * len(texts)
        short = [i for i in range(len(texts)) if i not in set(long)]
        if short:
            with reporting_texts(0, len(short), len(texts)):
                done = self._encode_windows_at_once([texts[i] for i in short], batch_size)
            for k, i in enumerate(short):
                items[i] = done[k]
                positions[i] = done.positions[done.offsets[k] : done.offsets[k + 1]]
        for k, i in enumerate(long):
            with reporting_texts(len(short) + k, 1, len(texts)):
                parts = list(self._streamed_windows(texts[i], batch_size))
            vectors = np.concatenate([v for v, _ in parts])
            items[i] = l2_normalize(vectors) if self.config.normalize else vectors
            positions[i] = np.concatenate([p for _, p in parts])
        return MultiVectors.from_list(items, positions)

    def _encode_windows_at_once(self, texts: list[str], batch_size: int) -> MultiVectors:
        windows, owners, starts = self.windows(texts)
        vectors = self._embed_windows(windows, batch_size)
        if self.config.normalize:
            vectors = l2_normalize(vectors)
        # windows come out text by text, in order: the offsets are the running count of each text's windows
        offsets = np.concatenate([[0], np.cumsum(np.bincount(owners, minlength=len(texts)))])
        return MultiVectors(vectors.astype(np.float32), offsets, starts)

    def _encode_chunks(self, texts: list[str], batch_size: int) -> np.ndarray:
        long = [i for i, text in enumerate(texts) if is_long(text)]
        short = [i for i in range(len(texts)) if i not in set(long)]
        sums = np.zeros((len(texts), self.dim), dtype=np.float64)
        counts = np.zeros(len(texts), dtype=np.int64)
        if short:
            windows, owners, _ = self.windows([texts[i] for i in short])
            with reporting_texts(0, len(short), len(texts)):
                vectors = self._embed_windows(windows, batch_size)
            rows = np.asarray(short, dtype=np.int64)[owners]
            np.add.at(sums, rows, vectors)
            counts += np.bincount(rows, minlength=len(texts))
        for k, i in enumerate(long):  # a running sum in window order: the same additions as np.add.at makes
            with reporting_texts(len(short) + k, 1, len(texts)):
                for vectors, _ in self._streamed_windows(texts[i], batch_size):
                    for vector in vectors:
                        sums[i] += vector
                    counts[i] += len(vectors)
        means = (sums / counts[:, None]).astype(np.float32)
        return l2_normalize(means) if self.config.normalize else means

    def _streamed_windows(self, text: str, batch_size: int):
        """(vectors, first-token positions) of a long text's windows, `batch_size` windows at a time: the
        windows `windows()` cuts, from ids tokenized block by block, so memory holds a block and a batch."""
        tokenizer = self.tokenizer

        def ids(block: str) -> list[int]:
            return tokenizer(block, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]

        width, overlap = self.max_seq_length - 2, self.config.window_overlap
        batch_size = stream_batch(batch_size, self.max_seq_length)
        batch: list[list[int]] = []
        starts: list[int] = []
        for start, window in streamed_token_windows(tokenized_blocks(ids, text), width, overlap):
            batch.append([tokenizer.cls_token_id, *window, tokenizer.sep_token_id])
            starts.append(start)
            if len(batch) == batch_size:
                yield self._embed_windows(batch, batch_size), np.asarray(starts, dtype=np.int64)
                batch, starts = [], []
        if batch:
            yield self._embed_windows(batch, batch_size), np.asarray(starts, dtype=np.int64)

    def _embed_windows(self, windows: list[list[int]], batch_size: int) -> np.ndarray:
        """The sentence embedding of each window (token ids with specials), batched longest first."""
        import torch

        engine = self._engine()
        pad = self.tokenizer.pad_token_id or 0
        order = np.argsort([-len(w) for w in windows], kind="stable")
        out = np.zeros((len(windows), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                width = len(windows[rows[0]])
                input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
                attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
                for i, row in enumerate(rows):
                    input_ids[i, : len(windows[row])] = torch.tensor(windows[row])
                    attention_mask[i, : len(windows[row])] = 1
                features = {"input_ids": input_ids, "attention_mask": attention_mask}
                if "token_type_ids" in self.tokenizer.model_input_names:
                    features["token_type_ids"] = torch.zeros_like(input_ids)
                if engine is not None:
                    out[rows] = self._run_modules(features, engine)["sentence_embedding"].float().numpy()
                else:
                    features = {k: v.to(self.model.device) for k, v in features.items()}
                    out[rows] = self.model(features)["sentence_embedding"].float().cpu().numpy()
                report_batch(start + len(rows), len(windows))
        return out

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.model.save(str(directory / ST_SUBDIR))
        self.write_config(directory)

    def export_sentence_transformers(self, directory: str | Path) -> None:
        """The sentence-transformers model underneath as a folder `SentenceTransformer(directory)` loads (a
        docembed model folder cannot be one: both keep a config.json at the top). It gives this model's
        vectors for output="mean"; "tokens" and "chunks" are docembed's use of it (see `docembed export`)."""
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize

        model = self.model
        if self.config.normalize and not any(isinstance(module, Normalize) for module in model):
            # docembed normalises this model's output itself: the exported pipeline must say so too
            model = SentenceTransformer(modules=[*model, Normalize()], device=str(model.device))
        model.save(str(directory))

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> SBertEncoder:
        payload = read_config(directory)
        config = SBertConfig.from_dict(payload["config"])
        st_dir = Path(directory) / ST_SUBDIR
        if not (st_dir / "modules.json").exists():
            raise CorruptModelError(f"{directory}: {ST_SUBDIR}/ is missing or incomplete")
        return cls(config, device=device, _path=str(st_dir))
