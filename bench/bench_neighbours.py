"""Why the set encoder's near neighbours are weak on 20 Newsgroups (issue 16): thread-mates and quoted text.

For tfidf, Paragraph Vector and the set encoder, on the 20 Newsgroups test split (7,532 posts), each post
queries all the others (the harness' `label_retrieval`: leave-one-out kNN accuracy, k = 10, and MAP@100,
same newsgroup = relevant), twice: on the posts as they are, and with quoted lines removed (lines that start
with ">", ":" or "|", and "... writes:" / "wrote:" attribution lines; tfidf is refitted on the train split
cleaned the same way). Per model and condition it also reports how often the top-1 neighbour is a
*thread-mate*: a post that shares a line of more than 20 characters with the query (after stripping quote
marks), i.e. a reply quoting it, a post it quotes, or the same signature; and the top-1 neighbour's label
accuracy when it is and when it is not one.

Models: the set encoder from `SETENC_MODEL` and PV from `PV_MODEL` (the ones bench_setenc.py trained or
used: default bench/results/<date>/setenc-model and pv-model, else runs/setenc-20ng-final, runs/pv-20ng).
Quick mode (the default of `make bench`) uses a stratified 2,000 test posts.

    OMP_NUM_THREADS=1 SETENC_MODEL=DIR PV_MODEL=DIR .venv/bin/python bench/bench_neighbours.py --full
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUOTED = re.compile(r"^\s*(>|:|\|)|(writes|wrote):\s*$")
QUOTE_MARKS = re.compile(r"^[\s>|:]+")
MIN_SHARED_LINE = 20  # characters: shorter lines ("Thanks,", "-- ") are shared by unrelated posts


def strip_quoted(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not QUOTED.search(line))


def _lines(text: str) -> set[str]:
    stripped = (QUOTE_MARKS.sub("", line).strip() for line in text.splitlines())
    return {line for line in stripped if len(line) > MIN_SHARED_LINE}


def thread_mates(texts: list[str]) -> list[set[int]]:
    """For each text, the other texts that share a long line with it."""
    holders: dict[str, set[int]] = {}
    line_sets = [_lines(t) for t in texts]
    for i, lines in enumerate(line_sets):
        for line in lines:
            holders.setdefault(line, set()).add(i)
    return [set().union(*(holders[line] for line in lines)) - {i} for i, lines in enumerate(line_sets)]


def _model_dir(variable: str, *candidates: pathlib.Path) -> str | None:
    if os.environ.get(variable):
        return os.environ[variable]
    return next((str(p) for p in candidates if (p / "config.json").exists()), None)


def _similarities(name: str, spec: str, texts: list[str], train: list[str]) -> np.ndarray:
    from docembed.evaluation import load_evaluation_model
    from docembed.scoring import cosine_matrix

    model = load_evaluation_model(spec)
    if name == "tfidf":
        model.fit(train)
        rows = model.encode_sparse(texts)
        return np.asarray((rows @ rows.T).todense(), dtype=np.float32)
    vectors = model.encode(texts)
    return cosine_matrix(vectors, vectors)


def main(out_dir: pathlib.Path, full: bool = False) -> dict:
    import torch

    from docembed import datasets
    from docembed.evaluation.retrieval import label_retrieval
    from docembed.evaluation.statistics import sample_indices

    torch.set_num_threads(1)
    records = list(datasets.records("20newsgroups/test"))
    keep = sample_indices(
        len(records), None if full else 2000, np.random.default_rng(1111), [r["label"] for r in records]
    )
    texts = [records[i]["text"] for i in keep]
    labels = np.array([records[i]["label"] for i in keep])
    train = list(datasets.iter_texts("20newsgroups/train"))
    out = pathlib.Path(out_dir)
    models = {
        "tfidf": "tfidf",
        "pv": _model_dir("PV_MODEL", out / "pv-model", ROOT / "runs" / "pv-20ng"),
        "setenc": _model_dir("SETENC_MODEL", out / "setenc-model", ROOT / "runs" / "setenc-20ng-final"),
    }
    mates = thread_mates(texts)
    result: dict = {
        "data": f"20newsgroups/test: {len(texts)} posts{'' if full else ' (stratified subset)'}",
        "posts_with_quoted_lines": int(sum(t != strip_quoted(t) for t in texts)),
        "posts_with_a_thread_mate": int(sum(bool(m) for m in mates)),
        "models": {k: v for k, v in models.items() if v},
        "scores": {},
    }
    for name, spec in models.items():
        if spec is None:
            result["scores"][name] = {"missing": "no trained model found (run bench_setenc.py first)"}
            continue
        for condition, clean in (("as is", lambda t: t), ("quoted lines removed", strip_quoted)):
            sims = _similarities(name, spec, [clean(t) for t in texts], [clean(t) for t in train])
            scores = label_retrieval(sims, labels, np.random.default_rng(1111))
            np.fill_diagonal(sims, -np.inf)
            top1 = sims.argmax(axis=1)
            is_mate = np.array([int(top1[i]) in mates[i] for i in range(len(texts))])
            correct = labels[top1] == labels
            row = {
                "knn_accuracy": round(scores["knn_accuracy"], 2),
                "map@100": round(scores["map@100"], 2),
                "top1_is_thread_mate": round(100 * float(is_mate.mean()), 2),
                "top1_correct_when_thread_mate": round(100 * float(correct[is_mate].mean()), 2)
                if is_mate.any()
                else None,
                "top1_correct_otherwise": round(100 * float(correct[~is_mate].mean()), 2),
            }
            result["scores"][f"{name} / {condition}"] = row
            print(f"{name} / {condition}: {json.dumps(row)}", file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_neighbours.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("DOCEMBED_DATA", str(ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="all 7,532 test posts (default: 2,000)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "setenc"))
    args = parser.parse_args()
    print(json.dumps(main(pathlib.Path(args.out), full=args.full), indent=2))
