"""The training-loop options every `train-*` command takes, declared once (typer only at import time).

`@loop_options(lr=..., ...)` adds them to a command's signature, with the family's own defaults where it
has them, and hands the values to the command as one `loop: LoopOptions` argument. A command passes
`loop.validation(encoder)` to `train(...)` as its validation hook (--eval-every, --eval-task)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields

import typer

AMP_MODES = ("auto", "off", "bf16", "fp16")


@dataclass
class LoopOptions:
    """The values of the shared options; field names are TrainConfig's."""

    epochs: int = 1
    max_steps: int | None = None
    time_budget_s: float | None = None
    lr: float = 5e-5
    warmup_steps: int = 0
    decay_steps: int = 0
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.01
    amp: str = "auto"
    log_every: int = 10
    save_every: int = 500
    resume: bool = False
    eval_every: int = 0
    eval_tasks: str | None = None  # not TrainConfig's: they build the validation hook
    eval_limit: int | None = None
    save_last: bool = False
    # not an option: the command validates on data of its own (train-retriever's --val), not --eval-task
    own_validation: bool = False

    def __post_init__(self):
        # Checked before the command loads data or models, not after the first N steps.
        from docembed.errors import UsageError

        if self.amp not in AMP_MODES:
            raise UsageError(f"--amp is one of {', '.join(AMP_MODES)}, not {self.amp!r}")
        if self.eval_every and not self.eval_tasks and not self.own_validation:
            raise UsageError("--eval-every needs --eval-task (e.g. --eval-task stsb-dev)")
        if self.eval_tasks:
            from docembed.evaluation.validation import selection_tasks

            selection_tasks(self.eval_tasks)

    def refuse_trained_output(self, output) -> None:
        """A folder that holds a trained model or a checkpoint is someone's result: trained over only with
        --resume (which continues it), never replaced in silence."""
        from pathlib import Path

        from docembed.errors import DocembedError

        if self.resume:
            return
        held = [name for name in ("config.json", "checkpoint") if (Path(output) / name).exists()]
        if held:
            what = "a model" if "config.json" in held else "a checkpoint"
            raise DocembedError(f"{output} already holds {what}: pass --resume to continue it, or another -o")

    def train_config(self, output_dir, seed: int, device: str):
        """The loop's TrainConfig for a run writing to `output_dir`."""
        from docembed.training.loop import TrainConfig

        names = {f.name for f in fields(TrainConfig)} & {f.name for f in fields(self)}
        values = {name: getattr(self, name) for name in names}
        return TrainConfig(output_dir=str(output_dir), seed=seed, device=device, **values)

    def validation(self, encoder):
        """The loop's validation hook scoring `encoder` (the Encoder around the module being trained) on
        --eval-task, or None without it."""
        if not self.eval_tasks:
            return None
        from docembed.evaluation.base import EvalOptions
        from docembed.evaluation.validation import Validation

        return Validation(encoder, self.eval_tasks, EvalOptions(limit=self.eval_limit))


# field -> (value type, option names, extra typer.Option arguments); the order is the --help order.
_OPTIONS = {
    "epochs": (int, ("--epochs",), {"min": 1, "help": "Passes over the corpus."}),
    "max_steps": (int, ("--max-steps",), {"min": 1, "help": "Stop after this many optimizer steps."}),
    "time_budget_s": (float, ("--time-budget",), {"help": "Stop (and save) after this many seconds."}),
    "lr": (float, ("--lr",), {"help": "Peak learning rate (AdamW)."}),
    "warmup_steps": (int, ("--warmup-steps",), {"min": 0, "help": "Linear warm-up steps."}),
    "decay_steps": (
        int,
        ("--decay-steps",),
        {"min": 0, "help": "Decay the LR linearly to 0 over the last N steps before --max-steps."},
    ),
    "grad_accum": (int, ("--grad-accum",), {"min": 1, "help": "Micro-batches per optimizer step."}),
    "max_grad_norm": (float, ("--max-grad-norm",), {"help": "Clip gradients to this norm (0: no clipping)."}),
    "weight_decay": (float, ("--weight-decay",), {"min": 0.0, "help": "AdamW's decoupled weight decay."}),
    "amp": (str, ("--amp",), {"help": "auto | off | bf16 | fp16 (mixed precision on CUDA only)."}),
    "log_every": (int, ("--log-every",), {"min": 1, "help": "Optimizer steps between log lines."}),
    "save_every": (int, ("--save-every",), {"min": 1, "help": "Optimizer steps between checkpoints."}),
    "resume": (bool, ("--resume",), {"help": "Continue from OUTPUT/checkpoint."}),
    "eval_every": (
        int,
        ("--eval-every",),
        {
            "min": 0,
            "help": "Validate on --eval-task every N optimizer steps (and at the end); keep the best.",
        },
    ),
    "eval_tasks": (
        str,
        ("--eval-task",),
        {
            "help": "Selection tasks to validate on, comma-separated (stsb-dev, sick-dev, halves-val, "
            "imdb-long-val, 20newsgroups-long-val, paraphrase-identification-train; no test splits); "
            "the score is the mean of their primary metrics. The best weights are saved (OUTPUT/best)."
        },
    ),
    "eval_limit": (int, ("--eval-limit",), {"min": 1, "help": "Validate on N examples per task (seeded)."}),
    "save_last": (bool, ("--save-last",), {"help": "Save the last weights, not the best-validated ones."}),
}
OPTION_NAMES = [names[0] for _, names, _ in _OPTIONS.values()]


def loop_options(own_validation: bool = False, **defaults):
    """Decorator for a train-* command `def command(..., loop: LoopOptions)`: adds the shared options to its
    CLI (defaults from LoopOptions unless given here, e.g. `lr=5e-4`) and passes them as `loop`.
    `own_validation`: the command validates on data of its own, so --eval-every does not need --eval-task."""
    unknown = set(defaults) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"not loop options: {sorted(unknown)}")
    base = LoopOptions(**defaults)

    def decorate(command):
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.name != "loop"]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(getattr(base, name), *names, **extra),
                annotation=kind,
            )
            for name, (kind, names, extra) in _OPTIONS.items()
        ]

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            values = {name: kwargs.pop(name, getattr(base, name)) for name in _OPTIONS}
            _check_training_output(kwargs.get("output") or kwargs.get("output_dir"), kwargs.get("corpus"))
            return command(*args, loop=LoopOptions(**values, own_validation=own_validation), **kwargs)

        hints = {k: v for k, v in command.__annotations__.items() if k not in ("loop", "return")}
        wrapper.__annotations__ = {**hints, **{name: spec[0] for name, spec in _OPTIONS.items()}}
        wrapper.__signature__ = signature.replace(parameters=[*_keyword_only(kept), *added])
        return wrapper

    return decorate


def _check_training_output(output: str | None, corpus: str | list[str] | None) -> None:
    """Before anything is written: a run writes into OUTPUT (and resumes there), so OUTPUT must be new,
    empty, or a model or run docembed wrote (io/outputs.py), never a folder of the user's files."""
    if output is None:
        return
    from docembed.io.outputs import check_output
    from docembed.training.outputs import TRAINING_OUTPUT

    inputs = [corpus] if isinstance(corpus, str) else list(corpus or [])
    check_output(output, True, directory=True, inputs=inputs, kind=TRAINING_OUTPUT)


def _keyword_only(parameters):
    # typer calls commands with keywords only; keyword-only parameters may then follow in any order.
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters]
