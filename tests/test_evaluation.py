"""Evaluation metrics on hand-made cases, the PI constant-scorer trap, the SentEval CV protocol, the
embedding cache, and `docembed evaluate` end to end on a tiny data root built here."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence

import numpy as np
import pytest

from docembed.evaluation import TASKS, EvalOptions, get_evaluator, mean_pool, metrics, resolve_tasks
from docembed.evaluation.base import cached_encode
from docembed.evaluation.probes import senteval_cv_accuracy, stratified_folds
from docembed.models.base import Encoder, EncoderConfig
from docembed.types import MultiVectors


# --- metrics ----------------------------------------------------------------------------------------------
def test_pessimistic_rank_counts_ties_against_gold():
    assert metrics.pessimistic_rank(np.array([0.9, 0.1, 0.2]), 0) == 1
    assert metrics.pessimistic_rank(np.array([0.5, 0.5, 0.1]), 0) == 2  # one tie: gold goes below it
    assert metrics.pessimistic_rank(np.array([0.1, 0.5, 0.5]), 2) == 2
    assert metrics.pessimistic_rank(np.array([0.5, 0.5, 0.5]), 1) == 3
    assert metrics.pessimistic_rank(np.ones(20), 0) == 20


def test_mrr_with_ties_by_hand():
    # ranks 1, 2 (tie), 3 -> (1 + 1/2 + 1/3) / 3
    lists = [np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0]), np.array([0.0, 2.0, 1.0])]
    assert metrics.mean_reciprocal_rank(lists, [0, 0, 0]) == pytest.approx((1 + 0.5 + 1 / 3) / 3)


def test_average_precision_and_precision_by_hand():
    ranking = np.array([1, 0, 1, 0, 0, 1], dtype=bool)  # relevant at ranks 1, 3, 6
    assert metrics.average_precision_at_k(ranking, 100) == pytest.approx((1 + 2 / 3 + 3 / 6) / 3)
    # cut at k=3: hits at 1 and 3, divided by min(3 relevant, k=3)
    assert metrics.average_precision_at_k(ranking, 3) == pytest.approx((1 + 2 / 3) / 3)
    # relevant items the ranking never reaches still count in the denominator
    assert metrics.average_precision_at_k(ranking, 100, num_relevant=4) == pytest.approx(
        (1 + 2 / 3 + 0.5) / 4
    )
    assert metrics.precision_at_k(ranking, 2) == pytest.approx(0.5)
    assert metrics.precision_at_k(ranking, 6) == pytest.approx(0.5)
    assert metrics.average_precision_at_k(np.zeros(5, dtype=bool), 10) == 0.0


def test_spearman_sign_and_ties():
    gold = np.array([1.0, 2.0, 3.0, 4.0])
    assert metrics.spearman(np.array([10.0, 20.0, 25.0, 100.0]), gold) == pytest.approx(1.0)
    assert metrics.spearman(np.array([4.0, 3.0, 2.0, 1.0]), gold) == pytest.approx(-1.0)
    assert metrics.spearman(np.ones(4), gold) == 0.0  # constant prediction: undefined -> 0


def test_stratified_folds_keep_class_ratio_and_cover_everything():
    labels = np.array([0] * 30 + [1] * 10)
    folds = stratified_folds(labels, 10, seed=1111)
    assert len(folds) == 10
    seen = np.concatenate([test for _, test in folds])
    assert sorted(seen.tolist()) == list(range(40))
    for train, test in folds:
        assert np.bincount(labels[test]).tolist() == [3, 1]
        assert not set(train) & set(test)
    # seeded and shuffled: same folds twice, not the unshuffled contiguous blocks
    again = stratified_folds(labels, 10, seed=1111)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again, strict=True))
    assert not np.array_equal(folds[0][1], np.array([0, 1, 2, 30]))


def test_senteval_probe_separates_separable_data_and_not_noise():
    rng = np.random.default_rng(0)
    labels = np.array([0, 1] * 40)
    separable = rng.normal(size=(80, 4)) + labels[:, None] * 4.0
    noise = rng.normal(size=(80, 4))
    assert senteval_cv_accuracy(separable, labels, 3, 2)["accuracy"] > 0.95
    assert senteval_cv_accuracy(noise, labels, 3, 2)["accuracy"] < 0.8


def test_mean_pool_of_multi_vectors():
    mv = MultiVectors.from_list(
        [np.array([[1.0, 0.0], [3.0, 2.0]]), np.zeros((0, 2)), np.array([[0.0, 5.0]])]
    )
    assert mean_pool(mv).tolist() == [[2.0, 1.0], [0.0, 0.0], [0.0, 5.0]]


def test_task_names_groups_and_aliases():
    assert resolve_tasks(["pi", "senteval"]) == ["paraphrase-identification", "mr", "cr", "subj", "mpqa"]
    assert resolve_tasks(["stsb,sick", "sts"]) == ["stsb", "sick"]
    from docembed.errors import UsageError

    with pytest.raises(UsageError, match="unknown task"):
        resolve_tasks(["nope"])


# --- tiny synthetic data root -----------------------------------------------------------------------------
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def _write_jsonl_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def build_data_root(root, queries: int = 30, seed: int = 0):
    """A PI split whose gold is always first (the trap) and whose gold shares the source's words,
    plus tiny SentEval / STS / 20NG / IMDB sets with learnable labels."""
    rng = np.random.default_rng(seed)
    pi = root / "paraphrase_identification" / "dev"
    pi.mkdir(parents=True)
    docs, tasks = {}, []
    for q in range(queries):
        words = list(rng.choice(WORDS, size=4, replace=False))
        docs[f"L{q}"] = " ".join(words)
        docs[f"R{q}"] = " ".join(reversed(words))
        cands = [f"R{q}"]
        for n in range(19):
            key = f"N{q}_{n}"
            docs[key] = "" if n == 0 else " ".join(rng.choice(WORDS, size=4))
            cands.append(key)
        tasks.append({"source": f"L{q}", "candidates": cands, "answer": 0})
    (pi / "docs.txt").write_text("\n".join(f"{k}\t{v}" for k, v in docs.items()), encoding="utf-8")
    (pi / "task.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")

    def labelled(n, lengths=(4,)):
        rows = []
        for i in range(n):
            label = i % 2
            vocab = WORDS[:5] if label else WORDS[5:]
            text = " ".join(rng.choice(vocab, size=lengths[i % len(lengths)]))
            rows.append({"id": str(i), "text": text, "label": label})
        return rows

    _write_jsonl_gz(root / "senteval" / "mr.jsonl.gz", labelled(40))
    for split in ("train", "test"):
        pairs = []
        for i in range(20):
            a = list(rng.choice(WORDS, size=4))
            overlap = i % 5
            b = a[:overlap] + list(rng.choice(WORDS, size=4 - overlap))
            pairs.append({"id": str(i), "s1": " ".join(a), "s2": " ".join(b), "score": float(overlap)})
        _write_jsonl_gz(root / "senteval" / f"stsb-{split}.jsonl.gz", pairs)
        _write_jsonl_gz(root / "20newsgroups" / f"{split}.jsonl.gz", labelled(30, lengths=(600, 100, 100)))
    return root


class ConstantEncoder(Encoder):
    """Every text gets the same vector: every score ties."""

    family = "constant-test"

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return np.ones((len(texts), 3), dtype=np.float32)

    def save(self, directory):  # pragma: no cover - never saved
        raise NotImplementedError

    @classmethod
    def load(cls, directory, device="cpu"):  # pragma: no cover
        raise NotImplementedError


class BagOfWordsMultiVector(Encoder):
    """One one-hot vector per known word: a multi-vector model whose MaxSim finds word overlap."""

    family = "bow-multi-test"

    def encode(self, texts, batch_size=32):
        items = []
        for text in texts:
            ids = [WORDS.index(w) for w in text.split() if w in WORDS]
            items.append(np.eye(len(WORDS), dtype=np.float32)[ids].reshape(len(ids), len(WORDS)))
        return MultiVectors.from_list(items)

    def save(self, directory):  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def load(cls, directory, device="cpu"):  # pragma: no cover
        raise NotImplementedError


@pytest.fixture
def data_root(tmp_path):
    return build_data_root(tmp_path / "data")


def test_constant_scorer_gets_one_over_twenty_not_a_perfect_score(data_root):
    evaluator = get_evaluator("pi", EvalOptions(data_root=str(data_root)))
    result = evaluator.run(ConstantEncoder(EncoderConfig()))
    assert result.score == pytest.approx(5.0)  # gold first in every list, yet ranked last on every tie
    per_query = result.metrics["per_item"]["mrr"]  # each query's reciprocal rank, for paired errors
    assert len(per_query) == result.metrics["queries"] and set(per_query) == {0.05}


def test_word_overlap_models_find_the_paraphrase(data_root):
    from docembed.evaluation import load_evaluation_model

    options = EvalOptions(data_root=str(data_root))
    multi = get_evaluator("pi", options).run(BagOfWordsMultiVector(EncoderConfig()))
    assert multi.score > 90
    tfidf = get_evaluator("pi", options).run(load_evaluation_model("tfidf"))
    assert tfidf.score > 90
    bm25 = get_evaluator("pi", options).run(load_evaluation_model("bm25"))
    assert bm25.score > 90
    assert bm25.data.keys() == {"paraphrase_identification/dev/docs", "paraphrase_identification/dev/task"}


def test_pi_limit_is_seeded_subset(data_root):
    options = EvalOptions(data_root=str(data_root), limit=7)
    result = get_evaluator("pi", options).run(ConstantEncoder(EncoderConfig()))
    assert result.metrics["queries"] == 7


def test_sts_dev_tasks_read_the_dev_split(data_root):
    """stsb-dev scores the dev pairs (for choosing settings), stsb the test pairs: here the dev file holds
    the test pairs with their gold scores reversed, so the two scores have opposite signs."""
    with gzip.open(data_root / "senteval" / "stsb-test.jsonl.gz", "rt") as handle:
        rows = [json.loads(line) for line in handle]
    top = max(r["score"] for r in rows)
    _write_jsonl_gz(
        data_root / "senteval" / "stsb-dev.jsonl.gz", [{**r, "score": top - r["score"]} for r in rows]
    )
    options = EvalOptions(data_root=str(data_root), cache=False)
    model = BagOfWordsMultiVector(EncoderConfig())
    assert get_evaluator("stsb-dev", options).datasets == ("senteval/stsb-dev",)
    assert TASKS["sick-dev"]([], [], []).datasets == ("senteval/sick-dev",)
    test, dev = (get_evaluator(name, options).run(model).score for name in ("stsb", "stsb-dev"))
    assert test > 50 and dev == pytest.approx(-test)


def test_sts_and_retrieval_with_multi_vectors(data_root):
    options = EvalOptions(data_root=str(data_root))
    model = BagOfWordsMultiVector(EncoderConfig())
    sts = get_evaluator("stsb", options).run(model)
    assert sts.score > 50  # more shared words, higher score: positive rank correlation
    retrieval = get_evaluator("retrieval", options).run(model)
    assert retrieval.metrics["p@10"] > 90 and retrieval.metrics["knn_accuracy"] > 90
    constant = get_evaluator("retrieval", options).run(ConstantEncoder(EncoderConfig()))
    assert constant.metrics["map@100"] < retrieval.metrics["map@100"]


def test_probes_pool_multi_vectors_and_say_so(data_root):
    options = EvalOptions(data_root=str(data_root), fast=True)
    result = get_evaluator("mr", options).run(BagOfWordsMultiVector(EncoderConfig()))
    assert result.score > 90
    assert any("mean-pooled" in note for note in result.notes)
    news = get_evaluator("20ng", options).run(BagOfWordsMultiVector(EncoderConfig()))
    assert news.score > 90
    # every third document has 600 words (over 512 tokens), the others 100 (under 512)
    assert news.metrics["long_docs"] == 10 and news.metrics["accuracy_long"] is not None


def test_bm25_refuses_embedding_tasks(data_root):
    from docembed.errors import UsageError
    from docembed.evaluation import load_evaluation_model

    with pytest.raises(UsageError, match="scorer"):
        get_evaluator("stsb", EvalOptions(data_root=str(data_root))).run(load_evaluation_model("bm25"))


def test_embedding_cache_reuses_vectors(tmp_path):
    calls = []

    class Counting(ConstantEncoder):
        def encode(self, texts, batch_size=32):
            calls.append(len(texts))
            return np.arange(len(texts) * 2, dtype=np.float32).reshape(-1, 2)

    model = Counting(EncoderConfig())
    first = cached_encode(model, ["a", "b", ""])
    second = cached_encode(model, ["a", "b", ""])
    assert np.array_equal(first, second) and calls == [3]
    third = cached_encode(model, ["a", "c", ""])
    assert calls == [3, 1]  # only the text not seen before is encoded
    assert np.array_equal(third[[0, 2]], first[[0, 2]]) and len(third) == 3


def test_cli_evaluate_end_to_end(data_root, tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    out = tmp_path / "results"
    result = CliRunner().invoke(
        app,
        [
            "-q",
            "evaluate",
            "pi",
            "stsb",
            "--model",
            "tfidf",
            "--model",
            "glove-avg",
            "--fast",
            "--data-root",
            str(data_root),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {(r["task"], r["model"]) for r in lines} == {
        ("paraphrase-identification", "tfidf"),
        ("stsb", "tfidf"),
        ("paraphrase-identification", "glove-avg"),
        ("stsb", "glove-avg"),
    }
    saved = json.loads((out / "paraphrase-identification__tfidf.json").read_text())
    assert saved["metrics"]["mrr"] > 90 and len(saved["data"]["paraphrase_identification/dev/task"]) == 64
    assert {"task", "model", "config", "data", "metrics", "seconds", "date"} <= saved.keys()

    bad = CliRunner().invoke(app, ["evaluate", "stsb", "--model", "bm25", "--data-root", str(data_root)])
    assert bad.exit_code != 0


def _add_long_imdb(root, n=12):
    """IMDB-like splits whose long reviews carry a word of their own in both halves, so the first half points
    at its own second half; every third review is short (never selected)."""
    for split in ("train", "test"):
        rows = []
        for i in range(n):
            length = 300 if i % 3 else 20  # 600 words: over 512 tokens
            own = f"own{split}{i}x"
            text = " ".join([own, *([WORDS[i % 5], WORDS[5 + i % 3]] * length), own])
            rows.append({"id": str(i), "text": text, "label": i % 2})
        _write_jsonl_gz(root / "imdb" / f"{split}.jsonl.gz", rows)


def test_long_document_tasks_use_only_long_documents_and_report_errors(data_root):
    from docembed.models.baselines import TfidfConfig, TfidfEncoder

    _add_long_imdb(data_root)
    options = EvalOptions(data_root=str(data_root))
    tfidf = TfidfEncoder(TfidfConfig(), name="tfidf")
    result = get_evaluator("20newsgroups-long", options).run(tfidf)
    # the fake 20NG test split has 30 posts, every third of 600 words: 10 over 512 tokens
    assert result.metrics["documents"] == 10 and len(result.metrics["per_item"]["accuracy"]) == 10
    assert result.metrics["accuracy"] == 100.0 and result.metrics["accuracy_se"] == 0.0
    assert result.metrics["map@100"] > 90 and len(result.metrics["per_item"]["map@100"]) == 10

    halves = get_evaluator("halves", options)
    found = halves.run(TfidfEncoder(TfidfConfig(), name="tfidf")).metrics
    # 8 long IMDB reviews (each finds its own second half through its own word) + 10 long 20NG posts (whose
    # halves share nothing of their own: they tie with their label's other posts)
    assert found["documents"] == 8 + 10 and found["per_item"]["mrr"][:8] == [1.0] * 8
    assert found["mrr"] < 100.0 and found["mrr_se"] > 0
    tied = halves.run(ConstantEncoder(EncoderConfig(), name="constant")).metrics
    assert tied["mrr"] == pytest.approx(100.0 / found["documents"]) and tied["mrr_se"] == 0.0
    # --limit (--eval-limit) N: N documents in all, half from each data set
    limited = EvalOptions(data_root=str(data_root), limit=6)
    assert (
        get_evaluator("halves", limited).run(TfidfEncoder(TfidfConfig(), name="tfidf")).metrics["documents"]
        == 3 + 3
    )


def test_validation_long_tasks_read_train_documents_and_probe_on_the_others(data_root):
    from docembed.models.baselines import TfidfConfig, TfidfEncoder

    _add_long_imdb(data_root)
    options = EvalOptions(data_root=str(data_root))
    validation = get_evaluator("imdb-long-val", options)
    assert validation.datasets == ("imdb/train",)
    evaluated = {r["text"] for r in validation.rows}
    # the 8 long reviews of the *train* split (own word "owntrain...")
    assert len(evaluated) == 8 and all(t.startswith("owntrain") for t in evaluated)
    probe_texts = set(validation.fit_texts())
    assert probe_texts and not probe_texts & evaluated  # the probe never trains on what it is scored on
    assert set(get_evaluator("imdb-long", options).fit_texts()) & evaluated  # the test task's probe may
    result = validation.run(TfidfEncoder(TfidfConfig(), name="tfidf")).metrics
    assert result["documents"] == 8 and len(result["per_item"]["map@100"]) == 8

    halves = get_evaluator("halves-val", options).run(TfidfEncoder(TfidfConfig(), name="tfidf")).metrics
    assert halves["documents"] == 8 + 10 and halves["per_item"]["mrr"][:8] == [1.0] * 8


def test_evaluate_help_names_every_task_and_group():
    import re

    from docembed.cli.evaluate import TASK_HELP
    from docembed.evaluation import GROUPS, TASKS

    named = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", TASK_HELP))
    assert set(TASKS) <= named and set(GROUPS) <= named


def test_the_evaluate_table_lists_summary_metrics_not_per_query_values(capfd, data_root, tmp_path):
    from cli_helpers import invoke

    result = invoke(
        capfd, "evaluate", "pi", "-m", "tfidf", "--fast", "--data-root", data_root, "-o", tmp_path / "results"
    )
    assert result.code == 0, result.err
    assert "per_item" not in result.err and "other metrics" in result.err
    saved = json.loads((tmp_path / "results" / "paraphrase-identification__tfidf.json").read_text())
    assert len(saved["metrics"]["per_item"]["mrr"]) > 1  # the values are kept in the result file


def test_two_models_of_one_name_are_refused_before_either_runs(capfd, data_root, tmp_path):
    """Result files are named by the model's name: two folders named alike would write one file."""
    from cli_helpers import invoke

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "a cat"}\n{"id": "b", "text": "a dog"}\n')
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        assert invoke(capfd, "-q", "fit", "tfidf", corpus, "-o", tmp_path / folder / "tf").code == 0
    args = ["evaluate", "pi", "-m", tmp_path / "one" / "tf", "-m", tmp_path / "two" / "tf", "--fast"]
    result = invoke(capfd, *args, "--data-root", data_root, "-o", tmp_path / "results")
    assert result.code == 2 and "both named 'tf'" in result.err and not (tmp_path / "results").exists()
    qrels = invoke(capfd, "evaluate", "--qrels", corpus, "--run", corpus, "-o", tmp_path / "ir")
    assert qrels.code == 2 and "redirect it" in qrels.err  # -o held nothing there: it was ignored
