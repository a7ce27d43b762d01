"""Find the document a query is about (issue 45): long-document retrieval on several kinds of text, every
lexical rule, whole-document and passage-scoring model, and their fusions, on val and test splits.

Tasks (every document of a split is a candidate; query i's one right answer is document i; MRR x100 with
ties counted against the gold; paired differences on the same queries). A *duplicate answer*, another
candidate that holds at least half of the query's word 8-grams (the query's text is in it: gcloud's alpha,
beta and GA pages share most of their text, a news post quotes another), or whose own query does (the two
documents share the text the query was drawn from: those gcloud pages have one first half, which asks for any
of their second halves), is left out of that query's ranking: its text is what the query asks for, so ranking
it first is no error (until 2026-11-27, 27 of man-part's 53 test queries and 29 of ng-thread's 150 counted
it as one; the documents whose own query holds the query's text joined the rule later that day: 19 more
of man-halves' 101 test queries):
- man-part / man-halves: bench_long's tasks on this machine's long man pages (2,000-10,000 words): the first
  30 words of a passage of 60-200 words taken out of the middle -> its page without the passage; first half
  -> second half (until late on 2026-11-27 the query was the whole passage: tf-idf found 96.9 of man-part's
  test answers, and a ranker that always puts the answer first was 2.0 paired SEs above it, so no model
  could show the goal's "more than two"; 30 words, as the joined posts' queries, leave it 4.4);
- man-summary: a page's one-line description from its NAME section (`lexgrog`, the command's name left
  out: "print lines that match patterns") -> the page (summary-like queries, built without labels);
- docs-part / docs-halves: the same on Debian documentation pages of 600-8,000 words (bench_student_kinds'
  pages and page-id splits; the student's training corpus takes only their `train` split);
- ng-thread: 20 Newsgroups test posts of one newsgroup joined twelve at a time into documents of a few
  thousand words; the query is the first 30 words of one of the later posts, taken out of its document
  (short queries among documents of the same topics: hard to saturate).
The man and docs tasks also hold pages no model trained on, so that the test splits can show a difference
of a few points (without them, at 53-72 test queries, a ranker that always puts the answer first is only
2.2-2.5 paired SEs above tf-idf on man-part and docs-halves): on the man tasks, 88 long man pages of 64
Debian packages this machine lacks (scripts/man_corpus.py --packages: mail, DNS, VPN, storage, containers,
typesetting, Debian packaging); on the docs tasks, 286 pages of nine documentation packages no corpus trains
on (scripts/debian_docs.py --evaluation: Debian policy and guides, exim4, postfix, BIND, libvirt, Node.js,
Sphinx), and, since 2026-11-28, 592 pages of nine application manuals no corpus trains on either
(`--evaluation manuals`: Apache httpd, Bacula, CMake, Octave, Varnish, gnuplot, the Debian FAQ and history,
Securing Debian; with 215 test queries a documentation half that a fusion ranked 1.3 points above tf-idf
was 1.6 SEs), half val and half test by a hash of the page. All are fetched from the Debian archive once,
into runs/. They join each split's candidates after its own pages, each set encoded as a block of its own,
so the cache serves the runs with and without them (`--standard-pages`: the tasks without the added pages,
nothing to download, the summary in runs/long_retrieval/long_retrieval_standard.json).
Configurations: tf-idf and BM25 (fitted on each split's candidates; BM25 with docembed's plain analyzer and
with the English one: stemming + stopwords), Paragraph Vectors (fitted on each split's candidates as a
fusion's `pv` part is), `static`, sbert's first window, sbert-chunks (the mean of its
windows, the `sbert` default), passage scoring over sbert's windows (the best window, MaxP, and a smooth
max at each temperature of TEMPERATURES: log-mean-exp of the windows' cosines), the student (2,048-token
windows averaged) and passage scoring over its late chunks, the retriever's passages and windows' mean,
NUGGET (a tenth of each window's token vectors, mean-MaxSim over all of a document's);
each passage scoring also with the aggregation following the query ("whole for long queries", the models'
`long_queries="whole"`: a query of many windows, a half, and each document read as wholes, the cosine of
their windows' means, and a shorter query scored by its passages); every lexical rule fused with the
whole-document readings, with each family's passage configurations best on val, one of each reading, and
with each built-in's shipped reading (`SHIPPED`): z-score convex and RRF, the weight chosen once on all val
tasks together (the mean of the tasks' MRRs, so one default holds across kinds of text) and applied
unchanged to test; a passage configuration also z-score "by query kind", with one weight for long queries
and one for the rest (the fusion's `long_query_weight`); each fusion of a built-in at the weights the
product ships (`docembed.models.fusion.VALIDATED_WEIGHTS`), where this run's val chose others.
Embeddings are cached under runs/long_retrieval/ by model and the texts of each side (a rerun scores new
configurations, or new queries, without encoding the documents again), and so are each encoding's score
matrices, by its vectors, texts and scoring code (a rerun that changes only fusions, weights or lexical rules
takes minutes: NUGGET's MaxSim over all the tasks takes most of an hour); the summary goes to
bench/results/long_retrieval.json.

    .venv/bin/python bench/bench_long_retrieval.py [--encoders sbert-windows,student] [--ng-docs 150]
    .venv/bin/python bench/bench_long_retrieval.py --encoders nugget --encode-only val &   # fill the cache,
    .venv/bin/python bench/bench_long_retrieval.py --encoders nugget --encode-only test    # a split each
    .venv/bin/python bench/bench_long_retrieval.py --encoders retriever --standard-pages
    .venv/bin/python bench/run.py --only long_retrieval
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pathlib
import re
import sys
import time
import warnings

import numpy as np

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
OUT = BENCH_DIR / "results" / "long_retrieval.json"
WORK = ROOT / "runs" / "long_retrieval"
OUT_STANDARD = WORK / "long_retrieval_standard.json"  # --standard-pages: a run without the added pages
sys.path[:0] = [str(BENCH_DIR), str(ROOT / "scripts")]

import debian_docs  # noqa: E402  (documentation no corpus trains on: the added pages)
import man_corpus  # noqa: E402  (a man page's NAME line: the summary task's queries)

import bench_long  # noqa: E402  (man pages and their part / halves tasks)
import bench_student_kinds  # noqa: E402  (the Debian documentation pages)

TEMPERATURES = (0.0, 0.01, 0.03, 0.1)
SPLITS = ("val", "test")
# encoding label -> (docembed.load name, options): each is encoded once per task text
# (the student's late chunks are kept unnormalised: their token-weighted mean is exactly its default vector,
# the mean of every token state of its 2,048-token passes, so one pass over the text gives both)
ENCODERS = {
    "static": ("static", {}),
    "sbert-windows": ("sbert-windows", {}),
    "student-late-chunks": ("student", {"long_documents": "late-chunks", "normalize": False}),
    "retriever": ("retriever", {}),  # MiniLM's windows, fine-tuned to find the part (train-retriever)
    "nugget": ("nugget", {}),  # a tenth of each window's token vectors, mean-MaxSim over all of them
}
# the family name of each multi-vector encoding's passage configurations
PASSAGE_FAMILY = {"sbert-windows": "sbert", "student-late-chunks": "student", "retriever": "retriever"}
LEXICAL = ("tfidf", "tfidf-bigrams", "bm25", "bm25-english")
# the rules each test cell's paired difference is taken against (the better of them on that task): the
# issue's goal is stated against tf-idf and BM25; tfidf-bigrams, a stronger rule on the val mean, is a row
# and a lexical side of its own, and docs/long-documents.md compares the fusions with it too
COMPARED_RULES = ("tfidf", "bm25", "bm25-english")
QUERY_WORDS = 30  # a part's and a joined post's query: the first words of the text taken out
NG_POSTS_PER_DOC = 12
DUPLICATE_NGRAM = 8  # words; a shorter query is one n-gram of all its words
DUPLICATE_SHARE = 0.5  # of the query's n-grams found in another candidate: a duplicate answer


# --- tasks --------------------------------------------------------------------------------------------------
def summary_task(pages: list[dict], man_roots: dict | None = None) -> tuple[list[str], list[str]]:
    """(each page's NAME description, the page without it); `man_roots`: package -> its man folder, for pages
    read from a package ("source") rather than this machine."""
    queries, documents = [], []
    for page in pages:
        root = (man_roots or {}).get(page.get("source"), man_corpus.MAN_ROOT)
        description = man_corpus.man_description(page["id"], root)
        if description is None:
            continue
        kept = [p for p in page["text"].split("\n") if description.lower() not in p.lower()]
        queries.append(description)
        documents.append("\n".join(kept))
    return queries, documents


def newsgroup_threads(split: str, limit: int) -> tuple[list[str], list[str]]:
    """Documents of twelve test posts of one newsgroup; the query: the first words of a later post."""
    import gzip

    path = pathlib.Path(os.environ.get("DOCEMBED_DATA", ROOT.parent / "shared" / "data"))
    with gzip.open(path / "20newsgroups" / "test.jsonl.gz", "rt", encoding="utf-8") as lines:
        posts = [json.loads(line) for line in lines]
    rng = np.random.default_rng(45)
    by_label: dict[str, list[str]] = {}
    for post in posts:
        text = " ".join(post["text"].split())
        if len(text.split()) >= 40:
            by_label.setdefault(str(post["label"]), []).append(text)
    queries, documents = [], []
    for label in sorted(by_label):
        texts = [by_label[label][i] for i in rng.permutation(len(by_label[label]))]
        for start in range(0, len(texts) - NG_POSTS_PER_DOC + 1, NG_POSTS_PER_DOC):
            group = texts[start : start + NG_POSTS_PER_DOC]
            key = hashlib.sha1(group[0].encode()).digest()[0]
            if ("val" if key % 2 == 0 else "test") != split:
                continue
            later = [i for i in range(1, len(group)) if len(group[i].split()) >= 2 * QUERY_WORDS]
            if not later:
                continue
            chosen = later[int(rng.integers(len(later)))]
            words = group[chosen].split()
            queries.append(" ".join(words[:QUERY_WORDS]))
            group[chosen] = " ".join(words[QUERY_WORDS:])
            documents.append("\n\n".join(group))
    order = np.random.default_rng(7).permutation(len(queries))[:limit]
    return [queries[i] for i in order], [documents[i] for i in order]


def page_tasks(man: list[dict], docs: list[dict], seed: int, man_roots: dict | None = None) -> dict:
    """{task: {split: (queries, candidates)}} of the man and documentation pages' tasks."""
    tasks: dict[str, dict] = {}
    for split in SPLITS:
        rng = np.random.default_rng(seed)
        man_split = [p for p in man if bench_long.split_of(p["id"]) == split]
        docs_split = [p for p in docs if p["split"] == split]
        for kind, pages in (("man", man_split), ("docs", docs_split)):
            parts = [bench_long.part_task(p, rng) for p in pages]
            parts = [(" ".join(passage.split()[:QUERY_WORDS]), page) for passage, page in parts]
            halves = [bench_long.halves_task(p) for p in pages]
            tasks.setdefault(f"{kind}-part", {})[split] = ([q for q, _ in parts], [d for _, d in parts])
            tasks.setdefault(f"{kind}-halves", {})[split] = ([q for q, _ in halves], [d for _, d in halves])
        tasks.setdefault("man-summary", {})[split] = summary_task(man_split, man_roots)
    return tasks


def build_tasks(ng_docs: int) -> dict[str, dict[str, tuple[list[str], list[str]]]]:
    tasks = page_tasks(bench_long.pages(10**6), bench_student_kinds.debian_docs(), seed=1111)
    for split in SPLITS:
        tasks.setdefault("ng-thread", {})[split] = newsgroup_threads(split, ng_docs)
    return tasks


def more_page_tasks() -> dict[str, dict[str, dict[str, tuple[list[str], list[str]]]]]:
    """{block: tasks}: the same page tasks on the added pages, none trained on (fetched from the Debian
    archive once, into runs/), each block its own queries and candidates with a seed of its own: `more`,
    the man pages and the first documentation set, and `manuals`, the second (added 2026-11-28, so that
    the documentation tasks' test splits can show a difference of one or two points)."""
    man_file = ROOT / "runs" / "man-packages" / "man-pages.jsonl"
    docs_file = ROOT / "runs" / "debian-docs-eval" / "docs.jsonl"
    manuals_file = ROOT / "runs" / "debian-manuals" / "docs.jsonl"
    if not man_file.exists():
        man_corpus.main([str(man_file), "--packages", str(man_file.parent), "--min-bytes", "12000"])
    for file, evaluation_set in ((docs_file, "guides"), (manuals_file, "manuals")):
        if not file.exists():
            debian_docs.main([str(file), "--cache", str(file.parent), "--evaluation", evaluation_set])

    def pages(path: pathlib.Path, low: int, high: int) -> list[dict]:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return [row for row in rows if low <= len(row["text"].split()) <= high]

    man = pages(man_file, 2000, 10000)  # as bench_long's pages
    docs = pages(docs_file, *bench_student_kinds.DOC_WORDS)
    roots = {p: man_file.parent / "unpacked" / p / "usr" / "share" / "man" for p in man_corpus.MAN_PACKAGES}
    manuals = page_tasks([], pages(manuals_file, *bench_student_kinds.DOC_WORDS), seed=1113)
    return {
        "more": page_tasks(sorted(man, key=lambda p: p["id"]), docs, seed=1112, man_roots=roots),
        "manuals": {task: by_split for task, by_split in manuals.items() if task.startswith("docs-")},
    }


def joined(tasks: dict, blocks: dict) -> dict:
    """Each task split's queries and candidates followed by those of each of `blocks` ({block: tasks}) of
    the same task split, if any."""
    out: dict[str, dict] = {}
    for task, by_split in tasks.items():
        for split, (queries, candidates) in by_split.items():
            queries, candidates = list(queries), list(candidates)
            for block in blocks.values():
                more_queries, more_candidates = block.get(task, {}).get(split, ([], []))
                queries, candidates = queries + more_queries, candidates + more_candidates
            out.setdefault(task, {})[split] = (queries, candidates)
    return out


def word_ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def duplicate_answers(queries: list[str], candidates: list[str]) -> np.ndarray:
    """[i, j]: candidate j (not i, the answer) is as good an answer to query i as i: it holds at least
    DUPLICATE_SHARE of query i's word n-grams, or query j does (the two documents share the text the query
    was drawn from: gcloud's alpha, beta and GA pages have one first half, so the first half of one asks for
    any of their second halves)."""
    tokens = [[re.findall(r"\w+", text.lower()) for text in side] for side in (queries, candidates)]
    ngrams_of: dict[int, list[list[set]]] = {}  # n -> [each query's n-grams, each candidate's]
    excluded = np.zeros((len(queries), len(candidates)), dtype=bool)
    for i, query_words in enumerate(tokens[0]):
        n = min(DUPLICATE_NGRAM, len(query_words))
        if n == 0:
            continue
        if n not in ngrams_of:
            ngrams_of[n] = [[word_ngrams(words, n) for words in side] for side in tokens]
        query_ngrams, candidate_ngrams = ngrams_of[n]
        ngrams = query_ngrams[i]
        needed = DUPLICATE_SHARE * len(ngrams)
        for j, held in enumerate(candidate_ngrams):
            in_query_j = j < len(query_ngrams) and len(ngrams & query_ngrams[j]) >= needed
            excluded[i, j] = j != i and (len(ngrams & held) >= needed or in_query_j)
    return excluded


# --- scores -------------------------------------------------------------------------------------------------
def reciprocal_ranks(scores: np.ndarray, excluded: np.ndarray | None = None) -> np.ndarray:
    """Query i's reciprocal rank of candidate i, its duplicate answers (`excluded`) left out of the rank."""
    scores = np.array(scores, dtype=np.float64)
    if excluded is not None:
        scores[excluded] = -np.inf
    return bench_long.reciprocal_ranks(scores)


def perfect_ranker_headroom(lexical: np.ndarray) -> dict:
    """How far above the better lexical rule's reciprocal ranks a ranker that always puts the answer first
    would be, paired: the most a task can show (a goal of two SEs above is out of reach when `ses` < 2)."""
    from docembed.evaluation.statistics import paired_difference

    versus = paired_difference(np.ones_like(lexical), lexical)
    if versus["se"] > 0:
        ses = round(versus["diff"] / versus["se"], 1)
    else:  # every query ranked alike (a quick run's few): nothing to show, or a gap no SE measures
        ses = 0.0 if versus["diff"] == 0 else None
    return {"diff": versus["diff"], "se": versus["se"], "ses": ses}


def lexical_scores(name: str, queries: list[str], candidates: list[str]) -> np.ndarray:
    import docembed

    model = docembed.load("bm25" if name == "bm25-english" else name, device="cpu")
    if name == "bm25-english":
        model.encoder.config.analyzer = "english"
    if name.startswith("tfidf"):  # the exact tf-idf rows: an LSA fitted on a few dozen pages is no rule
        model.encoder.config.svd_dim = 0
    model.fit(candidates)
    if name.startswith("bm25"):
        return np.asarray(model.similarity(queries, candidates), dtype=np.float64)
    return np.asarray(model.similarity(model.encode(queries), model.encode(candidates)), dtype=np.float64)


def fitted_pv_scores(task: str, split: str, queries: list[str], candidates: list[str]) -> np.ndarray:
    """Paragraph Vectors fitted on the split's candidates, as a fusion such as `retriever+pv` fits
    them (the fusion's own part, on one thread): the cosine of each query's vector with each candidate's,
    cached by the texts (the fit and the inference take a few minutes per task split)."""
    from docembed.models.fusion import UnfittedPart
    from docembed.scoring import cosine_matrix

    key = hashlib.sha1(json.dumps(["pv", queries, candidates]).encode()).hexdigest()[:16]
    cache = WORK / "pv" / f"{task}-{split}-scores-{key}.npy"
    if cache.exists():
        return np.load(cache)
    pv = UnfittedPart("pv").fit(candidates)
    scores = cosine_matrix(pv.encode(queries), pv.encode(candidates)).astype(np.float64)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f".{cache.stem}.{os.getpid()}.npy")
    np.save(partial, scores)
    os.replace(partial, cache)
    print(f"[long_retrieval] pv: {task}/{split} fitted and scored", file=sys.stderr, flush=True)
    return scores


