"""The long-document student (Burian, "Document embedding using Transformers"): a Longformer with
sliding-window attention, mean-pooled over its tokens, later distilled from SBERT and Paragraph Vector.

Two ways to get one:
- a real Longformer checkpoint (`allenai/longformer-base-4096`, or a local copy of it) is wrapped as is;
- `convert_to_long` turns a short BERT/RoBERTa-style checkpoint (the offline all-MiniLM-L6-v2, say) into a
  Longformer: position embeddings tiled up to the new length, every layer's self-attention switched to a
  sliding window, and the global projections (query_global/key_global/value_global) copied from the local
  ones. Mean pooling needs no global attention, so those copies only matter to users who add it.

Position ids: transformers' Longformer is RoBERTa-style. It numbers real tokens from `pad_token_id + 1`
(padding tokens get `pad_token_id`). BERT numbers positions from 0 with no offset, RoBERTa from
`pad_token_id + 1`. `convert_to_long` therefore writes the source's position `p` (p counted from 0 over real
tokens) into row `pad_token_id + 1 + p` of the new table, reading it from row `source_offset + p mod n` of the
old one (`source_offset` is 0 for BERT, `pad + 1` for RoBERTa; `n` the source's usable positions).

Saved format: config.json (the docembed config, with the Longformer's own config inside it),
model.safetensors (the LongformerModel weights) and the tokenizer's json/txt files under `tokenizer/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from docembed.errors import CorruptModelError, DocembedError, UsageError
from docembed.models import inference_backends
from docembed.models.base import (
    ALL_LONG_MODES,
    Encoder,
    EncoderConfig,
    check_long_queries,
    check_max_length,
    check_temperature,
    load_state_dict,
    read_config,
    save_state_dict,
)
from docembed.models.families import register
from docembed.runtime import report_batch, reporting_texts
from docembed.tensors import (
    is_long,
    stream_batch,
    streamed_token_windows,
    token_windows,
    tokenized_blocks,
)
from docembed.types import Vectors, l2_normalize

TOKENIZER_SUBDIR = "tokenizer"
LONG_DOCUMENTS = ALL_LONG_MODES
# Sources whose absolute positions start after the padding index (fairseq's make_positions).
ROBERTA_STYLE = {"roberta", "xlm-roberta", "camembert", "longformer"}
BERT_STYLE = {"bert"}
# Aliases accepted as a conversion source: the offline SBERT weights (a plain BertModel underneath).
SOURCE_ALIASES = {
    "sbert": "all-MiniLM-L6-v2",
    "minilm": "all-MiniLM-L6-v2",
    "all-MiniLM-L6-v2": "all-MiniLM-L6-v2",
}


@dataclass
class StudentConfig(EncoderConfig):
    max_length: int = 4096  # tokens read per document, [CLS] and [SEP] included
    attention_window: int = 256  # sliding-window size (even; each token sees window/2 on either side)
    normalize: bool = True  # unit-length output, as the SBERT teacher's
    source: str = ""  # what the student was converted from (informational)
    longformer: dict[str, Any] = field(default_factory=dict)  # the transformers LongformerConfig
    # A document longer than max_length: "truncate" reads its first max_length tokens; "windows" reads all
    # of it, window by window, and averages the windows weighted by their lengths. Windows is the default
    # since 2026-11-25 (the zoo model's too), chosen on bench_long's val man pages (median 10k tokens).
    # "late-chunks" reads all of it the same way and keeps one vector per `chunk_tokens` tokens, each the mean
    # of those tokens' states in the long pass (late chunking, Günther et al. 2024): multi-vector.
    long_documents: str = "windows"
    chunk_tokens: int = 256  # late-chunks: tokens per vector (SBERT's window, the depth teacher's)
    # late-chunks: how a document's chunks pool when scored, 0 = the best chunk, > 0 smoother (scoring.py)
    passage_temperature: float = 0.0
    # a long query (scoring.LONG_QUERY_PASSAGES, a half): "passages" scores each, "whole" the texts' means
    long_queries: str = "passages"

    INFERENCE_SETTINGS: ClassVar[tuple[str, ...]] = ("passage_temperature", "long_queries")

    def __post_init__(self):
        check_temperature(self.passage_temperature)
        check_long_queries(self.long_queries)


@register
class StudentEncoder(inference_backends.InferenceChoice, Encoder):
    family = "student"
    config_class = StudentConfig
    capabilities = frozenset({"long", "backends", "max-length", "passages"})
    # encode() uses models/local_attention.py (same outputs, 1.5-2.3x faster on CPU); not saved.
    local_attention = True

    def __init__(self, config: StudentConfig, model=None, tokenizer=None, name: str | None = None):
        super().__init__(config, name)
        if model is None:
            from transformers import LongformerConfig, LongformerModel

            if not config.longformer:
                raise UsageError("a student needs a Longformer: use `docembed convert-long` to make one")
            model = LongformerModel(LongformerConfig(**config.longformer), add_pooling_layer=False)
        self.model = model
        self.tokenizer = tokenizer
        self.device = "cpu"
        self._runner = None  # the exported pass, built on first use (then read from the cache)

    # --- built from MiniLM (the zoo and train-distill start here) -------------------------------------
    @classmethod
    def offline_base(cls, config: dict[str, Any]) -> str | None:
        return "minilm" if config.get("source", "") in SOURCE_ALIASES else None

    @classmethod
    def from_base(cls, config, files: Path | None = None, seed: int = 0) -> StudentEncoder:
        """`convert_long` of the config's source at the length its positions were tiled to (a trained
        student may read fewer tokens than it was built for: `max_length` is kept)."""
        import torch

        trained = config if isinstance(config, StudentConfig) else StudentConfig.from_dict(config)
        built_length = trained.max_length
        if trained.longformer:
            pad = int(trained.longformer.get("pad_token_id", 0))
            built_length = int(trained.longformer["max_position_embeddings"]) - pad - 1
        torch.manual_seed(seed)
        encoder = convert_long(trained.source, built_length, trained.attention_window, trained.normalize)
        encoder.config.max_length = trained.max_length
        return encoder

    @property
    def weights_module(self):
        return self.model

    # --- encoding -----------------------------------------------------------------------------------
    @property
    def normalized(self) -> bool:
        return self.config.normalize

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_tokens(self) -> int | None:
        return self.config.max_length if self.config.long_documents == "truncate" else None

    @property
    def multi_vector(self) -> bool:
        return self.config.long_documents == "late-chunks"

    @property
    def vectors_are_passages(self) -> bool:
        return self.multi_vector  # one vector per 256 tokens of the long pass

    def set_max_length(self, max_length: int) -> None:
        """Read `max_length` tokens in one pass ([CLS] and [SEP] included). Beyond the positions the model
        has, its table is continued the way convert_long built it (source position p mod n: the zoo
        student's positions repeat MiniLM's 512), while the sliding window keeps time and memory linear."""
        check_max_length(max_length)
        self.config.max_length = max_length
        self.tokenizer.model_max_length = max_length
        self._runner = None

    def to(self, device: str) -> StudentEncoder:
        self.model.to(device)
        self.device = device
        self._runner = None
        return self

    def set_inference(self, backend: str | None = None, precision: str | None = None) -> StudentEncoder:
        """Run the Longformer's pass on OpenVINO / ONNX Runtime or in int8 (models/student_inference.py);
        pooling is unchanged."""
        backend, precision = backend or self.inference[0], precision or self.inference[1]
        inference_backends.resolve_backend(backend, precision, self.device)  # fail now, not mid-corpus
        self.inference, self._runner = (backend, precision), None
        return self

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, truncated to max_length ([CLS] ... [SEP] included)."""
        out = self.tokenizer(list(texts), truncation=True, max_length=self.config.max_length)
        return out["input_ids"]

    def set_long_documents(self, mode: str) -> None:
        if mode not in LONG_DOCUMENTS:
            raise UsageError(f"--long must be one of {', '.join(LONG_DOCUMENTS)}, got {mode!r}")
        self.config.long_documents = mode

    def encode(self, texts: Sequence[str], batch_size: int = 8) -> Vectors:
        """One vector per text, or with long_documents "late-chunks" a set of them (MultiVectors)."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.config.long_documents == "late-chunks":
            return self._late_chunks(texts, batch_size)
        if self.config.long_documents == "windows":
            out = self._windowed_means(texts, batch_size)
        else:
            out = self._means(self.tokenize(texts), batch_size)
        return l2_normalize(out) if self.config.normalize else out

    def _passes(self, texts: list[str]) -> tuple[list[list[int]], list[int], list[int]]:
        """Every text cut into passes of max_length tokens, each wrapped in [CLS] ... [SEP]: (the passes, the
        text each belongs to, the token index of each pass's first text token)."""
        tokens = self.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        passes, owners, starts = [], [], []
        for index, text_tokens in enumerate(tokens):
            for start, window in token_windows(text_tokens, self.config.max_length - 2):
                passes.append([cls, *window, sep])
                owners.append(index)
                starts.append(start)
        return passes, owners, starts

    def passage_token_ranges(self, length: int) -> list[tuple[int, int]]:
        """The late chunks: chunk_tokens at a time within each max_length pass (see _late_chunks)."""
        ranges, size = [], self.config.chunk_tokens
        for start, window in token_windows(range(length), self.config.max_length - 2):
            stop = start + len(window)
            ranges += [(a, min(a + size, stop)) for a in range(start, max(stop, start + 1), size)]
        return ranges

    def _streamed_passes(self, text: str, batch_size: int):
        """A long text's passes (as `_passes` cuts them) with their first-token positions, `batch_size` at a
        time (fewer for long passes: tensors.stream_batch), its ids tokenized block by block: memory holds a
        block and a batch, not the text's ids."""
        batch_size = stream_batch(batch_size, self.config.max_length)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id

        def ids(block: str) -> list[int]:
            encoded = self.tokenizer(block, add_special_tokens=False, truncation=False, verbose=False)
            return encoded["input_ids"]

        passes, starts = [], []
        for start, window in streamed_token_windows(tokenized_blocks(ids, text), self.config.max_length - 2):
            passes.append([cls, *window, sep])
            starts.append(start)
            if len(passes) == batch_size:
                yield passes, starts
                passes, starts = [], []
        if passes:
            yield passes, starts

    def _windowed_means(self, texts: list[str], batch_size: int) -> np.ndarray:
        """The mean token vector of the whole of each text: windows of max_length tokens, each pooled, then
        averaged weighted by their lengths (so the result is the mean over all the windows' tokens)."""
        long = [i for i, text in enumerate(texts) if is_long(text)]
        short = [i for i in range(len(texts)) if i not in set(long)]
        sums = np.zeros((len(texts), self.dim), dtype=np.float64)
        totals = np.zeros(len(texts), dtype=np.float64)
        if short:
            windows, owners, _ = self._passes([texts[i] for i in short])
            with reporting_texts(0, len(short), len(texts)):
                means = self._means(windows, batch_size).astype(np.float64)
            weights = np.array([len(w) for w in windows], dtype=np.float64)
            rows = np.asarray(short, dtype=np.int64)[np.asarray(owners, dtype=np.int64)]
            np.add.at(sums, rows, means * weights[:, None])
            totals += np.bincount(rows, weights=weights, minlength=len(texts))
        for k, i in enumerate(long):  # the same additions, pass after pass
            with reporting_texts(len(short) + k, 1, len(texts)):
                for passes, _ in self._streamed_passes(texts[i], batch_size):
                    means = self._means(passes, batch_size).astype(np.float64)
                    for mean, weight in zip(means, [float(len(p)) for p in passes], strict=True):
                        sums[i] += mean * weight
                        totals[i] += weight
        return (sums / totals[:, None]).astype(np.float32)

    def _late_chunks(self, texts: list[str], batch_size: int):
        """Per text, one vector per chunk_tokens of its tokens: the mean of their last-layer states in the
        pass that read them (a chunk never spans two passes). A pass's [CLS] joins its first chunk and its
        [SEP] its last, so a text of one chunk gets exactly the mean output's vector."""
        from docembed.types import MultiVectors

        vectors: list[list[np.ndarray]] = [[] for _ in texts]
        positions: list[list[int]] = [[] for _ in texts]
        long = [i for i, text in enumerate(texts) if is_long(text)]
        short = [i for i in range(len(texts)) if i not in set(long)]
        if short:
            passes, owners, starts = self._passes([texts[i] for i in short])
            with reporting_texts(0, len(short), len(texts)):
                self._chunk_vectors(
                    passes, [short[o] for o in owners], starts, batch_size, vectors, positions
                )
        for k, i in enumerate(long):  # a batch of passes at a time
            with reporting_texts(len(short) + k, 1, len(texts)):
                for passes, starts in self._streamed_passes(texts[i], batch_size):
                    self._chunk_vectors(passes, [i] * len(passes), starts, batch_size, vectors, positions)
        items = [np.stack(v).astype(np.float32) for v in vectors]
        if self.config.normalize:
            items = [l2_normalize(v) for v in items]
        return MultiVectors.from_list(items, [np.asarray(p, dtype=np.int64) for p in positions])

    def _chunk_vectors(self, passes, owners, starts, batch_size, vectors, positions) -> None:
        """Append each pass's chunk vectors and their first-token positions to its text's lists."""
        size = self.config.chunk_tokens
        for row, states in self._token_states(passes, batch_size):
            chunks = max(1, -(-(len(states) - 2) // size))
            bounds = [0, *(1 + j * size for j in range(1, chunks)), len(states)]
            for j in range(chunks):
                vectors[owners[row]].append(states[bounds[j] : bounds[j + 1]].mean(axis=0))
                positions[owners[row]].append(starts[row] + j * size)

    def _means(self, ids: list[list[int]], batch_size: int) -> np.ndarray:
        """The mean of the last layer's states for each token-id sequence (not normalised)."""
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        for row, states in self._token_states(ids, batch_size):
            out[row] = states.mean(axis=0)
        return out

    def _token_states(self, ids: list[list[int]], batch_size: int):
        """(index into `ids`, its last-layer states (length, dim) as float32) for every sequence, longest
        first, so that each batch pads to similar lengths."""
        import torch

        from docembed.tensors import pad_sequences

        self._fit_positions()
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    rows = order[start : start + batch_size]
                    input_ids, mask = pad_sequences([ids[i] for i in rows], self.pad_id)
                    if self.backend != "torch":
                        hidden = self._exported().hidden(input_ids, mask)
                    else:
                        ids_on, mask_on = input_ids.to(self.device), mask.to(self.device)
                        hidden = self.hidden_states(ids_on, mask_on, self.local_attention)
                    hidden = hidden.float().cpu().numpy()
                    for position, row in enumerate(rows):
                        yield row, hidden[position, : len(ids[row]) or 1]
                    report_batch(start + len(rows), len(order))
        finally:
            self.model.train(was_training)

    def _fit_positions(self) -> None:
        """Continue the position table up to max_length (set_max_length) by its own period, the way
        convert_long tiled it."""
        import torch

        table = self.model.embeddings.position_embeddings
        rows = self.config.max_length + self.pad_id + 1
        if rows <= table.num_embeddings:
            return
        old = table.weight.data
        real = old[self.pad_id + 1 :]  # the rows of real tokens' positions
        new = torch.empty((rows, old.shape[1]), dtype=old.dtype, device=old.device)
        new[: self.pad_id + 1] = old[: self.pad_id + 1]
        new[self.pad_id + 1 :] = real[torch.arange(rows - self.pad_id - 1) % _period(real)]
        self.model.embeddings.position_embeddings = torch.nn.Embedding.from_pretrained(
            new, freeze=not table.weight.requires_grad, padding_idx=table.padding_idx
        )
        self.model.config.max_position_embeddings = rows

    def _exported(self):
        if self._runner is None:
            from docembed.models.student_inference import HiddenStatesRunner, calibration_batches

            batches = calibration_batches(self)
            self._runner = HiddenStatesRunner(self.model, batches, self.backend, self.inference[1])
        return self._runner

    @property
    def pad_id(self) -> int:
        return int(self.model.config.pad_token_id)

    def forward(self, input_ids, attention_mask, local_attention: bool = False):
        """Masked mean of the last layer's token vectors (differentiable; the training recipe uses it).
        `local_attention`: the blocked sliding-window attention, for inference (same outputs)."""
        return masked_mean(self.hidden_states(input_ids, attention_mask, local_attention), attention_mask)

    def hidden_states(self, input_ids, attention_mask, local_attention: bool = True):
        """The last layer's states: by the blocked local attention, or by transformers' own pass."""
        if local_attention:
            from docembed.models.local_attention import local_forward

            return local_forward(self.model, input_ids, attention_mask)
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    # --- save / load --------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        self.config.longformer = _longformer_dict(self.model.config)
        self.write_config(directory)
        save_state_dict(self.model, directory)
        self.tokenizer.save_pretrained(str(directory / TOKENIZER_SUBDIR))

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> StudentEncoder:
        from transformers import AutoTokenizer

        payload = read_config(directory)
        config = StudentConfig.from_dict(payload["config"])
        encoder = cls(config)
        load_state_dict(encoder.model, directory)
        tok_dir = Path(directory) / TOKENIZER_SUBDIR
        if not tok_dir.is_dir():
            raise CorruptModelError(f"{directory}: {TOKENIZER_SUBDIR}/ is missing")
        encoder.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
        encoder.model.eval()
        return encoder.to(device)


def _period(rows) -> int:
    """The smallest p with rows[i] == rows[i + p] throughout (convert_long's tiling repeats the source's
    positions: 512 for MiniLM), or len(rows) when the table does not repeat (positions trained apart)."""
    import torch

    return next((p for p in range(1, len(rows)) if torch.equal(rows[p:], rows[:-p])), len(rows))


def masked_mean(hidden, attention_mask):
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def _longformer_dict(config) -> dict[str, Any]:
    values = config.to_dict()
    # Keep what rebuilds the architecture; drop transformers' bookkeeping that changes between versions.
    for key in ("transformers_version", "architectures", "_name_or_path", "torch_dtype", "dtype"):
        values.pop(key, None)
    return values


# --- conversion ---------------------------------------------------------------------------------------
def resolve_source(source: str) -> str:
    if source in SOURCE_ALIASES:
        from docembed.models.offline import resolve_sbert

        return resolve_sbert(SOURCE_ALIASES[source])
    return source


def convert_to_long(model, tokenizer, max_length: int = 4096, attention_window: int = 256):
    """A LongformerModel with `model`'s weights (a BertModel/RobertaModel-style encoder) that reads
    `max_length` tokens; returns it (eval mode)."""
    import torch
    from transformers import LongformerConfig, LongformerModel

    source = model.config
    kind = source.model_type
    if kind not in ROBERTA_STYLE | BERT_STYLE:
        raise UsageError(
            f"convert-long supports BERT- and RoBERTa-style encoders, not {kind!r} "
            "(its attention or positions differ)"
        )
    if getattr(source, "position_embedding_type", "absolute") not in ("absolute", None):
        raise UsageError("convert-long needs absolute position embeddings")
    if attention_window < 2 or attention_window % 2:
        raise UsageError(f"--attention-window must be an even number >= 2, got {attention_window}")
    check_max_length(max_length)
    pad = source.pad_token_id if source.pad_token_id is not None else 0
    config = LongformerConfig(
        vocab_size=source.vocab_size,
        hidden_size=source.hidden_size,
        num_hidden_layers=source.num_hidden_layers,
        num_attention_heads=source.num_attention_heads,
        intermediate_size=source.intermediate_size,
        hidden_act=source.hidden_act,
        hidden_dropout_prob=source.hidden_dropout_prob,
        attention_probs_dropout_prob=source.attention_probs_dropout_prob,
        type_vocab_size=source.type_vocab_size,
        layer_norm_eps=source.layer_norm_eps,
        initializer_range=source.initializer_range,
        pad_token_id=pad,
        bos_token_id=getattr(source, "bos_token_id", None),
        eos_token_id=getattr(source, "eos_token_id", None),
        # Real tokens use rows pad+1 .. pad+max_length; Longformer pads the input up to a multiple of the
        # window, but those padding tokens take the padding row, so no more rows are needed.
        max_position_embeddings=max_length + pad + 1,
        attention_window=[attention_window] * source.num_hidden_layers,
    )
    long_model = LongformerModel(config, add_pooling_layer=False)
    old = model.state_dict()
    new = long_model.state_dict()
    filled = set()
    with torch.no_grad():
        for key, tensor in new.items():
            if key == "embeddings.position_embeddings.weight":
                tensor.copy_(tile_positions(old[key], len(tensor), pad, _source_offset(source)))
            elif key in old and old[key].shape == tensor.shape:
                tensor.copy_(old[key])
            elif "_global." in key and key.replace("_global.", ".") in old:
                tensor.copy_(old[key.replace("_global.", ".")])
            else:
                continue
            filled.add(key)
    missing = set(new) - filled
    if missing:
        raise DocembedError(f"cannot convert {kind}: no source weights for {sorted(missing)[:5]}")
    long_model.load_state_dict(new)
    long_model.eval()
    return long_model


def _source_offset(config) -> int:
    if config.model_type in ROBERTA_STYLE:
        return (config.pad_token_id if config.pad_token_id is not None else 1) + 1
    return 0


def tile_positions(old, rows: int, pad: int, source_offset: int):
    """New position table of `rows` rows: row pad+1+p holds source position p mod n (n = the source's
    usable positions, which start at row `source_offset` of `old`). Rows up to `pad` keep the source's
    rows when it has them (its padding row), zeros otherwise."""
    import torch

    usable = old[source_offset:]
    if len(usable) < 1:
        raise DocembedError("the source model has no usable position embeddings")
    table = torch.zeros((rows, old.shape[1]), dtype=old.dtype)
    head = min(pad + 1, rows)
    if source_offset and len(old) >= head:
        table[:head] = old[:head]
    count = rows - (pad + 1)
    if count > 0:
        index = torch.arange(count) % len(usable)
        table[pad + 1 :] = usable[index]
    return table


def convert_long(
    source: str, max_length: int = 4096, attention_window: int = 256, normalize: bool = True
) -> StudentEncoder:
    """Load `source` (alias, local path or hub id) and return a long student built from it. A source that
    already is a Longformer (allenai/longformer-base-4096) is wrapped, with its window reset if asked."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = resolve_source(source)
    try:
        hf_config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise DocembedError(f"cannot load {source!r} as a transformers checkpoint: {error}") from None
    if hf_config.model_type == "longformer":
        from transformers import LongformerModel

        hf_config.attention_window = [attention_window] * hf_config.num_hidden_layers
        model = LongformerModel.from_pretrained(path, config=hf_config, add_pooling_layer=False)
        limit = hf_config.max_position_embeddings - hf_config.pad_token_id - 1
        if max_length > limit:
            raise UsageError(f"{source} reads at most {limit} tokens; --max-length {max_length} is too long")
    else:
        model = convert_to_long(AutoModel.from_pretrained(path), tokenizer, max_length, attention_window)
    tokenizer.model_max_length = max_length
    config = StudentConfig(
        max_length=max_length,
        attention_window=attention_window,
        normalize=normalize,
        source=str(source),
        longformer=_longformer_dict(model.config),
    )
    return StudentEncoder(config, model=model, tokenizer=tokenizer, name="student")
