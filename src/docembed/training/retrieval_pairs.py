"""Training examples for a retriever that finds the part of a long document a query is about (issue 45).

A passage-scoring model (`sbert-windows`) scores a document by its best windows, so it is trained on
(query, window) pairs: a query about one part of a document and the window of the document that part is
in. Five kinds of view, drawn from unlabelled documents (the first four by default):
- part: a passage of consecutive lines (60-200 words) -> the window of text around the place it was taken
  from (document_pairs.part_view), the shape of "a passage -> its page";
- snippet: the first `LEAD_WORDS` words of such a passage -> the same window, the shape of "a few specific
  words of a manual -> its page" (the long-document bench's passage queries since 2026-11-27, where the
  models trained on whole passages lose to tf-idf);
- next: a window -> the window that follows it (document_pairs.halves_view), the shape of "first half ->
  second half": two parts of one document, nothing shared but its subject;
- lead: a text's first `LEAD_WORDS` words -> the words after them, the shape of "the opening of a post ->
  the thread it is in" (short queries);
- summary: the document's `summary` field (a man page's one-line description, a title) -> its opening
  window, the shape of "a summary-like text -> the document".
Each example also gets a hard negative, mined with BM25: a window of another document among the
`NEGATIVE_DEPTH` windows that BM25 ranks highest for the query (a random one of them, not the first, which
is more often a near copy: a man page of the same command family, a quoted reply).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from docembed.training.document_pairs import halves_view, part_view

DEFAULT_KINDS = ("part", "next", "lead", "summary")
KINDS = (*DEFAULT_KINDS, "snippet")
LEAD_WORDS = 30
NEGATIVE_DEPTH = 10
MINING_BLOCK = 1024  # queries scored against every window at once (a block's scores: 4 bytes each)


# train-retriever's loop settings: a few hundred steps of three layers of a pretrained model (a CPU hour).
# 1e-4 was chosen on the held-out documents of the shipped model's run: at 3e-5 (sentence-transformers'
# fine-tuning rate) validation MRR stayed at 0.786 from step 45 to 90; at 1e-4 it reached 0.803 by step 200.
RETRIEVER_LOOP: dict = {"lr": 1e-4, "warmup_steps": 20, "eval_every": 0, "save_every": 50}


@dataclass
class RetrieverTraining:
    """The objective's settings (the loop's are TrainConfig's). (Imported by the CLI: nothing heavy here.)"""

    batch_size: int = 16  # examples per step, of one group
    train_layers: int = 3  # the top transformer layers that train (the rest are frozen)
    query_tokens: int = 128  # a query is cut to this many tokens in training (windows: the model's own)
    scale: float = 20.0  # the contrastive loss' inverse temperature
    per_document: int = 2  # examples drawn per training document
    window_words: int = 160  # words of a positive window (about 210 tokens of MiniLM's 256)
    hard_negatives: bool = True


@dataclass(frozen=True)
class RetrievalDocument:
    text: str
    group: str = ""  # a batch's examples share a group: pages of one manual are each other's negatives
    summary: str | None = None


@dataclass(frozen=True)
class RetrievalExample:
    query: str
    positive: str
    document: int  # the index of the document both come from (a negative must come from another)
    group: str
    kind: str
    negative: str | None = None


def read_documents(path: str, text_field: str = "text") -> list[RetrievalDocument]:
    """The documents of a JSON Lines file: `text_field`, and optionally "group" (default: the "id" up to its
    last "/") and "summary". A line that is not such a record fails, naming it."""
    from docembed.errors import InputFormatError
    from docembed.io.readers import json_record

    documents = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            row = json_record(raw, path, number)
            text, summary = row.get(text_field), row.get("summary")
            group = row.get("group", str(row.get("id", "")).rpartition("/")[0])
            if (
                not isinstance(text, str)
                or not isinstance(group, str)
                or not isinstance(summary, (str, type(None)))
            ):
                raise InputFormatError(
                    path, number, f"needs a string {text_field!r} (and string group, summary)"
                )
            if text.strip():
                documents.append(RetrievalDocument(text, group, summary))
    return documents


def lead_view(text: str, window_words: int) -> tuple[str, str] | None:
    words = text.split()
    if len(words) < 2 * LEAD_WORDS:
        return None
    return " ".join(words[:LEAD_WORDS]), " ".join(words[LEAD_WORDS : LEAD_WORDS + window_words])


def summary_view(document: RetrievalDocument, window_words: int) -> tuple[str, str] | None:
    if not document.summary or not document.summary.strip():
        return None
    return document.summary.strip(), " ".join(document.text.split()[:window_words])


def view(document: RetrievalDocument, kind: str, rng: random.Random, window_words: int):
    """One (query, positive) of `kind` from `document`, or None when the document has no such view."""
    if kind in ("part", "snippet"):
        pair = part_view(document.text, rng, window_words)
        if pair is None or kind == "part":
            return pair
        return " ".join(pair[0].split()[:LEAD_WORDS]), pair[1]
    if kind == "next":
        if len(document.text.split()) < 2 * LEAD_WORDS:
            return None
        return halves_view(document.text, rng, window_words)
    if kind == "lead":
        return lead_view(document.text, window_words)
    if kind == "summary":
        return summary_view(document, window_words)
    raise ValueError(f"unknown view kind {kind!r} (one of {', '.join(KINDS)})")


def make_examples(
    documents: Sequence[RetrievalDocument],
    kinds: Sequence[str] = DEFAULT_KINDS,
    per_document: int = 2,
    window_words: int = 160,
    seed: int = 0,
) -> list[RetrievalExample]:
    """Up to `per_document` examples per document, each of a different kind, the kinds in a random order
    per document (a kind the document has no view of is passed over)."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown view kind {kind!r} (one of {', '.join(KINDS)})")
    rng = random.Random(seed)
    examples = []
    for index, document in enumerate(documents):
        order = list(kinds)
        rng.shuffle(order)
        made = 0
        for kind in order:
            if made == per_document:
                break
            pair = view(document, kind, rng, window_words)
            if pair is not None and pair[0].strip() and pair[1].strip():
                examples.append(RetrievalExample(pair[0], pair[1], index, document.group, kind))
                made += 1
    return examples


def mine_negatives(
    examples: Sequence[RetrievalExample],
    seed: int = 0,
    depth: int = NEGATIVE_DEPTH,
    analyzer: str = "english",
) -> list[RetrievalExample]:
    """Each example with a hard negative: a positive window of another document, drawn among the `depth`
    that BM25 (fitted on all the windows) ranks highest for its query."""
    import numpy as np

    from docembed.models.baselines import BM25Config, BM25Scorer

    positives = [e.positive for e in examples]
    scorer = BM25Scorer(BM25Config(analyzer=analyzer)).fit(positives)
    documents = np.array([e.document for e in examples])
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, len(examples), MINING_BLOCK):
        block = examples[start : start + MINING_BLOCK]
        scores = scorer.score_matrix([e.query for e in block], positives)
        for row, example in enumerate(block):
            scores[row, documents == example.document] = -np.inf
            top = np.argpartition(-scores[row], min(depth, len(positives) - 1))[:depth]
            top = top[np.isfinite(scores[row, top])]
            if len(top) == 0:  # every window is this document's own
                out.append(example)
                continue
            out.append(replace(example, negative=positives[int(rng.choice(top))]))
    return out
