"""The one interface every model family implements, and the save/load format they share.

A saved model is a directory: `config.json` ({"family", "docembed_version", "config": {...}}), the weights in
`model.safetensors`, plus whatever tokenizer or vocabulary files the family needs - never a pickle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from docembed.errors import CorruptModelError, DocembedError, UsageError
from docembed.io.outputs import DirectoryKind, directory_output
from docembed.types import Vectors
from docembed.version import __version__

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


# Settings added to existing families after their outputs were in use, with their defaults: at the default
# they are left out of the config hash, so embeddings, caches and indexes made before keep their identity.
SETTINGS_HASHED_WHEN_SET: dict[str, Any] = {
    "passage_temperature": 0.0,
    "analyzer": "plain",
    "long_queries": "passages",
    "passage_windows": False,
}


@dataclasses.dataclass
class EncoderConfig:
    """Base of every family's config dataclass: JSON round trip and a stable hash."""

    # settings that change how a trained model is read, not what trains (a --resume may change them)
    INFERENCE_SETTINGS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(values) - set(fields)
        if unknown:
            raise CorruptModelError(f"unknown {cls.__name__} fields: {', '.join(sorted(unknown))}")
        for name, value in values.items():
            default = fields[name].default
            if value is None or default is None or default is dataclasses.MISSING:
                continue
            if not _same_kind(value, default):
                raise CorruptModelError(
                    f"{cls.__name__}.{name} should be like {default!r}, not {value!r:.40}"
                )
        return cls(**values)

    def hash(self) -> str:
        values = self.to_dict()
        for name, default in SETTINGS_HASHED_WHEN_SET.items():  # older outputs keep their identity
            if values.get(name, default) == default:
                values.pop(name, None)
        blob = json.dumps(values, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def check_temperature(value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 10.0):
        raise UsageError(f"passage_temperature is between 0 (the best passage) and 10, not {value!r}")


def check_ratio(value: float) -> None:
    if not 0 < value <= 1:
        raise UsageError(f"--ratio must be in (0, 1], got {value}")


def check_max_length(value: int) -> None:
    if value < 2:
        raise UsageError(f"--max-length must be >= 2, got {value}")


def check_long_queries(value: str) -> None:
    from docembed.scoring import LONG_QUERIES

    if value not in LONG_QUERIES:
        raise UsageError(f"long_queries is one of {', '.join(LONG_QUERIES)}, not {value!r}")


class NotSupportedError(DocembedError):
    """An option the model's family does not have (e.g. --ratio for a dense model)."""


# What a family may declare in `Encoder.capabilities`, and the option each one enables.
CAPABILITIES = {
    "ratio": "--ratio (a compression ratio at encode time)",
    "workers": "--workers (inference processes)",
    "fit": "fitting on a task's own text",
    "sparse": "sparse features (encode_sparse)",
    "backends": "--backend / --precision (another inference engine or int8)",
    "long": "--long (truncate | windows: a document longer than the model reads, cut or read in windows)",
    "max-length": "--max-length (tokens one pass reads; positions beyond the trained length are tiled)",
    "selection": "--selector / --max-vectors (which token vectors a multi-vector model keeps)",
    "passages": "--passage-temperature / --long-queries (how passage vectors are scored)",
}

LONG_MODES = ("truncate", "windows")
ALL_LONG_MODES = (*LONG_MODES, "late-chunks")  # every family's --long values: the student's late chunks too


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """The encode-time options of `docembed encode` / `docembed.load` (None: the model's own), applied to a
    loaded model in one place: by the command, the Python API and each worker process alike."""

    ratio: float | None = None
    long_documents: str | None = None
    backend: str | None = None
    precision: str | None = None
    selector: str | None = None
    max_vectors: int | None = None
    max_length: int | None = None
    passage_temperature: float | None = None
    long_queries: str | None = None

    def check(self) -> None:
        """Refuse the values no model is needed to refuse (a mode, backend or precision that is nothing, a
        length or ratio out of range), in one line before a model loads; what a family lacks (--ratio for a
        dense model) is found when `apply` meets the loaded one."""
        from docembed.models.inference_backends import check_choice

        if self.long_documents is not None and self.long_documents not in ALL_LONG_MODES:
            raise UsageError(f"--long is one of {', '.join(ALL_LONG_MODES)}, not {self.long_documents!r}")
        if self.backend is not None or self.precision is not None:
            check_choice(self.backend or "auto", self.precision or "fp32")
        if self.max_length is not None:
            check_max_length(self.max_length)
        if self.ratio is not None:
            check_ratio(self.ratio)
        if self.passage_temperature is not None:
            check_temperature(self.passage_temperature)
        if self.long_queries is not None:
            check_long_queries(self.long_queries)

    def apply(self, encoder: Encoder) -> Encoder:
        if self.ratio is not None:
            encoder.set_ratio(self.ratio)
        if self.max_vectors is not None:
            encoder.set_selection(self.selector, max_nuggets=self.max_vectors)
        elif self.selector is not None:
            encoder.set_selection(self.selector)
        if self.long_documents is not None:
            encoder.set_long_documents(self.long_documents)
        if self.max_length is not None:
            encoder.set_max_length(self.max_length)
        if self.passage_temperature is not None:  # after --long: it decides whether vectors are passages
            encoder.set_passage_temperature(self.passage_temperature)
        if self.long_queries is not None:
            encoder.set_long_queries(self.long_queries)
        if self.backend or self.precision:
            encoder.set_inference(self.backend, self.precision)
        given = {key: getattr(self, key) for key in RECORDED_SETTINGS if getattr(self, key) is not None}
        if given:  # recorded in the outputs' metadata: a search encodes its queries with them too
            encoder.encode_settings = {**encoder.encode_settings, **given}
        return encoder


#: the encode-time settings that change a model's vectors, recorded with its outputs (`encode_settings`) so
#: that `search` and `serve` read queries as the indexed documents were read (the passage temperature and
#: the long-query reading are recorded on their own, as the index scores with them)
RECORDED_SETTINGS = ("ratio", "long_documents", "selector", "max_vectors", "max_length")


def recorded_settings(metadata: dict) -> EncodeSettings:
    """The EncodeSettings an output's metadata records (none for one written before they were kept)."""
    found = metadata.get("encode_settings")
    if not isinstance(found, dict):
        return EncodeSettings()
    return EncodeSettings(**{key: found[key] for key in RECORDED_SETTINGS if key in found})


class Encoder(ABC):
    """texts -> embeddings. Dense families return an `(n, dim)` float32 array, multi-vector families a
    `MultiVectors`. Subclasses set `family`, `config_class`, `capabilities`, and implement
    encode/save/load (and the method behind each capability they declare)."""

    family: ClassVar[str] = ""
    config_class: ClassVar[type[EncoderConfig]] = EncoderConfig
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # the encode-time settings applied to this model (EncodeSettings.apply; replaced, never changed in place)
    encode_settings: dict[str, Any] = {}

    def __init__(self, config: EncoderConfig, name: str | None = None):
        self.config = config
        self.name = name or self.family
        # Where the model was loaded from, when it was: fitted state (weights, vocabulary) lives there,
        # so caches key on it as well as on the config.
        self.source: str | None = None

    # --- what a family provides ---------------------------------------------------------------------
    @abstractmethod
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Vectors:
        """Embed `texts`; one row (dense) or one set of vectors (multi-vector) per text, empty texts too."""

    @abstractmethod
    def save(self, directory: str | Path) -> None: ...

    @classmethod
    @abstractmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> Encoder: ...

    @property
    def multi_vector(self) -> bool:
        return False

    @property
    def requires_fit(self) -> bool:
        """True for families fitted on the task's own text (tfidf, bm25) until `fit(texts)` has run."""
        return False

    @property
    def normalized(self) -> bool:
        """Whether encode() returns unit-length vectors (cosine = dot product)."""
        return False

    @property
    def max_tokens(self) -> int | None:
        """How many tokens of a document the model reads (the rest is not read), or None when it reads the
        whole text however long."""
        return None

    def token_counts(self, texts: Sequence[str]) -> list[int] | None:
        """Each text's length in the model's tokens (special tokens included), for the report of what a model
        with `max_tokens` did not read; None for a model that reads every text whole."""
        tokenizer = getattr(self, "tokenizer", None)
        if self.max_tokens is None or tokenizer is None:
            return None
        return count_tokens(tokenizer, texts)

    @property
    def dim(self) -> int:
        return int(self.encode([""]).dim if self.multi_vector else self.encode([""]).shape[1])

    def to(self, device: str) -> Encoder:
        return self

    # --- rebuilding from an offline base (the zoo ships only what training changed, see models/zoo.py) ---
    # Files besides the weights that `from_base` reads (QuickThoughts' vocabulary), shipped beside them.
    base_files: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def offline_base(cls, config: dict[str, Any]) -> str | None:
        """The offline base (a key of `offline.BASES`) a model with this config starts training from, or
        None when it starts from anything else: only models built from an offline base ship as overlays."""
        return None

    @classmethod
    def from_base(cls, config: dict[str, Any], files: Path | None = None, seed: int = 0) -> Encoder:
        """The model exactly as its training starts: built from its offline base with `config` (a trained
        model's config is accepted: fitted state in it is dropped), random parts drawn from `seed`, and the
        files in `base_files` read from `files`. The zoo loads its overlay on top; train-* starts from it."""
        raise NotSupportedError(f"the {cls.family} family is not built from an offline base")

    @property
    def weights_module(self):
        """The torch module whose state is the model's weights (what save() writes, the zoo overlays)."""
        raise NotSupportedError(f"the {self.family} family has no torch weights")

    # --- optional capabilities (declared in `capabilities`) -------------------------------------------
    def supports(self, capability: str) -> bool:
        return capability in self.capabilities

    def require(self, capability: str) -> None:
        """The one 'not supported by this model' error (exit 1), naming the option."""
        if not self.supports(capability):
            what = CAPABILITIES.get(capability, capability)
            have = ", ".join(sorted(self.capabilities)) or "none"
            raise NotSupportedError(
                f"model {self.name!r} ({self.family}) does not support {what}; its capabilities: {have}"
            )

    def set_ratio(self, ratio: float) -> None:
        """Multi-vector families with a compression ratio ("ratio") override this."""
        self.require("ratio")

    def set_selection(self, selector: str | None = None, **changes: Any) -> None:
        """Multi-vector families that choose their vectors by a rule or a learned scorer ("selection")."""
        self.require("selection")

    def set_long_documents(self, mode: str) -> None:
        """Families that can read a document longer than one pass in windows ("long") override this."""
        self.require("long")

    def set_max_length(self, max_length: int) -> None:
        """Families whose one pass can be made longer ("max-length") override this."""
        self.require("max-length")

    def set_passage_temperature(self, temperature: float) -> None:
        """How a document's passage vectors pool when scored (see `passage_temperature`): for families
        whose multi-vector output is passages ("passages": sbert windows, the student's late chunks)."""
        self.require("passages")
        check_temperature(temperature)
        self._require_passage_output("passage_temperature")
        self.config.passage_temperature = float(temperature)

    def set_long_queries(self, long_queries: str) -> None:
        """How a long query is scored (see `long_queries`): for families whose multi-vector
        output is passages ("passages")."""
        self.require("passages")
        check_long_queries(long_queries)
        self._require_passage_output("long_queries")
        self.config.long_queries = long_queries

    def _require_passage_output(self, setting: str) -> None:
        if not self.multi_vector:
            raise NotSupportedError(
                f"model {self.name!r} makes one vector per document: {setting} applies to its passage "
                "output (sbert-windows, the student's --long late-chunks)"
            )

    def passage_spans(self, texts: Sequence[str]) -> list:
        """Per text, the (start, end) character offsets of the passage each of its vectors pools (an
        (k, 2) int array), in the order `encode` gives the vectors: for a model whose vectors are passages."""
        import numpy as np

        self.require("passages")
        if not self.multi_vector:
            raise NotSupportedError(f"model {self.name!r} makes one vector per document: it has no passages")
        tokens = self.tokenizer(
            list(texts),
            add_special_tokens=False,
            truncation=False,
            return_offsets_mapping=True,
            verbose=False,
        )
        spans = []
        for offsets in tokens["offset_mapping"]:
            ranges = self.passage_token_ranges(len(offsets))
            rows = [(offsets[a][0], offsets[b - 1][1]) if b > a else (0, 0) for a, b in ranges]
            spans.append(np.asarray(rows, dtype=np.int64).reshape(-1, 2))
        return spans

    def passage_token_ranges(self, length: int) -> list[tuple[int, int]]:
        """The [start, end) token ranges of a text of `length` tokens (no special tokens) that its passage
        vectors pool, in order: families with "passages" override this."""
        self.require("passages")
        return []

    def set_workers(self, workers: int) -> None:
        """Families that encode in several processes ("workers") override this."""
        self.require("workers")

    def set_inference(self, backend: str | None = None, precision: str | None = None) -> Encoder:
        """Families that run on ONNX Runtime / OpenVINO or in int8 ("backends") override this."""
        self.require("backends")
        return self

    # --- shared behaviour ---------------------------------------------------------------------------
    def config_hash(self) -> str:
        return self.config.hash()

    @property
    def passage_temperature(self) -> float:
        """How a multi-vector document's vectors pool when it is scored: 0 takes each query vector's best
        match (MaxSim; the best passage, MaxP, for a model whose vectors are passages), > 0 the smooth
        log-mean-exp of docembed.scoring.maxsim_one_to_many, chosen on validation."""
        return float(getattr(self.config, "passage_temperature", 0.0))

    @property
    def long_queries(self) -> str:
        """How a long query (a half of a long document: docembed.scoring.LONG_QUERY_PASSAGES passages or
        more) is scored against documents of passages:
        "passages" (each of its passages, as `passage_temperature` says) or "whole" (the cosine of the two
        texts' passage means; see docembed.scoring.maxsim_one_to_many), chosen on validation."""
        return str(getattr(self.config, "long_queries", "passages"))

    @property
    def vectors_are_passages(self) -> bool:
        """Whether each vector stands for a passage of the text (sbert windows, the student's late chunks),
        so a text's count of them says how long it is (docembed.scoring.long_query_rows); token vectors
        (sbert-tokens, NUGGET) do not."""
        return False

    @property
    def passage_group_tokens(self) -> int:
        """For token vectors scored by passages (NUGGET's `passage_windows`): the text tokens of a window,
        by which docembed.scoring.window_groups groups a document's vectors; 0 for every other model."""
        return 0

    def metadata(self) -> dict[str, Any]:
        meta = {
            "model": self.name,
            "family": self.family,
            "config_hash": self.config_hash(),
            "normalized": self.normalized,
            "docembed_version": __version__,
        }
        if self.passage_temperature:  # an index built from these vectors scores them the same way
            meta["passage_temperature"] = self.passage_temperature
        if self.long_queries != "passages":
            meta["long_queries"] = self.long_queries
        if self.passage_group_tokens:
            meta["passage_group_tokens"] = self.passage_group_tokens
        if self.encode_settings:
            meta["encode_settings"] = dict(self.encode_settings)
        if self.source and Path(self.source).parent != _ZOO_DIR:
            meta["model_source"] = self.source  # a saved model: by its path
        return meta

    # --- the shared directory format ----------------------------------------------------------------
    def write_config(self, directory: str | Path, **extra: Any) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "family": self.family,
            "docembed_version": __version__,
            "config": self.config.to_dict(),
            **extra,
        }
        (directory / CONFIG_NAME).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        return directory


