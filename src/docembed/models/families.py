"""Family name -> the Encoder class that implements it. Each family module registers its class with
`@register`; `get_family(name)` imports the module on first use, so loading one family imports no other and
the CLI starts fast. This module imports nothing of docembed's models, so no import can run in a circle
through it."""

from __future__ import annotations

import importlib

from docembed.errors import CorruptModelError

# family name -> module that defines it (imported lazily)
FAMILY_MODULES: dict[str, str] = {
    "sbert": "docembed.models.sbert",
    "pv": "docembed.models.paragraph_vector",
    "tfidf": "docembed.models.baselines",
    "bm25": "docembed.models.baselines",
    "glove-avg": "docembed.models.baselines",
    "nugget": "docembed.models.nugget",
    "student": "docembed.models.student",
    "quickthoughts": "docembed.models.quickthoughts",
    "setenc": "docembed.models.setenc",
    "static": "docembed.models.static",
    "fusion": "docembed.models.fusion",
}

_FAMILIES: dict[str, type] = {}


def register(cls):
    """Class decorator: make a family loadable by its `family` name."""
    _FAMILIES[cls.family] = cls
    return cls


def get_family(name: str):
    if name not in _FAMILIES:
        if name not in FAMILY_MODULES:
            raise CorruptModelError(f"unknown model family {name!r}")
        importlib.import_module(FAMILY_MODULES[name])
    return _FAMILIES[name]