def encoded(label: str, task: str, split: str, texts: dict[str, list[str]], timings: dict) -> dict:
    """{"queries": vectors, "candidates": vectors} of one encoder on one task split, each side cached on disk
    by its own texts (new queries of a task do not encode its documents again)."""
    out = {}
    for side, side_texts in texts.items():
        key = json.dumps([label, ENCODERS[label], side, side_texts])
        cache = WORK / label / f"{task}-{split}-{side}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"
        if not cache.exists():
            seconds = encode_to_cache(label, side_texts, cache)
            message = f"[long_retrieval] {label}: {task}/{split} {side} encoded in {seconds:.0f} s"
            print(message, file=sys.stderr, flush=True)
        out[side] = cached_vectors(cache, label, timings)
    return out


@functools.cache  # a model load: once per run, not once per task split and side
def bench_model(label: str):
    import docembed

    name, options = ENCODERS[label]
    options = dict(options)
    normalize = options.pop("normalize", True)
    model = docembed.load(name, device="cpu", **options)
    model.encoder.config.normalize = normalize
    return model


def encode_to_cache(label: str, texts: list[str], cache: pathlib.Path) -> float:
    from docembed.types import MultiVectors

    model = bench_model(label)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vectors = model.encode(texts)
    seconds = time.perf_counter() - started
    arrays = {"seconds": np.array(seconds)}
    if isinstance(vectors, MultiVectors):
        arrays |= {"vectors": vectors.vectors, "offsets": vectors.offsets, "positions": vectors.positions}
    else:
        arrays["vectors"] = vectors
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **arrays)
    return seconds


