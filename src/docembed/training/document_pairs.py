"""Query / positive views of one document, for training a document encoder contrastively on text that has
no labels (issue 35: the student on documentation and man pages).

Two kinds of view, one drawn at random per document and step (so every epoch sees new views):
- halves: a window of at most 2 * `max_words` consecutive words (the whole document when shorter, else at a
  random place), cut in the middle: first half -> second half;
- part: a passage of consecutive lines (paragraphs) of 60 to 200 words, three lines or more where the
  document has them, from anywhere past its first line -> the document without it, cut to `max_words`
  words around where the passage was (a passage is about the text near it).
These are the shapes of bench_student_kinds' two tasks; the student trains only on documents those tasks
never use (their `train` split, or man pages shorter than the bench's).
"""

from __future__ import annotations

import random

PASSAGE_WORDS = (60, 200)
PASSAGE_LINES = 3


def halves_view(text: str, rng: random.Random, max_words: int) -> tuple[str, str]:
    """(first half, second half) of a random window of at most 2 * max_words words of `text`."""
    words = text.split(" ")
    if len(words) > 2 * max_words:
        start = rng.randrange(len(words) - 2 * max_words + 1)
        words = words[start : start + 2 * max_words]
    middle = len(words) // 2
    return " ".join(words[:middle]), " ".join(words[middle:])


def part_view(text: str, rng: random.Random, max_words: int) -> tuple[str, str] | None:
    """(a passage of consecutive lines, the rest of `text` around it, at most max_words words), or None when
    `text` has fewer than PASSAGE_LINES + 1 lines (no passage leaves a page behind)."""
    lines = text.split("\n")
    if len(lines) <= PASSAGE_LINES:
        return None
    start = rng.randrange(1, len(lines) - PASSAGE_LINES + 1)
    end, words = start, 0
    least, most = PASSAGE_WORDS
    while end < len(lines) and (end - start < PASSAGE_LINES or words < least) and words < most:
        words += len(lines[end].split())
        end += 1
    before = " ".join(lines[:start]).split()
    after = " ".join(lines[end:]).split()
    # the rest: max_words words centred on the passage's gap (all of one side when the other is short)
    keep_before = min(len(before), max(max_words // 2, max_words - len(after)))
    keep_after = min(len(after), max_words - keep_before)
    rest = before[len(before) - keep_before :] + after[:keep_after]
    if not rest:
        return None
    return "\n".join(lines[start:end]), " ".join(rest)


def document_view(text: str, rng: random.Random, max_words: int = 1400) -> tuple[str, str]:
    """A (query, positive) pair from `text`: a part view or a halves view, even odds (halves when the text
    has too few lines for a passage)."""
    if rng.random() < 0.5:
        pair = part_view(text, rng, max_words)
        if pair is not None:
            return pair
    return halves_view(text, rng, max_words)
