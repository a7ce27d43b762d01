"""Benches and scripts use docembed's public API only: no `_private` name imported from docembed, no private
member reached on a docembed object, no evaluator monkeypatched (build a new one from data instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.py")])
# Private members benches used to reach for (evaluators' loaders, sampling, the models' batching).
KNOWN_PRIVATE = {"_load", "_subset", "_batches", "_evaluated", "_train", "_split", "_engine"}
# Evaluator hooks that are constructor arguments now (embed=...), never to be assigned over.
PATCHED = {"embed", "fit_texts", "compute"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(source: str) -> list[str]:
    """Each use of a private docembed name in `source`, as "line: what"."""
    tree = ast.parse(source)
    from_docembed: set[str] = set()  # local names bound to docembed modules or objects
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "docembed":
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                from_docembed.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "docembed":
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    from_docembed.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in KNOWN_PRIVATE or owner in from_docembed:
                found.append(f"{node.lineno}: .{node.attr}")
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr in PATCHED | KNOWN_PRIVATE:
                    found.append(f"{node.lineno}: assigns .{target.attr}")
    return found


def test_the_scan_finds_each_kind_of_private_use():
    source = """
from docembed.evaluation.tasks import _subset
import docembed.models._hidden
from docembed.models import nugget
docs, queries = evaluator._load()
for batch in model._batches(ids, 32): pass
nugget._internal()
evaluator.embed = lambda model, texts: model.encode(texts)
"""
    found = violations(source)
    assert sorted(int(line.split(":")[0]) for line in found) == [2, 3, 5, 6, 7, 8]
    clean = "from docembed.evaluation import get_evaluator\nx = get_evaluator('pi').docs\nself._cache = 1\n"
    assert violations(clean) == []  # a bench's own private attribute is its business


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_and_script_use_only_public_docembed_names(path):
    assert violations(path.read_text(encoding="utf-8")) == []