def cached_vectors(cache: pathlib.Path, label: str, timings: dict):
    from docembed.types import MultiVectors

    stored = np.load(cache)
    timings[label] = timings.get(label, 0.0) + float(stored["seconds"])
    if "offsets" in stored:
        return MultiVectors(stored["vectors"], stored["offsets"], stored.get("positions"))
    return stored["vectors"]


def encoded_task(label: str, task: str, split: str, tasks: dict, blocks: dict, timings: dict) -> dict:
    """`encoded` of a task split: its own block of texts, then each of `blocks`' ({block: tasks}) of the
    same task split (each cached apart, so that the tasks' cache serves runs with and without them)."""
    from docembed.types import concat_vectors

    texts = {task: tasks[task][split]}
    texts |= {f"{task}-{block}": more[task][split] for block, more in blocks.items() if task in more}
    parts = [
        encoded(label, name, split, {"queries": queries, "candidates": candidates}, timings)
        for name, (queries, candidates) in texts.items()
    ]
    return {side: concat_vectors([part[side] for part in parts]) for side in ("queries", "candidates")}


def student_default(chunks, texts: list[str], tokenizer, chunk_tokens: int = 256, max_length: int = 2048):
    """The student's default vectors from its unnormalised late chunks: each chunk's mean weighted by the
    tokens it pooled (a pass's [CLS] joins its first chunk and [SEP] its last), normalised."""
    from docembed.types import l2_normalize

    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]
    span = max_length - 2  # text tokens per pass
    out = np.zeros((len(texts), chunks.dim), dtype=np.float64)
    for i, total in enumerate(lengths):
        rows = range(chunks.offsets[i], chunks.offsets[i + 1])
        weights = []
        for position in chunks.positions[rows.start : rows.stop]:
            pass_start = position // span * span
            pass_end = min(pass_start + span, total)
            end = min(position + chunk_tokens, pass_end)
            weights.append(end - position + (position == pass_start) + (end == pass_end))
        weights = np.asarray(weights, dtype=np.float64)
        out[i] = weights @ chunks.vectors[rows.start : rows.stop] / weights.sum()
    return l2_normalize(out.astype(np.float32))


