"""NUGGET against the IDF rule on every PI *train* query (issue 14's check beside PI dev): four folds of the
1,024 train queries; each fold's scorer trains on the pairs of the other three (the shipped recipe: the sim
objective, 14 hard negatives, IDF prior 1, whole encoder and W_V frozen, 3 epochs) and scores the fold's
queries, against the IDF rule on the same queries. Reported: per fold and pooled MRR, and the pooled paired
difference to the rule with its standard error, for the shipped recipe (trained selecting 25 %) and the same
recipe trained at the 10 % it encodes with. PI dev is not read. The fourth fold is bench_nugget.py's held-out
check (the last 256 queries). Like there, a fold's other candidates are documents of the whole split, most of
them a source or gold of a training pair.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_nugget_folds.py    # bench/results/nugget/folds.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_nugget  # noqa: E402  (the PI helpers: evaluator, shared token states)

FOLDS = 4
RECIPES = {  # label -> --train-ratio (the model encodes at r = 0.1 in both)
    "trained selecting 25 % (shipped recipe)": 0.25,
    "trained selecting 10 %": None,
}


def fold_pairs(docs: dict, tasks: list[dict], fold: int):
    """Training pairs (both directions, the task's other candidates as hard negatives) of every task whose
    source and gold are outside the fold (nugget_recipe.pi_train_pairs); the fold's query range."""
    from docembed.training.nugget_recipe import pi_train_pairs

    size = len(tasks) // FOLDS
    span = (fold * size, (fold + 1) * size)
    held = {i for t in tasks[span[0] : span[1]] for i in (t["source"], t["candidates"][t["answer"]])}
    sources, targets, negatives = [], [], []
    for source, gold, others in pi_train_pairs(docs, tasks, held):
        for a, b in ((source, gold), (gold, source)):
            sources.append(a)
            targets.append(b)
            negatives.append(others)
    return sources, targets, negatives, span


def fold_reciprocal_ranks(model, shared: dict, docs: dict, tasks: list[dict], span) -> list[float]:
    """Each query's reciprocal rank in the fold, the model encoding from the shared token states."""
    from docembed.evaluation import EvalOptions
    from docembed.evaluation.tasks import ParaphraseIdentificationTrain

    def from_states(model, texts):
        return model.encode_from_states(texts, shared)

    fold = tasks[span[0] : span[1]]
    evaluator = ParaphraseIdentificationTrain(docs, fold, EvalOptions(), embed=from_states)
    model.set_ratio(0.1)
    return evaluator.run(model).metrics["per_item"]["mrr"]


def main(out_dir: Path, full: bool = False) -> dict:
    import numpy as np
    import torch

    from docembed import datasets
    from docembed.models.nugget import NuggetConfig, NuggetEncoder
    from docembed.training.loop import TrainConfig, train
    from docembed.training.nugget_recipe import NuggetRecipe, tokenize_examples

    started = time.perf_counter()
    docs = {d.id: d.text for d in datasets.documents("paraphrase_identification/train/docs")}
    tasks = list(datasets.records("paraphrase_identification/train/task"))
    # the IDF table of every model here is the shipped model's: fitted on its training text, which is the
    # text of the pairs outside the last fold (the held-out queries)
    sources, targets, _, _ = fold_pairs(docs, tasks, FOLDS - 1)
    idf_texts = list(dict.fromkeys(sources + targets))

    def encoder(**options):
        torch.manual_seed(0)
        config = NuggetConfig(max_length=bench_nugget.MAX_LENGTH, feedback=False, **options)
        model = NuggetEncoder(config, name="folds")
        model.fit_idf(idf_texts)
        return model

    rule = encoder(selector="idf", freeze="encoder")
    shared = bench_nugget.shared_states(rule, list(dict.fromkeys(docs.values())))
    # the recipe's own cache format (bf16 per document), built once from the shared states
    states = {key: (b.to(torch.bfloat16), t.to(torch.bfloat16)) for key, (b, t) in shared.items()}
    ranks: dict[str, list[float]] = {"idf rule": []}
    folds = []
    for fold in range(FOLDS):
        sources, targets, negatives, span = fold_pairs(docs, tasks, fold)
        row = {"queries": list(span), "training_pairs": len(sources) // 2}
        rule_ranks = fold_reciprocal_ranks(rule, shared, docs, tasks, span)
        ranks["idf rule"] += rule_ranks
        row["idf rule"] = round(100 * float(np.mean(rule_ranks)), 2)
        for label, train_ratio in RECIPES.items():
            model = encoder(freeze="encoder+value", idf_prior=1.0)
            examples = tokenize_examples(model, sources, targets, bench_nugget.MAX_LENGTH, negatives)
            recipe = NuggetRecipe(
                model, examples, "sim", batch_size=16, seed=0, negatives_per_pair=14, train_ratio=train_ratio
            )
            recipe.states = states
            config = TrainConfig(
                output_dir=str(bench_nugget.ROOT / "runs" / "nugget-folds" / f"{fold}-{train_ratio}"),
                epochs=3,
                lr=1e-4,
                warmup_steps=10,
                device="cpu",
                seed=0,
                log_every=50,
                save_every=100_000,
            )
            train(recipe, config)
            model_ranks = fold_reciprocal_ranks(model, shared, docs, tasks, span)
            ranks.setdefault(label, []).extend(model_ranks)
            row[label] = round(100 * float(np.mean(model_ranks)), 2)
        folds.append(row)
        print(f"fold {fold}: {row}", file=sys.stderr, flush=True)
    pooled = {"idf rule": {"mrr": round(100 * float(np.mean(ranks["idf rule"])), 2)}}
    for label in RECIPES:
        pooled[label] = {
            "mrr": round(100 * float(np.mean(ranks[label])), 2),
            "vs_idf_rule": bench_nugget.versus(ranks[label], ranks["idf rule"]),
        }
    results = {
        "setup": f"{FOLDS} folds of the {len(tasks)} PI train queries, r = 0.1, {bench_nugget.MAX_LENGTH} "
        "tokens; the shipped recipe (3 epochs, lr 1e-4, 14 hard negatives) per fold",
        "folds": folds,
        "pooled": pooled,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - started, 1),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "folds.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/nugget"))
    args = parser.parse_args()
    print(json.dumps(main(args.out)["pooled"], indent=2))
