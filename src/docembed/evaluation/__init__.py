"""Evaluation tasks behind one interface (`Evaluator`: `primary_metric`, `run(model) -> EvalResult`).

Task names (`docembed evaluate --help` lists them): paraphrase-identification (-train), mr, cr, subj, mpqa,
stsb, sick, imdb, 20newsgroups, 20newsgroups-retrieval, imdb-long, 20newsgroups-long, halves, and the
selection splits stsb-dev, sick-dev, imdb-long-val, 20newsgroups-long-val, halves-val; group names expand to
several (`senteval`, `sts`, `long`, `long-val`, `all`), and a few short aliases are accepted (`pi`, `20ng`,
`retrieval`).

Every task is built either from data in memory (`STSEvaluator(sentences1, sentences2, scores)`,
`ParaphraseIdentification(docs, queries)`, `SentEvalClassification(sentences, labels)`, ...) or from the data
root by name (`get_evaluator(name, options)` = `TASKS[name].from_data_root(options)`); `embed=` replaces how
it turns texts into vectors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from docembed.errors import ModelNotFoundError, UsageError
from docembed.evaluation import long_documents as _long_documents  # noqa: F401  (registers the tasks)
from docembed.evaluation import tasks as _tasks  # noqa: F401  (registers the tasks)
from docembed.evaluation.base import TASKS, EvalOptions, EvalResult, Evaluator, cached_encode, mean_pool
from docembed.evaluation.long_documents import Halves, LongDocumentClassification, PairedRetrieval
from docembed.evaluation.tasks import (
    DocumentClassification,
    LabelRetrieval,
    ParaphraseIdentification,
    SemanticSimilarity,
    SentEvalClassification,
    STSEvaluator,
)

GROUPS: dict[str, tuple[str, ...]] = {
    "senteval": ("mr", "cr", "subj", "mpqa"),
    "sts": ("stsb", "sick"),
    "classification": ("imdb", "20newsgroups"),
    "long": ("imdb-long", "20newsgroups-long", "halves"),
    "long-val": ("imdb-long-val", "20newsgroups-long-val", "halves-val"),
    "all": (
        "paraphrase-identification",
        "mr",
        "cr",
        "subj",
        "mpqa",
        "stsb",
        "sick",
        "imdb",
        "20newsgroups",
        "20newsgroups-retrieval",
    ),
}
ALIASES = {"pi": "paraphrase-identification", "20ng": "20newsgroups", "retrieval": "20newsgroups-retrieval"}
# Baseline families that need no saved state beyond their defaults: `--model tfidf` builds an unfitted one
# and the evaluator fits it on each task's training text.
UNFITTED_BASELINES = ("tfidf", "bm25")


def resolve_tasks(names: Iterable[str]) -> list[str]:
    """Task names, groups and aliases -> distinct task names, in the order given."""
    out: list[str] = []
    for raw in names:
        for name in (part.strip() for part in raw.split(",")):
            if not name:
                continue
            name = ALIASES.get(name, name)
            expanded = GROUPS.get(name, (name,))
            for task in expanded:
                if task not in TASKS:
                    known = ", ".join(sorted([*TASKS, *GROUPS, *ALIASES]))
                    raise UsageError(f"unknown task {name!r}; choose from: {known}")
                if task not in out:
                    out.append(task)
    if not out:
        raise UsageError("no task given")
    return out


def get_evaluator(name: str, options: EvalOptions | None = None, **kwargs) -> Evaluator:
    """Task `name` (or alias) read from the data root: `TASKS[name].from_data_root(options, **kwargs)`."""
    (task,) = resolve_tasks([name])
    return TASKS[task].from_data_root(options, **kwargs)


def load_evaluation_model(spec: str, device: str = "cpu"):
    """registry.load_model(spec), plus the unfitted baselines (`tfidf`, `bm25`) by family name."""
    from docembed.models.registry import get_family, load_model

    try:
        return load_model(spec, device=device)
    except ModelNotFoundError:
        if spec not in UNFITTED_BASELINES:
            raise
        cls = get_family(spec)
        return cls(cls.config_class(), name=spec)


def result_filename(result: EvalResult) -> str:
    safe_model = re.sub(r"[^A-Za-z0-9._-]+", "_", result.model).strip("_") or "model"
    return f"{result.task}__{safe_model}.json"


def write_result(result: EvalResult, output_dir: str | Path, overwrite: bool = True) -> Path:
    """The result's JSON file in `output_dir`; an existing one is replaced only with `overwrite`."""
    from docembed.io.outputs import atomic_path

    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / result_filename(result)
    with atomic_path(path, overwrite) as tmp:
        tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


__all__ = [
    "ALIASES",
    "GROUPS",
    "TASKS",
    "DocumentClassification",
    "EvalOptions",
    "EvalResult",
    "Evaluator",
    "Halves",
    "LabelRetrieval",
    "LongDocumentClassification",
    "ParaphraseIdentification",
    "PairedRetrieval",
    "STSEvaluator",
    "SemanticSimilarity",
    "SentEvalClassification",
    "cached_encode",
    "get_evaluator",
    "load_evaluation_model",
    "mean_pool",
    "resolve_tasks",
    "write_result",
]