@functools.cache  # a model load: once per run, not once per task split
def nugget_window_tokens() -> int:
    """The text tokens of one of the shipped NUGGET's windows, by which its nuggets are grouped."""
    import docembed

    return docembed.load("nugget-passages", device="cpu").encoder.passage_group_tokens


def model_configurations(label: str, vectors: dict, texts: dict, tokenizer=None) -> dict[str, np.ndarray]:
    """The score matrices of every configuration one encoding gives."""
    from docembed.scoring import cosine_matrix, maxsim_one_to_many

    queries, candidates = vectors["queries"], vectors["candidates"]
    if not hasattr(candidates, "offsets"):
        return {label: cosine_matrix(queries, candidates)}
    if label not in PASSAGE_FAMILY:  # token vectors (nugget): mean-MaxSim over all of a document's
        out = {label: np.stack([maxsim_one_to_many(q, candidates, 0.0) for q in queries])}
        if label == "nugget":  # and by passages: its nuggets grouped by window (nugget-passages)
            window = nugget_window_tokens()
            for temperature in TEMPERATURES:
                name = "nugget passages max" if temperature == 0 else f"nugget passages t={temperature}"
                out[name] = np.stack(
                    [maxsim_one_to_many(q, candidates, temperature, "passages", window) for q in queries]
                )
        return out
    out = {}
    if label == "sbert-windows":  # the dense readings of the same windows
        first = {side: v.vectors[v.offsets[:-1]] for side, v in vectors.items()}  # each text's first window
        out["sbert --long truncate"] = cosine_matrix(first["queries"], first["candidates"])
        out["sbert-chunks"] = cosine_matrix(queries.mean(), candidates.mean())
    if label == "retriever":
        out["retriever-chunks"] = cosine_matrix(queries.mean(), candidates.mean())
    if label == "student-late-chunks":  # the student's default, from the same pass
        defaults = {side: student_default(v, texts[side], tokenizer) for side, v in vectors.items()}
        out["student"] = cosine_matrix(defaults["queries"], defaults["candidates"])
    base = PASSAGE_FAMILY[label]
    for temperature in TEMPERATURES:
        name = f"{base} passages max" if temperature == 0 else f"{base} passages t={temperature}"
        for long_queries, suffix in (("passages", ""), ("whole", ", whole for long queries")):
            out[name + suffix] = np.stack(
                [maxsim_one_to_many(q, candidates, temperature, long_queries) for q in queries]
            )
    return out