# The package's zoo (docembed/zoo/<name>/): a built-in model loaded from it is recorded by its name (with the
# docembed version), which every installation resolves, never by this installation's absolute path. The name
# may be another built-in reading the same weights (`student-passages` reads zoo/student).
_ZOO_DIR = Path(__file__).resolve().parents[1] / "zoo"


def _same_kind(value: Any, default: Any) -> bool:
    """Whether a config value read from JSON has the kind of the field's default (numbers mix freely)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) == isinstance(default, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float)
    if isinstance(default, str):
        return isinstance(value, str)
    return True


def count_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """Tokens of each text under a Hugging Face tokenizer, with the model's special tokens. A long text is
    counted block by block (tensors.text_blocks), keeping only the counts: a 50 MB one-line document costs
    the tokenizer a block's memory, not GBs of token lists."""
    from docembed.tensors import is_long, text_blocks

    def ids(pieces: list[str]) -> list:
        return tokenizer(pieces, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]

    specials = tokenizer.num_special_tokens_to_add(pair=False)
    short = [i for i, text in enumerate(texts) if not is_long(text)]
    counts = [specials] * len(texts)
    if short:  # the usual texts in one call, as the model's own encode tokenizes them
        for i, tokens in zip(short, ids([texts[i] for i in short]), strict=True):
            counts[i] += len(tokens)
    for i, text in enumerate(texts):
        if is_long(text):
            counts[i] += sum(len(tokens) for block in text_blocks(text) for tokens in ids([block]))
    return counts


