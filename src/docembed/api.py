"""The Python face of docembed: `docembed.load(name).encode(texts)`, as sentence-transformers users expect.

A `Model` wraps one `Encoder` (any family) and runs it through the same chunked encode loop as `docembed
encode` (encoding.encode_texts), so the API and the CLI give the same vectors bit for bit. What it adds is
what notebook users ask for: a single string gives one embedding, optional normalisation, mean pooling of
a multi-vector model, torch output, prompts, a similarity matrix, and silent loading (docs/python.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from docembed.encoding import coverage_of, encode_texts
from docembed.errors import TruncationWarning, UsageError
from docembed.models.base import Encoder, EncodeSettings, save_encoder
from docembed.models.registry import load_model
from docembed.runtime import progress_shown, resolve_device
from docembed.scoring import passage_scoring, score_matrix
from docembed.types import MultiVectors, Vectors, normalize_vectors

ConvertTo = Literal["numpy", "torch"]
Pooling = Literal["mean"] | None
PROMPT_NAMES = ("query", "document")
OUTPUT_VALUES = ("sentence_embedding", "token_embeddings")
# sentence-transformers' encode precisions: the embeddings' storage (quantize_embeddings), not the model's
EMBEDDING_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
# sentence-transformers' encode keywords docembed does not take, and why (named in the error)
NOT_TAKEN = {
    "pool": "sentence-transformers' multi-process pool: use `docembed encode --workers N`",
    "chunk_size": "sentence-transformers' multi-process chunks: use `docembed encode --workers N`",
}


def load(
    name_or_dir: str | Path,
    device: str = "auto",
    *,
    ratio: float | None = None,
    long_documents: str | None = None,
    backend: str | None = None,
    precision: str | None = None,
    selector: str | None = None,
    max_vectors: int | None = None,
    max_length: int | None = None,
    prompts: dict[str, str] | None = None,
    passage_temperature: float | None = None,
    long_queries: str | None = None,
) -> Model:
    """A model by built-in name (`sbert`, `nugget`, `student`, ...: `docembed models` lists them), saved
    directory (docembed's or any sentence-transformers folder), name under the models home, or hub id.

    device: "auto" (a GPU when torch sees one), "cpu", "cuda" or "cuda:N". ratio: NUGGET's share of token
    vectors kept. long_documents: "truncate" or "windows" (sbert, nugget, student: a document longer than one
    pass is cut, or read whole in windows; `max_tokens` is then None), or for the student "late-chunks" (one
    vector per 256 tokens, pooled from its long passes: multi-vector). max_length: the student's tokens per
    pass (positions beyond the 2,048 it was trained at are tiled, as it was built). backend / precision: the
    inference engine and arithmetic of the transformer families (`precision="int8"` quantises the model's
    weights for speed; it is not the embeddings' storage type, see `quantize_embeddings`). selector /
    max_vectors: NUGGET's choice of token vectors, the learned "scorer" or a rule ("idf", "prune", "pool",
    "chunk"), and a cap per window (docs/nugget_baselines.md). prompts: text put before a query / document
    by `encode_query` / `encode_document` (keys "query", "document"), as for models trained with
    instructions. passage_temperature: how a document's passages pool when it is scored (sbert-windows, the
    student's late chunks): 0 the best passage, larger values smoother, towards the mean of all of them.
    long_queries: how a long query (6 passages or more, a half) is scored, "passages" (each of them)
    or "whole" (the two texts' passage means, which validation chose for sbert-windows' default)."""
    settings = EncodeSettings(ratio, long_documents, backend, precision, selector, max_vectors, max_length,
                              passage_temperature, long_queries)  # fmt: skip
    encoder = settings.apply(load_model(str(name_or_dir), device=resolve_device(device)))
    return Model(encoder, prompts=prompts)


class Model:
    """A loaded model. `encode` returns, per text, one vector (dense models, or any model with
    pooling="mean") or a set of vectors (multi-vector models: a `MultiVectors`, flat `vectors` plus
    `offsets`, with `to_list()` / iteration / `[i]` giving one `(k_i, dim)` array per text)."""

    def __init__(self, encoder: Encoder, prompts: dict[str, str] | None = None):
        unknown = set(prompts or {}) - set(PROMPT_NAMES)
        if unknown:
            raise UsageError(
                f"prompts are named {' or '.join(PROMPT_NAMES)}, not {', '.join(sorted(unknown))}"
            )
        self.encoder = encoder
        self.prompts = dict(prompts or {})

    def __repr__(self) -> str:
        if getattr(self.encoder, "scorer_only", False):  # bm25, a fusion: scores, no embeddings
            return f"docembed.Model({self.name!r}, family={self.family!r}, scorer)"
        kind = "multi-vector" if self.is_multi_vector else "dense"
        return f"docembed.Model({self.name!r}, family={self.family!r}, {kind}, dim={self.dim})"

    # --- what the model is ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.encoder.name

    @property
    def family(self) -> str:
        return self.encoder.family

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @property
    def is_multi_vector(self) -> bool:
        return self.encoder.multi_vector

    @property
    def max_tokens(self) -> int | None:
        """Tokens of a document the model reads; None when it reads the whole text."""
        return self.encoder.max_tokens

    @property
    def device(self) -> str:
        return getattr(self.encoder, "device", "cpu")

    def metadata(self) -> dict[str, Any]:
        """What `docembed encode` writes beside the vectors (model, family, config hash, ...)."""
        return self.encoder.metadata()

    # --- encoding ------------------------------------------------------------------------------------
    def encode(
        self,
        texts: str | Sequence[str],
        batch_size: int = 32,
        *,
        normalize_embeddings: bool = False,
        show_progress_bar: bool | None = None,
        convert_to: ConvertTo = "numpy",
        pooling: Pooling = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        output_value: str | None = "sentence_embedding",
        precision: str = "float32",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        truncate_dim: int | None = None,
        device: str | None = None,
        **unknown: Any,
    ):
        """Embed `texts` (a list, or one string for one embedding). The keywords of sentence-transformers'
        `SentenceTransformer.encode` mean what they mean there:

        normalize_embeddings: unit-length vectors (every vector of a multi-vector model). pooling="mean":
        one vector per text from a multi-vector model (a no-op for dense ones). convert_to="torch" or
        convert_to_tensor=True: a tensor (a list of tensors for multi-vector output); convert_to_numpy=False:
        a list of tensors, one per text. prompt: text put before every input; prompt_name: the model's
        prompt of that name ("query", "document": `load(..., prompts=)`), ignored when `prompt` is given.
        show_progress_bar: None shows one when stderr is a terminal, as the CLI does. output_value:
        "sentence_embedding" (the model's own output: a vector, or a vector set for a multi-vector model)
        or "token_embeddings" (every token's vector from the transformer's last layer, not normalised
        unless asked: the sbert family). truncate_dim: the first `truncate_dim` dimensions of every vector,
        made unit length again only with normalize_embeddings. precision: "float32", or the embeddings
        quantised as `quantize_embeddings` does ("int8", "uint8", "binary", "ubinary", ranges taken from
        these embeddings). device: run on this device ("cpu", "cuda", "cuda:1"; the model stays there)."""
        if unknown:
            _unknown_keywords(unknown)
        if isinstance(batch_size, str):  # sentence-transformers' second positional is the prompt name
            raise UsageError(
                f"encode's second argument is batch_size, not {batch_size!r}: give prompt_name= by keyword"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be a positive integer, not {batch_size!r}")
        if convert_to not in ("numpy", "torch"):
            raise UsageError(f"convert_to must be 'numpy' or 'torch', not {convert_to!r}")
        if pooling not in (None, "mean"):
            raise UsageError(f"pooling must be None or 'mean', not {pooling!r}")
        if output_value not in OUTPUT_VALUES:
            raise UsageError(
                f"output_value must be 'sentence_embedding' or 'token_embeddings', not {output_value!r}"
                + (" (every output as a dict is not available here)" if output_value is None else "")
            )
        if precision not in EMBEDDING_PRECISIONS:
            raise UsageError(
                f"precision is the embeddings' type, one of {', '.join(EMBEDDING_PRECISIONS)}, not "
                f"{precision!r} (the model's own arithmetic is chosen at load(..., precision=))"
            )
        if truncate_dim is not None and (
            isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1
        ):
            raise UsageError(f"truncate_dim must be a positive integer, not {truncate_dim!r}")
        if device is not None:
            self._move_to(device)
        if prompt is None and prompt_name is not None:
            prompt = self._prompt_named(prompt_name)
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        for index, text in enumerate(batch):
            if not isinstance(text, str):
                raise UsageError("encode takes a string or a sequence of strings")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate: no tokenizer can read it
                raise UsageError(
                    f"text {index} is not valid Unicode ({error.reason} at {error.start})"
                ) from None
        if prompt:
            batch = [prompt + text for text in batch]
        encoder = self._token_encoder() if output_value == "token_embeddings" else self.encoder
        coverage = coverage_of(encoder)
        with progress_shown(show_progress_bar):
            vectors = encode_texts(
                encoder, batch, batch_size=batch_size, label=f"encode [{self.name}]", coverage=coverage
            )
        if coverage is not None and coverage.documents_cut:
            warnings.warn(coverage.summary(self.name), TruncationWarning, stacklevel=2)
        if truncate_dim is not None:
            vectors = _truncated(vectors, truncate_dim)
        if pooling == "mean" and isinstance(vectors, MultiVectors):
            vectors = vectors.mean()
        if normalize_embeddings:
            vectors = normalize_vectors(vectors)
        if precision != "float32" and len(vectors):
            vectors = quantize_embeddings(vectors, precision)
        if convert_to_tensor:
            convert_to = "torch"
        elif not convert_to_numpy and convert_to == "numpy":
            return _tensor_list(vectors, single)
        return _converted(vectors, convert_to, single)

    def _move_to(self, device: str) -> None:
        """sentence-transformers' device=: the model moves there for this call and stays there."""
        if not isinstance(device, str):  # a list of devices: its multi-process pool
            raise UsageError(
                f"device takes one device, not {device!r}: for several processes use `docembed encode "
                "--workers N`"
            )
        target = resolve_device(device)
        if target != self.device:
            self.encoder = self.encoder.to(target)

    def _prompt_named(self, name: str) -> str:
        if name in self.prompts:
            return self.prompts[name]
        if not self.prompts:
            raise UsageError(
                f"prompt_name={name!r}: model {self.name!r} has no prompts (give them with "
                "docembed.load(..., prompts={'query': ..., 'document': ...}), or pass prompt= itself)"
            )
        raise UsageError(
            f"prompt_name={name!r}: model {self.name!r} has prompts {', '.join(sorted(self.prompts))}"
        )

    def _token_encoder(self) -> Encoder:
        """The model reading out every token's vector, as sentence-transformers' output_value=
        "token_embeddings" does: for the sbert family, the same transformer with its token output,
        not normalised (normalize_embeddings does that); other families have no such output."""
        if self.family != "sbert":
            raise UsageError(
                f"output_value='token_embeddings': model {self.name!r} ({self.family}) gives no per-token "
                "vectors (the sbert family does, e.g. docembed.load('sbert-tokens'))"
            )
        import copy
        import dataclasses

        tokens = copy.copy(self.encoder)
        tokens.config = dataclasses.replace(self.encoder.config, output="tokens", normalize=False)
        return tokens

    def encode_query(self, texts: str | Sequence[str], batch_size: int = 32, **options):
        """`encode` with the model's query prompt (the same as `encode` when it has none; `prompt=` or
        `prompt_name=` given here is used instead, as in sentence-transformers)."""
        return self._encode_with_prompt("query", texts, batch_size, options)

    def encode_document(self, texts: str | Sequence[str], batch_size: int = 32, **options):
        """`encode` with the model's document prompt (the same as `encode` when it has none; `prompt=` or
        `prompt_name=` given here is used instead)."""
        return self._encode_with_prompt("document", texts, batch_size, options)

    def _encode_with_prompt(self, kind: str, texts, batch_size: int, options: dict):
        if "prompt" not in options and "prompt_name" not in options:
            options["prompt"] = self.prompts.get(kind)
        return self.encode(texts, batch_size, **options)

    def fit(self, texts: Sequence[str]) -> Model:
        """Fit a corpus-fitted family (tfidf, bm25) on `texts`; pv and setenc train with
        `docembed train-pv` / `train-setenc` and load from their folder."""
        if not self.encoder.supports("fit"):
            raise UsageError(f"{self.name} is not fitted on a corpus here (fit is for tfidf and bm25)")
        self.encoder.fit(list(texts))
        return self

    # --- scoring -------------------------------------------------------------------------------------
    def similarity(self, a, b) -> np.ndarray:
        """Scores of every `a` against every `b`, shape (len(a), len(b)): cosine for dense embeddings,
        mean-MaxSim (asymmetric: `a` are the queries) for multi-vector ones, as `docembed similarity` scores.
        `a` and `b` are `encode` outputs (numpy) or texts, which are encoded first. A scorer (bm25, a fusion
        such as `bm25+sbert`) takes texts: each row is a query's scores over `b` (a fusion normalises them
        per query; against one text, a fitted fusion scores each pair with the statistics it saved)."""
        if getattr(self.encoder, "scorer_only", False):
            return self._scorer_similarity(a, b)
        if getattr(self.encoder, "scores_exact_rows", False) and _are_texts(a) and _are_texts(b):
            # tf-idf without an LSA: its exact rows, scored sparse as `rerank` scores them
            from docembed.models.baselines import sparse_cosines

            left, right = (self.encoder.encode_sparse([v] if isinstance(v, str) else v) for v in (a, b))
            return sparse_cosines(left, right).astype(np.float32)
        left, right = self._as_vectors(a), self._as_vectors(b)
        if isinstance(left, MultiVectors) != isinstance(right, MultiVectors):
            raise UsageError(
                "similarity needs two dense or two multi-vector inputs (pool both or neither); one text's "
                "vectors (a multi-vector model's `encode` of one string) go in a list, [vectors], or give "
                "the text"
            )
        return score_matrix(left, right, *passage_scoring(self.encoder))

    def best_passages(self, query: str, documents: Sequence[str]) -> list[dict]:
        """Per document, the passage `query` is about: {"start", "end"} (character offsets into the
        document), "text" and "score" (the cosine of the query, averaged over its vectors, with that
        passage); None for an empty document. For models whose vectors are passages (sbert-windows, the
        student with long_documents="late-chunks"), the part `similarity` scores a document by; for a
        fusion (`tfidf+retriever`), its part whose vectors are passages (passages.passage_part)."""
        from docembed.passages import passage_part
        from docembed.scoring import best_passages, passage_span

        documents = list(documents)
        if not documents:
            return []
        part = passage_part(self.encoder)
        spans = part.passage_spans(documents)  # refuses a model without passages, before encoding
        texts = [query, *documents]
        vectors = self.encode(texts) if part is self.encoder else encode_texts(part, texts, label="encode")
        group_tokens = passage_scoring(part)[2]
        docs = vectors.select(range(1, len(documents) + 1))
        passages, cosines = best_passages(vectors[0], docs, group_tokens)
        found = []
        for i, (j, score) in enumerate(zip(passages, cosines, strict=True)):
            span = passage_span(spans[i], j)
            if span is None:
                found.append(None)
                continue
            start, end = span
            found.append({"start": start, "end": end, "text": documents[i][start:end], "score": float(score)})
        return found

    def _scorer_similarity(self, a, b) -> np.ndarray:
        queries, candidates = ([a] if isinstance(a, str) else a), ([b] if isinstance(b, str) else b)
        if not all(isinstance(t, str) for t in [*queries, *candidates]):
            raise UsageError(f"{self.name} scores texts (it has no embeddings): give texts to similarity")
        embed = lambda model, texts: encode_texts(model, texts, label=f"encode [{model.name}]")  # noqa: E731
        if len(candidates) == 1 and hasattr(self.encoder, "pair_scores"):
            # one candidate is nothing to normalise a fusion over (it would score 0): each query and it as
            # a pair, normalised with the statistics a fitted fusion saved, as `docembed similarity A B`
            pairs = self.encoder.pair_scores(list(queries), list(candidates) * len(queries), embed=embed)
            return np.asarray(pairs, dtype=np.float32)[:, None]
        return self.encoder.score_matrix(list(queries), list(candidates), embed=embed).astype(np.float32)

    def _as_vectors(self, value) -> Vectors:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and (not value or isinstance(value[0], str)):
            value = self.encode(list(value))  # texts (an empty list is no texts)
        if isinstance(value, MultiVectors):
            return value
        if isinstance(value, list):
            arrays = [np.asarray(v, dtype=np.float32) for v in value]
            if arrays and all(a.ndim == 1 for a in arrays):  # a dense model's rows (convert_to_numpy=False)
                return np.stack(arrays)
            return MultiVectors.from_list(arrays)  # (k_i, dim) arrays: the list view of a multi-vector output
        array = np.asarray(value, dtype=np.float32)
        if array.ndim == 1:
            return array[None, :]
        if array.ndim != 2:
            raise UsageError(f"similarity takes vectors of shape (n, dim) or (dim,), not {array.shape}")
        return array

    def save(self, directory: str | Path, overwrite: bool = False) -> None:
        """config.json + weights, loadable again with `docembed.load(directory)` and by the CLI. Written
        all or nothing; an existing folder is replaced only with `overwrite`, and only a docembed model."""
        save_encoder(self.encoder, directory, overwrite)


def quantize_embeddings(
    embeddings: Vectors, precision: str = "int8", ranges=None, calibration_embeddings=None
):
    """Store embeddings in fewer bytes: "int8" / "uint8" (one byte per dimension, within `ranges`, a (2,
    dim) array of each dimension's min and max, else those of `calibration_embeddings` or of the embeddings
    themselves) or "binary" / "ubinary" (one bit per dimension, packed). This is sentence-transformers'
    `quantize_embeddings`, with its arguments in its order, applied to every vector of a multi-vector
    output too. Not `load(..., precision=)`, which is the arithmetic the model runs in."""
    from sentence_transformers import quantize_embeddings as quantize

    calibration = calibration_embeddings
    if isinstance(calibration, MultiVectors):
        calibration = calibration.vectors
    if isinstance(embeddings, MultiVectors):
        flat = quantize(embeddings.vectors, precision, ranges=ranges, calibration_embeddings=calibration)
        return MultiVectors(flat, embeddings.offsets, embeddings.positions)
    return quantize(np.asarray(embeddings), precision, ranges=ranges, calibration_embeddings=calibration)


def _are_texts(value) -> bool:
    return isinstance(value, str) or (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) for v in value)
    )