@functools.cache
def scoring_code() -> str:
    """A digest of the code that turns an encoding into score matrices: a change to it scores again."""
    import inspect

    import docembed.scoring
    import docembed.types

    sources = [inspect.getsource(f) for f in (model_configurations, student_default, nugget_window_tokens)]
    sources += [pathlib.Path(m.__file__).read_text() for m in (docembed.scoring, docembed.types)]
    return hashlib.sha1("".join(sources).encode()).hexdigest()


def configuration_scores(
    label: str, task: str, split: str, vectors: dict, texts: dict, tokenizer=None
) -> dict:
    """`model_configurations`, cached on disk beside the embeddings, keyed by the vectors themselves, the
    texts, the temperatures and the scoring code: a rerun that only changes fusions, weights or lexical
    rules scores nothing again (NUGGET's MaxSim over the documentation tasks alone takes minutes)."""
    key = hashlib.sha1(json.dumps([label, ENCODERS[label], TEMPERATURES, scoring_code(), texts]).encode())
    for side in ("queries", "candidates"):
        arrays = vectors[side]
        parts = (
            (arrays.vectors, arrays.offsets, arrays.positions) if hasattr(arrays, "offsets") else (arrays,)
        )
        for array in parts:
            key.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
    cache = WORK / label / f"{task}-{split}-scores-{key.hexdigest()[:16]}.npz"
    if cache.exists():
        with np.load(cache) as stored:
            return {str(name): stored[f"m{i}"] for i, name in enumerate(stored["names"])}
    scores = model_configurations(label, vectors, texts, tokenizer)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f".{cache.name}.{os.getpid()}")
    with open(partial, "wb") as out:  # a killed run leaves no half-written cache under the real name
        np.savez(out, names=np.array(list(scores)), **{f"m{i}": m for i, m in enumerate(scores.values())})
    os.replace(partial, cache)
    return scores


# the configuration each built-in reads as (its shipped passage temperature and long-query reading)
SHIPPED = {
    "sbert": "sbert-chunks",
    "sbert-chunks": "sbert-chunks",
    "sbert-windows": "sbert passages t=0.03, whole for long queries",
    "student": "student",
    "student-passages": "student passages t=0.01, whole for long queries",
    "retriever": "retriever passages t=0.03, whole for long queries",
    "nugget": "nugget",
    "nugget-passages": "nugget passages t=0.03",
    "pv": "pv",  # fitted on each split's candidates
}


