"""Validation inside the training loop: the `validate` hook `docembed.training.loop.train` calls every
`--eval-every` steps, scoring the encoder being trained on evaluation tasks.

Only selection splits are accepted (tasks named -dev, -val or -train: `stsb-dev`, `sick-dev`, `halves-val`,
`imdb-long-val`, `20newsgroups-long-val`, `paraphrase-identification-train`): the best checkpoint is chosen
on these scores, so a test split here would leak into the reported numbers. The primary score is the mean
of the tasks' primary metrics (higher is better); the embedding cache is off, since the weights change
between calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from docembed.errors import UsageError
from docembed.evaluation import TASKS, get_evaluator, resolve_tasks
from docembed.evaluation.base import EvalOptions

SELECTION_SUFFIXES = ("-dev", "-val", "-train")


def selection_tasks(names: str | Iterable[str]) -> list[str]:
    """Task names (groups, aliases, comma-separated) -> tasks, refusing any that is not a selection split."""
    tasks = resolve_tasks([names] if isinstance(names, str) else names)
    test = [task for task in tasks if not task.endswith(SELECTION_SUFFIXES)]
    if test:
        allowed = ", ".join(sorted(t for t in TASKS if t.endswith(SELECTION_SUFFIXES)))
        raise UsageError(
            f"{', '.join(test)}: a test split must not choose the checkpoint; validate on a selection "
            f"split instead: {allowed}"
        )
    return tasks


class Validation:
    """The loop's validation hook for `encoder`, the Encoder around the module being trained: called with
    the device the module trains on, it returns {"score": mean primary metric, "TASK/METRIC": ...}."""

    primary_metric = "score"

    def __init__(self, encoder, tasks: str | Iterable[str], options: EvalOptions | None = None):
        self.encoder = encoder
        options = dataclasses.replace(options or EvalOptions(), cache=False)
        # Read from the data root once, here: missing data fails before training, not after N steps.
        self.evaluators = [get_evaluator(task, options) for task in selection_tasks(tasks)]

    def __call__(self, device: str) -> dict[str, float]:
        # The encoder's own device setting follows the module (moved by the loop); to() also drops state
        # derived from the weights (QuickThoughts' expanded vocabulary).
        self.encoder.to(device)
        scores = {}
        for evaluator in self.evaluators:
            result = evaluator.run(self.encoder)
            scores[f"{result.task}/{result.primary_metric}"] = result.score
        return {"score": sum(scores.values()) / len(scores), **scores}