def _unknown_keywords(unknown: dict[str, Any]) -> None:
    """A keyword sentence-transformers has and docembed does not: a one-line UsageError saying why; any
    other: TypeError as Python gives, with the closest keyword of encode."""
    import difflib
    import inspect

    for name in unknown:
        if name in NOT_TAKEN:
            raise UsageError(f"encode does not take {name}= ({NOT_TAKEN[name]})")
    known = [p for p in inspect.signature(Model.encode).parameters if p not in ("self", "texts", "unknown")]
    name = next(iter(unknown))
    close = difflib.get_close_matches(name, [*known, *NOT_TAKEN], n=1)
    hint = f". Did you mean {close[0]!r}?" if close else ""
    raise TypeError(f"Model.encode() got an unexpected keyword argument {name!r}{hint}")


def _truncated(vectors: Vectors, dim: int) -> Vectors:
    """The first `dim` dimensions of every vector (all of them when there are fewer, as in
    sentence-transformers)."""
    if isinstance(vectors, MultiVectors):
        return MultiVectors(
            np.ascontiguousarray(vectors.vectors[:, :dim]), vectors.offsets, vectors.positions
        )
    return np.ascontiguousarray(np.asarray(vectors)[:, :dim])


def _tensor_list(vectors: Vectors, single: bool):
    """sentence-transformers' convert_to_numpy=False: one tensor per text."""
    import torch

    rows = [torch.from_numpy(np.array(v)) for v in vectors]
    return rows[0] if single else rows


def _converted(vectors: Vectors, convert_to: ConvertTo, single: bool):
    if convert_to == "torch":
        import torch

        if isinstance(vectors, MultiVectors):
            out = [torch.from_numpy(np.array(v)) for v in vectors]
        else:
            out = torch.from_numpy(np.asarray(vectors))
        return out[0] if single else out
    if single:
        return vectors[0]
    return vectors