def fused_models(rr: dict) -> list[str]:
    """The model configurations fused with the lexical rules: the whole-document defaults (sbert-chunks, the
    student), each family's passage scoring at the temperature best on val (mean over the val tasks), with
    every query scored by its passages and with long queries read whole, and each built-in's shipped one."""
    chosen = [m for m in ("sbert-chunks", "student", "retriever-chunks", "nugget") if m in rr]
    for family in ("sbert", "student", "retriever", "nugget"):
        for whole in (False, True):
            passages = [
                m
                for m in rr
                if m.startswith(f"{family} passages") and m.endswith(", whole for long queries") == whole
            ]
            if passages:
                chosen.append(max(passages, key=lambda m: np.mean([v.mean() for v in rr[m]["val"].values()])))
    return list(dict.fromkeys(chosen + [m for m in SHIPPED.values() if m in rr]))


def fused_ranks(
    results, lexical, model, split, excluded, weight, method="zscore", long_rows=None, long_weight=None
):
    """{task: reciprocal ranks} of `lexical` fused with `model` on one split; `long_rows` (task -> bool per
    query): the long queries, weighted by `long_weight` instead."""
    from docembed.models.fusion import fuse

    out = {}
    for task, lexical_part in results[lexical][split].items():
        weights = weight if long_rows is None else np.where(long_rows[task], long_weight, weight)[:, None]
        fused = fuse(lexical_part, results[model][split][task], weights, method)
        out[task] = reciprocal_ranks(fused, excluded[task][split])
    return out


# fusions of two models, no lexical part (built-ins by name): the second part's weight is chosen as a
# lexical fusion's is
MODEL_PAIRS = (
    ("student-passages", "nugget-passages"),
    ("retriever", "nugget-passages"),
    ("student-passages", "retriever"),
    ("student-passages", "pv"),
    ("retriever", "pv"),
    ("sbert-windows", "pv"),
)
SHIPPED_WEIGHTS = " (shipped weights)"  # the label of a fusion scored at the product's weights


def shipped_fusion_rows(results: dict, excluded: dict, long: dict, chosen: dict) -> dict:
    """Each fusion of a built-in's shipped reading at the weights the product ships (VALIDATED_WEIGHTS, and
    for long queries VALIDATED_LONG_QUERY_WEIGHTS): what a user gets, where this run's val chose other
    weights (`chosen`: fusion_rows; a pair whose val choice is the product's gets no second row)."""
    from docembed.models.fusion import VALIDATED_LONG_QUERY_WEIGHTS, VALIDATED_WEIGHTS

    rows = {}
    for (first, model), weight in VALIDATED_WEIGHTS.items():
        lexical, reading = SHIPPED.get(first, first), SHIPPED.get(model)  # a first model: its reading
        if reading not in results or lexical not in results:
            continue
        long_weight = VALIDATED_LONG_QUERY_WEIGHTS.get((first, model))
        by_kind = " (zscore, by query kind)" if long_weight is not None else " (zscore)"
        val_choice = chosen.get(f"{lexical}+{reading}{by_kind}", {})
        if (val_choice.get("weight"), val_choice.get("long_query_weight")) == (weight, long_weight):
            continue
        family = long_family(lexical, reading, long)
        rows[f"{lexical}+{reading}{SHIPPED_WEIGHTS}"] = {
            "weight": weight,
            **({"long_query_weight": long_weight} if long_weight is not None else {}),
            "rr": {
                split: fused_ranks(
                    results,
                    lexical,
                    reading,
                    split,
                    excluded,
                    weight,
                    "zscore",
                    long[family][split] if long_weight is not None else None,
                    long_weight,
                )
                for split in SPLITS
            },
        }
    return rows


def long_family(first: str, model: str, long: dict) -> str | None:
    """The passage family whose query vectors say which queries are long, for a fusion of `first` (a
    lexical rule or a configuration) and `model`: the model part's, else the first part's, else None."""
    families = [label.split(" passages")[0] for label in (model, first) if " passages" in label]
    return next((family for family in families if family in long), None)


def fusion_rows(results: dict, models: list[str], excluded: dict, long: dict) -> dict:
    """Each lexical rule fused with each of `models`, and the MODEL_PAIRS' two models fused: z-score convex
    and RRF, one weight chosen on all val tasks together (the mean of their MRRs) and applied to test; with
    a passage configuration also z-score with one weight for long queries (`long`: family -> split -> task
    -> bool per query, LONG_QUERY_PASSAGES passages or more) and one for the rest, each chosen the same way
    (the other held, twice round)."""
    from docembed.models.fusion import WEIGHT_GRID

    def val_best(mrr) -> float:
        val = {w: float(np.mean([rr.mean() for rr in mrr(w, "val").values()])) for w in WEIGHT_GRID}
        return max(val, key=lambda w: (val[w], -abs(w - 0.5)))

    pairs = [(lexical, model) for lexical in LEXICAL for model in models]
    pairs += [
        (SHIPPED[first], SHIPPED[second])
        for first, second in MODEL_PAIRS
        if SHIPPED[first] in results and SHIPPED[second] in results
    ]
    rows = {}
    for lexical, model in pairs:  # lexical: the first part, a lexical rule or a model
        for method in ("zscore", "rrf"):

            def mrr(weight, split, lexical=lexical, model=model, method=method):
                return fused_ranks(results, lexical, model, split, excluded, weight, method)

            weight = val_best(mrr)
            label = f"{lexical}+{model} ({method})"
            rows[label] = {"weight": weight, "rr": {s: mrr(weight, s) for s in SPLITS}}
        family = long_family(lexical, model, long)
        if family is None:
            continue

        def by_kind(short_weight, long_weight, split, lexical=lexical, model=model, family=family):
            long_rows = long[family][split]
            return fused_ranks(
                results, lexical, model, split, excluded, short_weight, "zscore", long_rows, long_weight
            )

        short_weight = long_weight = rows[f"{lexical}+{model} (zscore)"]["weight"]
        for _ in range(2):
            short_weight = val_best(lambda w, split, lw=long_weight: by_kind(w, lw, split))
            long_weight = val_best(lambda w, split, sw=short_weight: by_kind(sw, w, split))
        rows[f"{lexical}+{model} (zscore, by query kind)"] = {
            "weight": short_weight,
            "long_query_weight": long_weight,
            "rr": {s: by_kind(short_weight, long_weight, s) for s in SPLITS},
        }
    return rows


