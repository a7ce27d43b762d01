"""Full-text search in the Lance table against docembed's BM25 on the long-document benches (issue 46's goal:
"full-text search with stemming is measured against today's BM25 on the long-document benches").

Tasks: bench_long_retrieval's six (man-part, man-halves, man-summary, docs-part, docs-halves, ng-thread), val
and test, built by its own code with the pages it adds: every document of a split is a candidate, query i's
one right answer is document i, MRR x100 with ties counted against the gold, a query's duplicate answers
left out of its ranking (bench_long_retrieval.duplicate_answers). Rows:
- bm25, bm25-english: docembed's BM25 (plain analyzer; English stems and stopwords), fitted on each split's
  candidates, exactly as bench_long_retrieval scores it (its MRRs are checked against long_retrieval.json);
- lance-fts: the candidates written as a Lance table by docembed's LanceIndex.build (texts=..., so with its
  full-text index: English stems and stop words; the vectors are random unit vectors, which full-text search
  never reads), each query's text sent as is to LanceDB's `table.search(text, query_type="fts")` with a
  limit of every candidate; a candidate the search does not return ranks last (tied with the others it
  leaves out, the gold counted behind them);
- lance-fts terms-once: the same index, the query cut to the first word of each English stem. LanceDB scores
  a query term once per occurrence, docembed's BM25 once per distinct term: this row asks how much of any
  difference that is (a halves query of 3,000 words repeats its terms many times).
Per row and split: MRR per task, the mean over tasks; on test, each FTS row's paired difference from
bm25-english (and from bm25) with its standard error over queries. Timings: LanceIndex.build seconds (table,
id B-tree, FTS index) and seconds per query (median, mean, max) per task and split, against BM25's fit and
scoring seconds per split; `long_queries`: whether LanceDB refused any query text (halves queries reach
5,000 words) and its seconds per query on the halves tasks. Lexical rules only: no model is loaded.

    .venv/bin/python bench/bench_fts.py [--ng-docs 150] [--out bench/results/fts.json]
    .venv/bin/python bench/run.py --only fts
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys
import tempfile
import time

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OUT = BENCH_DIR / "results" / "fts.json"
WORK = ROOT / "runs" / "fts"
sys.path.insert(0, str(BENCH_DIR))

import bench_long_retrieval  # noqa: E402  (the tasks, and BM25 as that bench scores it)

SPLITS = bench_long_retrieval.SPLITS
BM25_RULES = ("bm25", "bm25-english")
FTS_ROWS = ("lance-fts", "lance-fts terms-once")
REFERENCE = "bm25-english"  # the paired differences on test: each FTS row minus this rule (and bm25)
VECTOR_DIM = 8  # the table's vectors: random unit vectors; full-text search never reads them
WORD = re.compile(r"[^\W_]+")  # LanceDB's "simple" tokenizer: runs of letters and digits
QUICK_DOCS = 8  # `run.py --quick`: a pipeline check on the first few documents of each split


# --- scores -------------------------------------------------------------------------------------------------
def terms_once(text: str) -> str:
    """`text` cut to the first word of each English (Snowball) stem, lower-cased: each term the full-text
    index would look up, once."""
    import Stemmer  # PyStemmer: the Snowball stemmer docembed's English analyzer uses

    words = WORD.findall(text.lower())
    first: dict[str, str] = {}
    for word, stem in zip(words, Stemmer.Stemmer("english").stemWords(words), strict=True):
        first.setdefault(stem, word)
    return " ".join(first.values())


QUERY_TEXT = {"lance-fts": lambda text: text, "lance-fts terms-once": terms_once}


def build_table(directory: pathlib.Path, candidates: list[str]):
    """A LanceIndex of `candidates` (ids "0", "1", ...) with their text, as `index build --store-text`
    writes one: its full-text index is docembed's (English stems, stop words)."""
    from docembed.lance_index import LanceIndex
    from docembed.types import EmbeddingSet, l2_normalize

    ids = [str(i) for i in range(len(candidates))]
    vectors = np.random.default_rng(46).standard_normal((len(ids), VECTOR_DIM)).astype(np.float32)
    embeddings = EmbeddingSet(l2_normalize(vectors), ids, {"model": "random"})
    return LanceIndex.build(directory, embeddings, texts=dict(zip(ids, candidates, strict=True)))


