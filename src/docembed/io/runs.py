"""Ranked results in the IR conventions: TREC run lines (`qid Q0 docid rank score tag`) written by `search`
and `rerank --output-format trec`, and runs read back for `evaluate --qrels --run`, from a TREC run file or
from the JSONL `search` / `rerank` write (`{query_id, results: [{id, score}]}`,
`{source, ranking: [{id, score}]}`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from docembed.errors import DocembedError

TREC = "trec"
OUTPUT_FORMATS = ("jsonl", TREC)


def check_output_format(value: str) -> str:
    from docembed.errors import UsageError

    if value not in OUTPUT_FORMATS:
        raise UsageError(f"--output-format: expected {' or '.join(OUTPUT_FORMATS)}, got {value!r}")
    return value


def hit_rows(hits: list[tuple[str, float]]) -> list[dict]:
    """Ranked (id, score) pairs as `search` writes them: [{id, score}], scores rounded to 6 decimals."""
    return [{"id": doc_id, "score": round(score, 6)} for doc_id, score in hits]


def trec_lines(qid: str, hits: list[dict], tag: str) -> str:
    """TREC run lines for ranked hits [{id, score}] (best first; ranks 1, 2, ...). A TREC run is
    whitespace-separated, so an id (or tag) that is empty or holds whitespace is refused in one line."""
    for value, what in ((qid, "query id"), (tag, "run tag"), *((h["id"], "document id") for h in hits)):
        if not value or any(c.isspace() for c in value):
            raise DocembedError(f"{what} {value!r} is empty or holds whitespace: a TREC run cannot hold it")
    return "".join(f"{qid} Q0 {h['id']} {rank} {h['score']} {tag}\n" for rank, h in enumerate(hits, 1))


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """{qid: {docid: score}} from a TREC run file or from `search` / `rerank` JSONL output."""
    path = Path(path)
    text = _read_text(path)
    run: dict[str, dict[str, float]] = {}
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            qid, hits = _jsonl_row(path, line_number, line)
            for doc_id, score in hits:
                _add_score(run.setdefault(qid, {}), qid, doc_id, score, path, line_number)
            continue
        fields = line.split()
        if len(fields) != 6:
            raise DocembedError(f"{path}:{line_number}: expected `qid Q0 docid rank score tag`")
        score = _score(path, line_number, fields[4])
        _add_score(run.setdefault(fields[0], {}), fields[0], fields[2], score, path, line_number)
    if not run:
        raise DocembedError(f"{path}: the run holds no results")
    return run


def _add_score(ranking: dict[str, float], qid: str, doc_id: str, score: float, path: Path, line: int) -> None:
    """One hit of a run: a document ranked twice for one query has no one rank (the last line would win in
    silence, and the measures with it), so it is refused, as trec_eval refuses it."""
    if doc_id in ranking:
        raise DocembedError(f"{path}:{line}: document {doc_id!r} is ranked twice for query {qid!r}")
    ranking[doc_id] = score


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise DocembedError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise DocembedError(f"cannot read {path}: not UTF-8 ({error.reason} at byte {error.start})") from None


def _jsonl_row(path: Path, line_number: int, line: str) -> tuple[str, list[tuple[str, float]]]:
    try:
        row = json.loads(line)
        qid = row.get("query_id", row.get("source"))
        hits = row["results"] if "results" in row else row["ranking"]
        pairs = [(str(h["id"]), h["score"]) for h in hits]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DocembedError(
            f"{path}:{line_number}: expected a `search` row {{query_id, results: [{{id, score}}]}} or a "
            "`rerank` row {source, ranking: [{id, score}]}"
        ) from None
    return str(qid), [(doc_id, _score(path, line_number, score)) for doc_id, score in pairs]


def _score(path: Path, line_number: int, value) -> float:
    """A run's score: a finite number (a nan would rank first, an inf above every real score)."""
    try:
        score = float(value)
    except (ValueError, TypeError):
        raise DocembedError(f"{path}:{line_number}: score {value!r} is not a number") from None
    if not math.isfinite(score):
        raise DocembedError(f"{path}:{line_number}: score {value!r} is not a finite number")
    return score


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """{qid: {docid: relevance}} from a TREC qrels file (`qid iteration docid relevance`)."""
    path = Path(path)
    text = _read_text(path)
    qrels: dict[str, dict[str, int]] = {}
    for line_number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 4:
            raise DocembedError(f"{path}:{line_number}: expected `qid iteration docid relevance`")
        try:
            relevance = int(fields[3])
        except ValueError:
            raise DocembedError(f"{path}:{line_number}: relevance {fields[3]!r} is not an integer") from None
        judged = qrels.setdefault(fields[0], {})
        # judged twice alike is harmless; judged apart, the last line would decide in silence
        if judged.get(fields[2], relevance) != relevance:
            raise DocembedError(
                f"{path}:{line_number}: document {fields[2]!r} is judged {judged[fields[2]]} and {relevance} "
                f"for query {fields[0]!r}: keep one judgement"
            )
        judged[fields[2]] = relevance
    if not qrels:
        raise DocembedError(f"{path}: no judgements")
    return qrels