def summarise(rr: dict, tasks: dict, weights: dict, timings: dict) -> dict:
    """Per configuration: val MRR per task, test MRR per task with its paired difference from the task's
    better lexical rule on test, the mean over tasks per split, and a fusion's weight."""
    from docembed.evaluation.statistics import paired_difference

    table = {}
    for label, by_split in rr.items():
        row = {"val": {}, "test": {}, "mean": {}}
        for task in tasks:
            row["val"][task] = round(100 * float(by_split["val"][task].mean()), 2)
            values = by_split["test"][task]
            cell = {"mrr": round(100 * float(values.mean()), 2)}
            lexical = max(COMPARED_RULES, key=lambda name, t=task: rr[name]["test"][t].mean())
            if label != lexical:
                versus = paired_difference(values, rr[lexical]["test"][task])
                cell["vs_lexical"] = {"rule": lexical, **{k: versus[k] for k in ("diff", "se", "changed")}}
            row["test"][task] = cell
        row["mean"] = {
            "val": round(float(np.mean(list(row["val"].values()))), 2),
            "test": round(float(np.mean([c["mrr"] for c in row["test"].values()])), 2),
        }
        how = "shipped" if label.endswith(SHIPPED_WEIGHTS) else "chosen_on_val"  # the product's, this run's
        if label in weights:
            row[f"weight_{how}"] = weights[label]["weight"]
            if "long_query_weight" in weights[label]:
                row[f"long_query_weight_{how}"] = weights[label]["long_query_weight"]
        table[label] = row
    return {"models": table, "encode_seconds": {k: round(v, 1) for k, v in timings.items()}}


def kept_rows(summary: dict, earlier: dict) -> dict:
    """`--update`: this run's summary with the earlier file's rows of configurations it did not score (the
    encoders it did not run: their caches may be gone), each kept as it was and named under
    `kept_from_earlier_run`; their encoding seconds kept too."""
    kept = {label: row for label, row in earlier["models"].items() if label not in summary["models"]}
    summary["encode_seconds"] = earlier.get("encode_seconds", {}) | summary["encode_seconds"]
    summary["kept_from_earlier_run"] = sorted(kept)
    summary["models"] = summary["models"] | kept
    return summary


QUICK_DOCS = 8  # `run.py --quick`: a pipeline check on the first few documents of each split


def late_chunk_tokenizer(encoders: list[str] | None):
    """The student's tokenizer when its late chunks are scored (its default reading re-pools them by
    tokens), else None."""
    if "student-late-chunks" not in (encoders or ENCODERS):
        return None
    import docembed

    return docembed.load("student", device="cpu").encoder.tokenizer


