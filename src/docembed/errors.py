"""Errors a user can cause. The CLI prints their message as one line and exits with `exit_code`;
anything else is a bug and keeps its traceback."""

from __future__ import annotations


class DocembedError(Exception):
    """A runtime error caused by the user's input or environment (exit status 1)."""

    exit_code = 1


class UsageError(DocembedError):
    """A wrong combination of options or arguments (exit status 2, like a parse error)."""

    exit_code = 2


class InputFormatError(DocembedError):
    """A malformed record in an input file; the message names the file and the line."""

    def __init__(self, source: str, line_number: int, reason: str):
        super().__init__(f"{source}:{line_number}: {reason}")
        self.source = source
        self.line_number = line_number
        self.reason = reason


class ModelNotFoundError(DocembedError):
    pass


class CorruptModelError(DocembedError):
    pass


class TruncationWarning(UserWarning):
    """A model read only the start of some texts (`docembed.load(...).max_tokens`); the message says how many
    texts and what share of their tokens were not read."""
