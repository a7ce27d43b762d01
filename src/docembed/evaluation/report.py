"""Markdown for results pages: the table helpers and the leaderboard's rows, shared by bench/run.py (which
renders docs/results.md) and scripts/zoo.py (which renders each model card's score table)."""

from __future__ import annotations

from collections.abc import Sequence

# (task, metric, label) of every leaderboard row, in page order. The `± SE` rows show the standard error the
# task reports beside its metric (`<metric>_se`).
LEADERBOARD_ROWS = [
    ("paraphrase-identification", "mrr", "PI dev MRR"),
    ("mr", "accuracy", "MR acc"),
    ("cr", "accuracy", "CR acc"),
    ("subj", "accuracy", "SUBJ acc"),
    ("mpqa", "accuracy", "MPQA acc"),
    ("stsb", "spearman", "STS-B Spearman"),
    ("sick", "spearman", "SICK-R Spearman"),
    ("imdb", "accuracy", "IMDB acc"),
    ("imdb", "accuracy_long", "IMDB acc, >512 tokens"),
    ("20newsgroups", "accuracy", "20NG acc"),
    ("20newsgroups", "accuracy_long", "20NG acc, >512 tokens"),
    ("20newsgroups-retrieval", "map@100", "20NG MAP@100"),
    ("20newsgroups-retrieval", "p@10", "20NG P@10"),
    ("20newsgroups-retrieval", "knn_accuracy", "20NG kNN acc (k=10)"),
    ("imdb-long", "accuracy", "IMDB >512 tokens: acc ± SE"),
    ("imdb-long", "map@100", "IMDB >512 tokens: MAP@100 ± SE"),
    ("20newsgroups-long", "accuracy", "20NG >512 tokens: acc ± SE"),
    ("20newsgroups-long", "map@100", "20NG >512 tokens: MAP@100 ± SE"),
    ("halves", "mrr", "first half -> second half MRR ± SE"),
]


def format_number(value, digits: int = 2) -> str:
    """A table cell: floats to `digits` decimals, None as an en dash, anything else as str()."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_cell(outcome: dict | None, metric: str | None = None) -> str:
    """One model's result on one task (an `EvalResult.to_dict()`, or {"error"/"missing": ...}) as a cell:
    the metric (the primary score when `metric` is None), with its standard error when the task gave one."""
    if outcome is None:
        return "–"
    if "error" in outcome:
        return "error"
    if "missing" in outcome:
        return "missing"
    value = outcome["metrics"].get(metric) if metric else outcome.get("score")
    error = outcome["metrics"].get(f"{metric}_se") if metric else None
    return format_number(value) if error is None else f"{format_number(value)} ± {format_number(error, 1)}"


def markdown_table(header: Sequence, rows: Sequence[Sequence]) -> list[str]:
    """A Markdown table as lines; cells go through `format_number`."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(format_number(cell) for cell in row) + " |" for row in rows]
    return lines