def fill_cache(split: str, encoders: list[str] | None, ng_docs: int, more_pages: bool = True) -> None:
    """Encode one split's tasks and score every configuration of each encoding into the cache, as `main`
    does (the same keys): two processes, one per split, share the encoding and NUGGET's MaxSim scoring
    (most of an hour), which a plain run would do alone."""
    own_tasks = build_tasks(ng_docs)
    added = more_page_tasks() if more_pages else {}
    tasks = joined(own_tasks, added)
    tokenizer = late_chunk_tokenizer(encoders)
    if encoders is None or "pv" in encoders:
        for task, by_split in tasks.items():
            fitted_pv_scores(task, split, *by_split[split])
    for label in [e for e in encoders or list(ENCODERS) if e != "pv"]:
        for task, by_split in tasks.items():
            queries, candidates = by_split[split]
            vectors = encoded_task(label, task, split, own_tasks, added, {})
            texts = {"queries": queries, "candidates": candidates}
            configuration_scores(label, task, split, vectors, texts, tokenizer)
            print(f"[long_retrieval] {label}: {task}/{split} scored", file=sys.stderr, flush=True)


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    encoders: list[str] | None = None,
    ng_docs: int = 150,
    out: pathlib.Path | None = None,
    quick: bool = False,
    more_pages: bool = True,
    update: bool = False,
) -> dict:
    tasks = build_tasks(ng_docs)
    added = more_page_tasks() if more_pages and not quick else {}  # {block: tasks}; quick: no download
    out = out or (OUT if more_pages else OUT_STANDARD)
    if quick:  # checks the pipeline in minutes; its numbers mean nothing and stay beside the quick results
        tasks = {
            task: {split: (q[:QUICK_DOCS], c[:QUICK_DOCS]) for split, (q, c) in by_split.items()}
            for task, by_split in tasks.items()
        }
        encoders = encoders or ["static", "sbert-windows"]
        out = pathlib.Path(out_dir or WORK) / "long_retrieval.json"
    own_tasks, tasks = tasks, joined(tasks, added)
    with_added = [task for task in tasks if any(task in block for block in added.values())]
    excluded = {
        task: {split: duplicate_answers(q, c) for split, (q, c) in by_split.items()}
        for task, by_split in tasks.items()
    }
    scores: dict[str, dict] = {}  # configuration -> split -> task -> score matrix
    for lexical in LEXICAL:
        for task, by_split in tasks.items():
            for split, (queries, candidates) in by_split.items():
                matrix = lexical_scores(lexical, queries, candidates)
                scores.setdefault(lexical, {}).setdefault(split, {})[task] = matrix
    for task, by_split in tasks.items():  # Paragraph Vectors, fitted on the candidates as the rules are
        for split, (queries, candidates) in by_split.items():
            scores.setdefault("pv", {}).setdefault(split, {})[task] = fitted_pv_scores(
                task, split, queries, candidates
            )
    timings: dict[str, float] = {}
    tokenizer = late_chunk_tokenizer(encoders)
    from docembed.scoring import long_query_rows

    long: dict[str, dict] = {}  # passage family -> split -> task -> whether each query is a long one
    for label in encoders or list(ENCODERS):
        for task, by_split in tasks.items():
            for split, (queries, candidates) in by_split.items():
                texts = {"queries": queries, "candidates": candidates}
                vectors = encoded_task(label, task, split, own_tasks, added, timings)
                if label in PASSAGE_FAMILY:
                    rows = long_query_rows(vectors["queries"])
                    long.setdefault(PASSAGE_FAMILY[label], {}).setdefault(split, {})[task] = rows
                scores_of = configuration_scores(label, task, split, vectors, texts, tokenizer)
                for name, matrix in scores_of.items():
                    scores.setdefault(name, {}).setdefault(split, {})[task] = matrix
    rr = {
        name: {
            s: {t: reciprocal_ranks(m, excluded[t][s]) for t, m in by_task.items()}
            for s, by_task in by_split.items()
        }
        for name, by_split in scores.items()
    }
    weights = {}
    fusions = fusion_rows(scores, fused_models(rr), excluded, long)
    fusions |= shipped_fusion_rows(scores, excluded, long, fusions)  # where val chose other weights
    for label, row in fusions.items():
        rr[label] = row["rr"]
        weights[label] = {k: row[k] for k in ("weight", "long_query_weight") if k in row}

    def task_data(task: str, split: str, queries: list[str], candidates: list[str]) -> dict:
        entry = {
            "queries": len(queries),
            "candidates": len(candidates),
            "with_duplicate_answers": int(excluded[task][split].any(axis=1).sum()),
        }
        if split == "test":
            better = max(COMPARED_RULES, key=lambda name: rr[name]["test"][task].mean())
            entry["perfect_ranker_vs_lexical"] = perfect_ranker_headroom(rr[better]["test"][task])
        return entry

    summary = {
        "data": {
            task: {s: task_data(task, s, q, c) for s, (q, c) in by_split.items()}
            for task, by_split in tasks.items()
        },
        "threads": os.environ.get("OMP_NUM_THREADS"),
        **(
            {
                "more_pages": {
                    t: {s: len(tasks[t][s][0]) - len(own_tasks[t][s][0]) for s in SPLITS} for t in with_added
                }
            }
            if added
            else {}
        ),
        **summarise(rr, tasks, weights, timings),
    }
    if update and pathlib.Path(out).exists():
        summary = kept_rows(summary, json.loads(pathlib.Path(out).read_text()))
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in summary.pop("models").items())
    head = json.dumps(summary, indent=1)[:-2]  # one line per configuration keeps the file small and diffable
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(out).write_text(f'{head},\n "models": {{\n{rows}\n }}\n}}\n')
    summary["models"] = json.loads(pathlib.Path(out).read_text())["models"]
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--encoders",
        help=f"comma-separated, of {', '.join(ENCODERS)}, pv (default: all; PV with --encode-only)",
    )
    parser.add_argument("--ng-docs", type=int, default=150, help="joined 20 Newsgroups documents per split")
    standard = OUT_STANDARD.relative_to(ROOT)
    out_help = f"default: {OUT.relative_to(ROOT)} ({standard} with --standard-pages)"
    parser.add_argument("--out", type=pathlib.Path, help=out_help)
    parser.add_argument(
        "--standard-pages",
        action="store_true",
        help="leave out the pages no model trained on (see above; nothing to download)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the summary file's rows of the configurations this run does not score (run a few "
        "--encoders again without the others' caches); the file names the rows it kept",
    )
    parser.add_argument(
        "--encode-only",
        choices=SPLITS,
        help="only fill the cache of this split (embeddings and score matrices) and stop: run val and test "
        "in two processes, then a plain run fuses and summarises from the cache in minutes",
    )
    args = parser.parse_args()
    chosen = args.encoders.split(",") if args.encoders else None
    if args.encode_only:
        fill_cache(args.encode_only, chosen, args.ng_docs, more_pages=not args.standard_pages)
        sys.exit(0)
    result = main(
        encoders=chosen,
        ng_docs=args.ng_docs,
        out=args.out,
        more_pages=not args.standard_pages,
        update=args.update,
    )
    for label, row in result["models"].items():
        print(f"{label:50s} val {row['mean']['val']:6.2f}  test {row['mean']['test']:6.2f}")
