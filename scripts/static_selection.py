"""Choose the shipped `static` model's settings on validation data only: STS-B dev and SICK-R dev (Spearman
x100) and SentEval MR/CR/SUBJ/MPQA probe accuracy on 2,000-sentence samples drawn with seed 7 (SentEval has no
held-out split; the leaderboard samples with seed 1111, so the two overlap by about a fifth). Token pooling x
weighting x dimension, from one pass of the vocabulary through MiniLM and token frequencies of IMDB train +
20 Newsgroups train. The score is the mean of the six. Writes bench/results/static/selection.json.

    python scripts/static_selection.py
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

from docembed import datasets
from docembed.evaluation import EvalOptions, get_evaluator
from docembed.models.registry import load_model
from docembed.models.static import StaticConfig, StaticEncoder
from docembed.training.static_distill import build_static, token_frequencies, token_outputs

OUT = Path(__file__).resolve().parents[1] / "bench" / "results" / "static" / "selection.json"
CORPUS = ("imdb/train", "20newsgroups/train")
STS_TASKS = ("stsb-dev", "sick-dev")
SENTEVAL_TASKS = ("mr", "cr", "subj", "mpqa")
TASKS = STS_TASKS + SENTEVAL_TASKS
# What ships: the best mean at 256 dimensions. 384 scores 0.39 higher on the mean but is 50 % larger (23.4 MB
# against 15.6 MB in fp16) in a zoo with an 80 MB budget for every model.
SHIPPED = {"token_pooling": "token", "weighting": "zipf", "dim": 256}
GRID = {
    "token_pooling": ("mean", "token"),
    "weighting": (("none", 0.0), ("zipf", 0.0), ("sif", 1e-3), ("sif", 1e-4)),
    "dim": (128, 256, 384),
}


def main() -> None:
    from transformers import AutoModel

    from docembed.models.offline import minilm_path

    started = time.perf_counter()
    tokenizer = StaticEncoder.from_base(StaticConfig()).tokenizer
    outputs = token_outputs(AutoModel.from_pretrained(str(minilm_path())), tokenizer)
    counts = token_frequencies(tokenizer, (t for name in CORPUS for t in datasets.iter_texts(name)))
    sts_options = EvalOptions(cache=False)
    senteval_options = EvalOptions(cache=False, limit=2000, seed=7, fast=True)
    evaluators = {task: get_evaluator(task, sts_options) for task in STS_TASKS}
    evaluators.update({task: get_evaluator(task, senteval_options) for task in SENTEVAL_TASKS})
    rows = []
    for pooling, (weighting, a), dim in itertools.product(*GRID.values()):
        config = StaticConfig(dim=dim, token_pooling=pooling, weighting=weighting, sif_a=a or 1e-3)
        model = build_static(outputs, counts, config, tokenizer=tokenizer)
        scores = {task: round(evaluators[task].run(model).score, 2) for task in TASKS}
        mean = round(sum(scores.values()) / len(scores), 2)
        rows.append(
            {"token_pooling": pooling, "weighting": weighting, "sif_a": a, "dim": dim, **scores, "mean": mean}
        )
        print(json.dumps(rows[-1]), flush=True)
    glove = load_model("glove-avg")
    reference = {task: round(evaluators[task].run(glove).score, 2) for task in TASKS}
    reference["mean"] = round(sum(reference.values()) / len(reference), 2)
    best = max(rows, key=lambda r: r["mean"])
    OUT.write_text(
        json.dumps(
            {
                "selected_on": {
                    "sts": list(STS_TASKS),
                    "senteval, 2,000 sentences, seed 7": list(SENTEVAL_TASKS),
                },
                "weights_corpus": list(CORPUS),
                "rows": rows,
                "best": best,
                "shipped": next(r for r in rows if all(r[k] == v for k, v in SHIPPED.items())),
                "glove-avg": reference,
                "seconds": round(time.perf_counter() - started, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print("best", json.dumps(best))


if __name__ == "__main__":
    main()
