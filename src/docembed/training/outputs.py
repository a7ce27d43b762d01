"""Which folders a train-* command may write into, apart from the loop (no torch: the CLI checks an
output before it imports anything heavy)."""

from __future__ import annotations

from pathlib import Path

from docembed.io.outputs import STAGING_MARKER, DirectoryKind
from docembed.models.base import is_model_dir


def is_training_output(directory: Path) -> bool:
    """Whether `directory` is a folder docembed trains into: a saved model, a run's checkpoint or log, a
    staging folder docembed is filling, or a run that so far holds only a model it trained first (the PV
    teacher train-distill saves in OUTPUT/pv-teacher before its own training starts)."""
    return (
        is_model_dir(directory)
        or (directory / "checkpoint").is_dir()
        or (directory / "train_log.jsonl").is_file()
        or (directory / STAGING_MARKER).is_file()
        or any(is_model_dir(child) for child in directory.iterdir() if child.is_dir())
    )


#: where a train-* command may write (io/outputs.py's rule for directory outputs): a run resumes in it
TRAINING_OUTPUT = DirectoryKind(
    "docembed model or training run", "config.json, checkpoint/ or train_log.jsonl", is_training_output
)
