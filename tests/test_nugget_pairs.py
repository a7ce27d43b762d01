"""NUGGET's training pairs (what `make zoo` trains the shipped model on), built by the public
`nugget_recipe.write_training_pairs` from a tiny PI train split."""

from __future__ import annotations

import json

from docembed.training.nugget_recipe import HELD_OUT_QUERIES, write_training_pairs
from test_evaluation import _write_jsonl_gz


def _pi_train(root, trainable: int) -> None:
    """`trainable` tasks (source S{i}, gold G{i}, negative N{i}, and the held-out H0 as a candidate), then
    HELD_OUT_QUERIES held-out tasks (source H{i}, gold HG{i}); task 1's gold is empty."""
    docs, tasks = {}, []
    for i in range(trainable):
        docs |= {f"S{i}": f"source {i}", f"G{i}": "" if i == 1 else f"gold {i}", f"N{i}": f"other {i}"}
        tasks.append({"source": f"S{i}", "candidates": [f"N{i}", f"G{i}", "H0"], "answer": 1})
    for i in range(HELD_OUT_QUERIES):
        docs |= {f"H{i}": f"held {i}", f"HG{i}": f"held gold {i}"}
        tasks.append({"source": f"H{i}", "candidates": [f"HG{i}", "N0"], "answer": 0})
    split = root / "paraphrase_identification" / "train"
    split.mkdir(parents=True)
    (split / "docs.txt").write_text("\n".join(f"{k}\t{v}" for k, v in docs.items()), encoding="utf-8")
    (split / "task.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")


def test_pairs_leave_out_held_out_documents_and_empty_ones(tmp_path):
    root = tmp_path / "data"
    _pi_train(root, trainable=3)
    path = tmp_path / "pairs.jsonl"
    counts = write_training_pairs(path, sts=False, data_root=str(root))
    assert counts == {"pi_train": 2}  # task 1 has an empty gold
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(r["source"], r["target"]) for r in rows] == [
        ("source 0", "gold 0"),
        ("gold 0", "source 0"),
        ("source 2", "gold 2"),
        ("gold 2", "source 2"),
    ]
    # the held-out source H0 never appears, not even as a negative; the other candidate does
    assert rows[0]["negatives"] == ["other 0"] and rows[2]["negatives"] == ["other 2"]


def test_sts_pairs_scored_four_or_more_join_without_negatives(tmp_path):
    root = tmp_path / "data"
    _pi_train(root, trainable=1)
    for name in ("stsb", "sick"):
        scored = [
            {"id": str(s), "s1": f"{name} a{s}", "s2": f"{name} b{s}", "score": s} for s in (3.5, 4.0, 5)
        ]
        _write_jsonl_gz(root / "senteval" / f"{name}-train.jsonl.gz", scored)
    counts = write_training_pairs(tmp_path / "pairs.jsonl", data_root=str(root))
    assert counts == {"pi_train": 1, "senteval/stsb-train": 2, "senteval/sick-train": 2}
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 2 * 5 and {"source": "stsb a4.0", "target": "stsb b4.0"} in rows


def test_halves_of_long_documents_join_as_pairs_without_negatives(tmp_path):
    root = tmp_path / "data"
    _pi_train(root, trainable=1)
    documents = ["one two three four five six", "alpha beta gamma", "x"]
    counts = write_training_pairs(tmp_path / "p.jsonl", sts=False, data_root=str(root), halves_of=documents)
    assert counts == {"pi_train": 1, "halves": 2}  # "x" has no first half
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {"source": "one two three", "target": "four five six"} in rows
    assert {"source": "beta gamma", "target": "alpha"} in rows  # both directions, cut at the middle word
    assert all("negatives" not in row for row in rows[-4:])