def read_config(directory: str | Path) -> dict[str, Any]:
    """The parsed config.json of a saved model, or a CorruptModelError that says what is wrong."""
    path = Path(directory) / CONFIG_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory} is not a docembed model: no {CONFIG_NAME}")
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptModelError(f"{path} is corrupt: {error}") from None
    if not isinstance(payload, dict):
        raise CorruptModelError(f"{path} is not a docembed config: expected a JSON object")
    family = payload.get("family")
    if not isinstance(family, str) or not family:
        what = "no 'family' entry" if family is None else f"a 'family' that is not a name ({family!r:.40})"
        raise CorruptModelError(f"{path} has {what}")
    if not isinstance(payload.get("config"), dict):
        what = "no 'config' entry" if "config" not in payload else f"a 'config' of {payload['config']!r:.40}"
        raise CorruptModelError(f"{path} has {what}: expected a JSON object of the model's settings")
    return payload


def is_model_dir(directory: Path) -> bool:
    """Whether `directory` holds a model docembed saved: a config.json naming a family docembed knows."""
    from docembed.models.families import FAMILY_MODULES

    try:
        payload = json.loads((Path(directory) / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(payload, dict) and payload.get("family") in FAMILY_MODULES


#: what fit / train-pv / encode --fit may replace (io/outputs.py's rule for directory outputs)
MODEL_DIRECTORY = DirectoryKind("docembed model", "config.json of a known family", is_model_dir)


def save_encoder(encoder: Encoder, directory: str | Path, overwrite: bool = True) -> None:
    """`encoder.save(directory)` all or nothing: into a staging folder swapped in whole; an existing folder
    there is replaced only if it is a docembed model (io/outputs.py), never a folder of other files."""
    with directory_output(directory, MODEL_DIRECTORY, overwrite) as staging:
        encoder.save(staging)


def save_state_dict(module, directory: str | Path) -> None:
    """Weights as safetensors (tied parameters once: see `untied_state`)."""
    from safetensors.torch import save_file

    save_file(untied_state(module), str(Path(directory) / WEIGHTS_NAME))


def untied_state(module) -> dict:
    """`module.state_dict()` on the CPU with each tied tensor kept once, under its first key: safetensors
    refuses tensors sharing storage, and loading the one key fills every tie (`load_state_dict`). The one
    rule for saved models and training checkpoints alike."""
    state, seen = {}, set()
    for key, tensor in module.state_dict().items():
        pointer = (tensor.data_ptr(), tuple(tensor.shape)) if tensor.numel() else None
        if pointer is not None and pointer in seen:
            continue
        if pointer is not None:
            seen.add(pointer)
        state[key] = tensor.detach().contiguous().cpu()
    return state


def load_state_dict(module, directory: str | Path, device: str = "cpu") -> None:
    """Load model.safetensors into `module`; a truncated file or a key mismatch is a CorruptModelError."""
    from safetensors.torch import load_file

    path = Path(directory) / WEIGHTS_NAME
    if not path.exists():
        raise CorruptModelError(f"{directory}: {WEIGHTS_NAME} is missing")
    try:
        state = load_file(str(path), device=device)
    except Exception as error:  # safetensors raises its own error types for truncated headers/data
        raise CorruptModelError(f"{path} is corrupt or truncated: {error}") from None
    refuse_non_finite(state, path)
    load_untied_state(module, state, f"{path} does not match its config")


def refuse_non_finite(state: dict, path: Path) -> None:
    """NaN or infinite weights (a diverged run, a damaged file) would encode NaN vectors in silence. `state`
    maps names to torch tensors or numpy arrays (the families that keep their weights in numpy)."""
    for key, array in state.items():
        if not _all_finite(array):
            raise CorruptModelError(f"{path} holds weights that are not finite (NaN or infinite) in {key}")


def _all_finite(array) -> bool:
    import numpy as np

    if isinstance(array, np.ndarray):
        return not np.issubdtype(array.dtype, np.inexact) or bool(np.isfinite(array).all())
    import torch

    return not array.is_floating_point() or bool(torch.isfinite(array).all())


def load_untied_state(module, state: dict, mismatch: str) -> None:
    """Load a state written by `untied_state` into `module`. Tied weights were saved once; any other key
    missing or unexpected is a CorruptModelError starting with `mismatch`."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as error:  # torch lists every tensor whose size differs: the first says enough
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith("size mismatch")), lines[0] if lines else "")
        raise CorruptModelError(f"{mismatch}: {first[:300]}") from None
    missing = [k for k in missing if not _is_tied(module, k, state)]
    if missing or unexpected:
        raise CorruptModelError(f"{mismatch}: missing {missing[:5]}, unexpected {list(unexpected)[:5]}")


def _is_tied(module, key: str, state: dict) -> bool:
    params = dict(module.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    target = params[key]
    return any(p is target for name, p in params.items() if name in state)