def fts_row(table, queries: list[str], count: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(scores (queries, candidates): the FTS score, -inf where a candidate is not returned; seconds per
    query; the errors of queries the engine refused, which rank every candidate last)."""
    scores = np.full((len(queries), count), -np.inf)
    seconds, errors = np.zeros(len(queries)), []
    for row, query in enumerate(queries):
        started = time.perf_counter()
        try:
            found = table.search(query, query_type="fts", fts_columns="text").select(["id"]).limit(count)
            found = found.to_arrow()
        except (ValueError, RuntimeError, OSError) as error:
            errors.append(" ".join(str(error).split())[:200])
            continue
        finally:
            seconds[row] = time.perf_counter() - started
        columns = np.asarray(found["id"].to_pylist(), dtype=np.int64)
        scores[row, columns] = found["_score"].to_numpy()
    return scores, seconds, errors


def lance_rows(queries: list[str], candidates: list[str]) -> tuple[dict, dict]:
    """The FTS rows' score matrices on one task split, and their timings (build and per query)."""
    scores, timing = {}, {"candidates": len(candidates)}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        index = build_table(pathlib.Path(folder) / "index", candidates)
        timing["build_s"] = round(time.perf_counter() - started, 3)
        for row, transform in QUERY_TEXT.items():
            texts = [transform(query) for query in queries]
            scores[row], seconds, errors = fts_row(index.table, texts, len(candidates))
            timing[row] = {
                "query_words_median": int(np.median([len(t.split()) for t in texts])),
                "query_ms_median": round(1000 * float(np.median(seconds)), 2),
                "query_ms_mean": round(1000 * float(seconds.mean()), 2),
                "query_ms_max": round(1000 * float(seconds.max()), 2),
                "not_returned_gold": int(np.isneginf(np.diag(scores[row])).sum()),
            }
            if errors:
                timing[row]["refused"] = {"count": len(errors), "first": errors[0]}
    return scores, timing


def bm25_rows(queries: list[str], candidates: list[str]) -> tuple[dict, dict]:
    """docembed's BM25 rows on one task split (bench_long_retrieval.lexical_scores), with their seconds."""
    scores, seconds = {}, {}
    for rule in BM25_RULES:
        started = time.perf_counter()
        scores[rule] = bench_long_retrieval.lexical_scores(rule, queries, candidates)
        seconds[f"{rule}_s"] = round(time.perf_counter() - started, 3)  # fit + every query
    return scores, seconds


def warm_up() -> None:
    """One small build and search first: the engine's one-time start (seconds) is no task's build time."""
    with tempfile.TemporaryDirectory() as folder:
        index = build_table(pathlib.Path(folder) / "index", ["a warm up page", "another page"])
        fts_row(index.table, ["page"], 2)


# --- summary ------------------------------------------------------------------------------------------------
def summarise(rr: dict, tasks: dict) -> dict:
    """Per row: MRR per task on val and test, the mean over tasks per split; on test, each FTS row's paired
    difference from bm25-english and from bm25."""
    from docembed.evaluation.statistics import paired_difference

    table = {}
    for label, by_split in rr.items():
        row = {split: {} for split in SPLITS}
        for split in SPLITS:
            for task in tasks:
                cell = {"mrr": round(100 * float(by_split[split][task].mean()), 2)}
                if split == "test" and label in FTS_ROWS:
                    for rule in (REFERENCE, "bm25"):
                        versus = paired_difference(by_split[split][task], rr[rule][split][task])
                        cell[f"vs_{rule}"] = {k: versus[k] for k in ("diff", "se", "changed")}
                row[split][task] = cell if len(cell) > 1 else cell["mrr"]
        means = {split: np.mean([by_split[split][task].mean() for task in tasks]) for split in SPLITS}
        row["mean"] = {split: round(100 * float(value), 2) for split, value in means.items()}
        if label in FTS_ROWS:
            for rule in (REFERENCE, "bm25"):  # over every test query of every task
                every = [np.concatenate([rr[name]["test"][t] for t in tasks]) for name in (label, rule)]
                versus = paired_difference(*every)
                row["mean"][f"test_all_queries_vs_{rule}"] = {k: versus[k] for k in ("diff", "se", "n")}
        table[label] = row
    return table


def check_against_long_retrieval(table: dict, tasks: dict) -> dict:
    """The largest difference between this run's BM25 MRRs and those in bench/results/long_retrieval.json
    (the same tasks and rules: it should be rounding)."""
    reference = BENCH_DIR / "results" / "long_retrieval.json"
    if not reference.exists():
        return {"long_retrieval.json": "missing"}
    models = json.loads(reference.read_text())["models"]
    out = {}
    for rule in BM25_RULES:
        gaps = []
        for split in SPLITS:
            for task in tasks:
                theirs = models[rule][split][task]
                theirs = theirs["mrr"] if isinstance(theirs, dict) else theirs
                mine = table[rule][split][task]
                gaps.append(abs((mine["mrr"] if isinstance(mine, dict) else mine) - theirs))
        out[rule] = {"max_abs_diff": round(max(gaps), 2)}
    return out


def long_queries(tasks: dict, timings: dict) -> dict:
    """How LanceDB took the long query texts (a halves query is thousands of words): refusals, and the
    seconds per query of the longest queries' tasks, each FTS row."""
    longest = max(len(q.split()) for by_split in tasks.values() for qs, _ in by_split.values() for q in qs)
    out = {"longest_query_words": longest}
    for row in FTS_ROWS:
        cells = [timing[row] for by_split in timings.values() for timing in by_split.values()]
        halves = [t[row] for task, by_split in timings.items() if "halves" in task for t in by_split.values()]
        out[row] = {
            "refused": sum(cell.get("refused", {}).get("count", 0) for cell in cells),
            "halves_query_ms_median": [cell["query_ms_median"] for cell in halves],
            "query_ms_max": max(cell["query_ms_max"] for cell in cells),
        }
    return out


def setup(tasks: dict) -> dict:
    from importlib.metadata import version

    def words(texts):
        return int(np.median([len(t.split()) for t in texts]))

    return {
        "data": {
            task: {
                split: {"queries": len(q), "query_words": words(q), "candidate_words": words(c)}
                for split, (q, c) in by_split.items()
            }
            for task, by_split in tasks.items()
        },
        "splits": list(SPLITS),
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LANCE_CPU_THREADS")},
        "versions": {name: version(name) for name in ("lancedb", "pyarrow", "docembed", "PyStemmer")},
        "fts_index": "LanceIndex.build(texts=...): lancedb.index.FTS(stem=True, language='English'), its "
        "other settings LanceDB's defaults (simple tokenizer, lower case, English stop words, ascii folding)",
        "fts_query": "table.search(text, query_type='fts', fts_columns='text').limit(every candidate); a "
        "candidate not returned ranks last, ties counted against the gold",
        "vectors": f"random {VECTOR_DIM}-d unit vectors (full-text search does not read them)",
    }


def write(summary: dict, out: pathlib.Path) -> None:
    """Each block one line per entry (a task's data or timings, a row): small and diffable, as
    long_retrieval.json."""
    blocks = []
    for name, block in summary.items():
        lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in block.items())
        blocks.append(f" {json.dumps(name)}: {{\n{lines}\n }}")
    pathlib.Path(out).write_text("{\n" + ",\n".join(blocks) + "\n}\n")


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    ng_docs: int = 150,
    out: pathlib.Path = OUT,
    quick: bool = False,
) -> dict:
    more = {} if quick else bench_long_retrieval.more_page_tasks()  # the pages that bench adds by default
    tasks = bench_long_retrieval.joined(bench_long_retrieval.build_tasks(ng_docs), more)
    if quick:  # checks the pipeline in a minute; its numbers mean nothing and stay beside the quick results
        tasks = {
            task: {split: (q[:QUICK_DOCS], c[:QUICK_DOCS]) for split, (q, c) in by_split.items()}
            for task, by_split in tasks.items()
        }
        out = pathlib.Path(out_dir or WORK) / "fts.json"
        out.parent.mkdir(parents=True, exist_ok=True)
    warm_up()
    rr: dict[str, dict] = {}  # row -> split -> task -> reciprocal ranks
    timings: dict[str, dict] = {}
    for task, by_split in tasks.items():
        for split, (queries, candidates) in by_split.items():
            bm25, bm25_seconds = bm25_rows(queries, candidates)
            lance, timing = lance_rows(queries, candidates)
            excluded = bench_long_retrieval.duplicate_answers(queries, candidates)  # as that bench counts
            for label, scores in {**bm25, **lance}.items():
                ranks = bench_long_retrieval.reciprocal_ranks(scores, excluded)
                rr.setdefault(label, {}).setdefault(split, {})[task] = ranks
            timings.setdefault(task, {})[split] = {**timing, **bm25_seconds}
            print(f"[fts] {task}/{split} done", file=sys.stderr, flush=True)
    table = summarise(rr, tasks)
    summary = {
        "setup": setup(tasks),
        "bm25_check": {"skipped": "--quick"} if quick else check_against_long_retrieval(table, tasks),
        "long_queries": long_queries(tasks, timings),
        "timings": timings,
        "rows": table,
    }
    write(summary, out)
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ng-docs", type=int, default=150, help="joined 20 Newsgroups documents per split")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--quick", action="store_true", help="the first 8 documents per split (a check)")
    args = parser.parse_args()
    result = main(ng_docs=args.ng_docs, out=args.out, quick=args.quick)
    for label, row in result["rows"].items():
        print(f"{label:24s} val {row['mean']['val']:6.2f}  test {row['mean']['test']:6.2f}")
