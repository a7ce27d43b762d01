"""`make demo`: docembed end to end on built-in defaults, offline, in a few minutes on 2 cores.

1. builds a small real corpus from Python's own documentation (pydoc_data: ~900 distinct paragraphs of the
   language reference), plus a reranking task made from it (query = a paragraph's first sentence,
   candidates = the rest of that paragraph and 9 other paragraphs);
2. trains a Paragraph Vector model on the corpus (`docembed train-pv`);
3. encodes the corpus with sbert (all-MiniLM-L6-v2, offline) and with the new PV model (`docembed encode`);
4. compares two texts (`docembed similarity`), reranks the task (`docembed rerank`) and scores it (MRR),
5. builds a faiss index and searches it (`docembed index build`, `docembed search`).
Everything is run through the `docembed` command, as a user would; outputs land in runs/demo/.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "demo"
DOCEMBED = [str(Path(sys.executable).with_name("docembed"))]


def run(*args: str, capture: bool = False) -> str:
    print(f"$ docembed {' '.join(args)}", file=sys.stderr, flush=True)
    result = subprocess.run(
        DOCEMBED + list(args), check=True, text=True, stdout=subprocess.PIPE if capture else None
    )
    return result.stdout if capture else ""


def build_corpus() -> tuple[Path, Path, Path]:
    from pydoc_data.topics import topics

    rng = random.Random(0)
    paragraphs, seen = [], set()
    for topic, text in sorted(topics.items()):
        for i, para in enumerate(p for p in text.split("\n\n") if len(p.split()) > 20):
            para = " ".join(para.split())
            if para not in seen:  # several topics repeat the same paragraph
                seen.add(para)
                paragraphs.append((f"{topic}/{i}", para))
    corpus = OUT / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as handle:
        for doc_id, text in paragraphs:
            handle.write(json.dumps({"id": doc_id, "text": text}) + "\n")
    # Reranking: does the first sentence of a paragraph find the rest of it among 10 candidates?
    task_docs, tasks = OUT / "rerank_docs.jsonl", OUT / "rerank_tasks.jsonl"
    splittable = [(i, t) for i, t in paragraphs if re.search(r"[.!?] [A-Z]", t)]
    chosen = rng.sample(splittable, 50)
    with open(task_docs, "w", encoding="utf-8") as docs, open(tasks, "w", encoding="utf-8") as rows:
        for doc_id, text in chosen:
            first, rest = re.split(r"(?<=[.!?]) (?=[A-Z])", text, maxsplit=1)
            docs.write(json.dumps({"id": f"q:{doc_id}", "text": first}) + "\n")
            docs.write(json.dumps({"id": f"d:{doc_id}", "text": rest}) + "\n")
        for doc_id, text in paragraphs:
            docs.write(json.dumps({"id": f"p:{doc_id}", "text": text}) + "\n")
        for doc_id, _ in chosen:
            others = rng.sample([i for i, _ in paragraphs if i != doc_id], 9)
            candidates = [f"d:{doc_id}"] + [f"p:{o}" for o in others]
            rng.shuffle(candidates)
            rows.write(
                json.dumps({"source": f"q:{doc_id}", "candidates": candidates, "gold": f"d:{doc_id}"}) + "\n"
            )
    print(
        f"corpus: {len(paragraphs)} paragraphs of the Python language reference -> {corpus}", file=sys.stderr
    )
    return corpus, task_docs, tasks


def mrr(ranked_path: Path, tasks: Path) -> float:
    gold = {json.loads(line)["source"]: json.loads(line)["gold"] for line in tasks.open()}
    reciprocal = []
    for line in ranked_path.open():
        row = json.loads(line)
        ids = [c["id"] for c in row["ranking"]]
        reciprocal.append(1.0 / (ids.index(gold[row["source"]]) + 1))
    return 100 * sum(reciprocal) / len(reciprocal)


def main() -> None:
    started = time.time()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    corpus, task_docs, tasks = build_corpus()

    pv_dir = OUT / "pv"
    run("train-pv", str(corpus), "-o", str(pv_dir), "--epochs", "20", "--dim", "100")
    for model, out in (("sbert", "corpus.sbert.npy"), (str(pv_dir), "corpus.pv.npz")):
        run("encode", str(corpus), "--model", model, "-o", str(OUT / out))

    a, b = "How do I handle an exception?", "Catching errors with try and except"
    sims = {m: float(run("similarity", a, b, "--model", m, capture=True)) for m in ("sbert", str(pv_dir))}

    scores = {}
    for name, model in (("sbert", "sbert"), ("sbert-tokens", "sbert-tokens"), ("pv", str(pv_dir))):
        ranked = OUT / f"reranked.{name}.jsonl"
        run("rerank", str(tasks), "--docs", str(task_docs), "--model", model, "-o", str(ranked))
        scores[name] = mrr(ranked, tasks)

    run("index", "build", str(OUT / "corpus.sbert.npy"), "-o", str(OUT / "index.sbert"))
    query = "how do I catch an exception"
    hits = json.loads(run("search", str(OUT / "index.sbert"), "--query", query, "-k", "5", capture=True))

    print("\n== docembed demo ==")
    print(
        f'similarity("{a}", "{b}"):  '
        + ",  ".join(f"{m if m == 'sbert' else 'pv'} {s:.3f}" for m, s in sims.items())
    )
    print("rerank (first sentence -> rest of its paragraph, 10 candidates, 50 queries), MRR x100:")
    for name, value in scores.items():
        print(f"  {name:<13} {value:6.1f}")
    print(f'search "{query}" (sbert, faiss flat):')
    for hit in hits["results"]:
        print(f"  {hit['score']:.3f}  {hit['id']}")
    print(f"outputs in {OUT.relative_to(ROOT)}/  ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
