"""The long-document retrieval bench's scoring rules (bench/bench_long_retrieval.py): duplicate answers left
out of a query's ranking, the headroom a task leaves, how the results page shows both, and the fusion
weights the product ships being the ones that bench chose on val."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = (
    "gcloud compute instances create makes a virtual machine in a zone of your project. "
    "Use the boot disk flags to choose an image and the machine type flag to choose its size. "
    "Every instance gets an internal address; an external one is added unless you turn it off."
)


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench_module("bench_long_retrieval")


def test_a_candidate_holding_the_query_text_is_a_duplicate_answer_and_the_answer_never_is(bench):
    query = " ".join(PAGE.split()[10:40])
    sibling = "gcloud beta: " + PAGE  # another page holding the query's text
    other = "tar saves many files together into a single tape or disk archive, and can restore them."
    answer = PAGE.replace(query, "")  # the page the passage was taken out of
    excluded = bench.duplicate_answers([query, "tape archive"], [answer, sibling, other])
    assert excluded.tolist() == [[False, True, False], [False, False, False]]
    short = bench.duplicate_answers(["single tape or disk archive"], [answer, other])  # fewer words than n
    assert short.tolist() == [[False, True]]
    half = " ".join(query.split()[:15])  # held in part: under half of the query's n-grams
    assert not bench.duplicate_answers([query], [answer, half + " and then something else entirely"])[0, 1]


def test_a_sibling_whose_query_is_the_same_text_is_a_duplicate_answer(bench):
    # halves: gcloud's alpha and GA pages share their first half, so either first half asks for either
    # second half; the candidates (second halves) differ, so only the other query shows it
    first_half = PAGE
    queries = [first_half, "alpha: " + first_half, "tar saves many files together into one archive"]
    candidates = ["flags of the GA command", "flags of the alpha command, which may change", "tar's options"]
    excluded = bench.duplicate_answers(queries, candidates)
    assert excluded.tolist() == [[False, True, False], [True, False, False], [False, False, False]]


def test_a_duplicate_answer_leaves_the_ranking_instead_of_counting_against_the_answer(bench):
    scores = np.array([[0.5, 0.9, 0.1], [0.2, 0.8, 0.5], [0.3, 0.3, 0.3]])
    excluded = np.array([[False, True, False], [False, False, False], [True, False, False]])
    assert bench.reciprocal_ranks(scores).tolist() == pytest.approx([0.5, 1.0, 1 / 3])
    assert bench.reciprocal_ranks(scores, excluded).tolist() == pytest.approx([1.0, 1.0, 0.5])


def test_the_headroom_is_a_perfect_rankers_paired_lead_over_the_lexical_rule(bench):
    lexical = np.array([1.0, 0.5, 1.0, 0.25])
    headroom = bench.perfect_ranker_headroom(lexical)
    gaps = 100 * (1 - lexical)
    assert headroom["diff"] == pytest.approx(gaps.mean(), abs=0.01)
    assert headroom["se"] == pytest.approx(gaps.std(ddof=1) / 2, abs=0.01)
    assert headroom["ses"] == round(headroom["diff"] / headroom["se"], 1)


def test_the_results_page_shows_duplicate_answers_and_each_tasks_headroom():
    run = _bench_module("run")
    cell = {"mrr": 80.0, "vs_lexical": {"rule": "tfidf", "diff": 2.0, "se": 1.0, "changed": 3}}
    result = {
        "data": {
            "man-part": {
                "val": {"queries": 66, "candidates": 66, "with_duplicate_answers": 25},
                "test": {
                    "queries": 53,
                    "candidates": 53,
                    "with_duplicate_answers": 27,
                    "perfect_ranker_vs_lexical": {"diff": 6.57, "se": 2.92, "ses": 2.2},
                },
            }
        },
        "models": {
            "tfidf": {"test": {"man-part": {"mrr": 78.0}}, "mean": {"val": 79.0, "test": 78.0}},
            "retriever": {"test": {"man-part": cell}, "mean": {"val": 81.0, "test": 80.0}},
        },
    }
    page = "\n".join(run.render_long_retrieval(result))
    assert "man-part 66 / 53 (25 / 27)" in page
    assert "| `retriever` | 80.00 (+2.0 ± 1.0) | 81.00 | 80.00 |" in page
    assert "man-part +6.6 ± 2.9 (2.2 SEs) above the better lexical rule" in page


def test_the_shipped_fusion_weights_are_the_ones_the_bench_chose_on_val(bench):
    """Each validated pair's weight (and a passage model's weight for long queries) is its shipped reading's
    row in the committed bench summary: a changed bench or default cannot leave them behind."""
    from docembed.models.fusion import VALIDATED_LONG_QUERY_WEIGHTS, VALIDATED_WEIGHTS

    models = json.loads((ROOT / "bench" / "results" / "long_retrieval.json").read_text())["models"]
    for (lexical, model), weight in VALIDATED_WEIGHTS.items():
        long_weight = VALIDATED_LONG_QUERY_WEIGHTS.get((lexical, model))
        kind = "zscore" if long_weight is None else "zscore, by query kind"
        row = models[f"{bench.SHIPPED.get(lexical, lexical)}+{bench.SHIPPED[model]} ({kind})"]
        assert row["weight_chosen_on_val"] == weight, (lexical, model)
        assert row.get("long_query_weight_chosen_on_val") == long_weight, (lexical, model)
    passage_models = {m for m in bench.SHIPPED if "whole for long queries" in bench.SHIPPED[m]}
    # a long-query weight needs a part whose vectors are passages (the model, or the first part: retriever+pv)
    parts = [set(pair) & passage_models for pair in VALIDATED_LONG_QUERY_WEIGHTS]
    assert all(len(p) == 1 for p in parts) and set().union(*parts) == passage_models


def test_added_pages_join_each_task_split_after_its_own_and_each_block_is_encoded_apart(bench, monkeypatch):
    from docembed.types import MultiVectors

    tasks = {"man-part": {"val": (["q0", "q1"], ["d0", "d1"])}, "ng-thread": {"val": (["n0"], ["m0"])}}
    blocks = {
        "more": {"man-part": {"val": (["q2"], ["d2"])}},
        "manuals": {"man-part": {"val": (["q3"], ["d3"])}},
    }
    assert bench.joined(tasks, blocks) == {
        "man-part": {"val": (["q0", "q1", "q2", "q3"], ["d0", "d1", "d2", "d3"])},
        "ng-thread": {"val": (["n0"], ["m0"])},
    }
    assert tasks["man-part"]["val"] == (["q0", "q1"], ["d0", "d1"])  # the tasks' own lists are not extended
    calls = []

    def fake_encoded(label, task, split, texts, timings):  # one vector per text, its number as the value
        calls.append((task, texts["queries"]))
        sets = {side: [np.full((2, 3), int(t[1:]), np.float32) for t in texts[side]] for side in texts}
        return {side: MultiVectors.from_list(vectors) for side, vectors in sets.items()}

    monkeypatch.setattr(bench, "encoded", fake_encoded)
    vectors = bench.encoded_task("retriever", "man-part", "val", tasks, blocks, {})
    # the tasks' own cache key first, then each block's under a key of its own
    assert calls == [("man-part", ["q0", "q1"]), ("man-part-more", ["q2"]), ("man-part-manuals", ["q3"])]
    assert [vectors["candidates"][i][0, 0] for i in range(4)] == [0, 1, 2, 3]
    bench.encoded_task("retriever", "ng-thread", "val", tasks, blocks, {})
    assert calls[-1] == ("ng-thread", ["n0"])  # a task without added pages: one block


def test_the_results_page_says_which_queries_come_from_pages_no_model_trained_on():
    run = _bench_module("run")
    data = {"val": {"queries": 106, "candidates": 106}, "test": {"queries": 101, "candidates": 101}}
    row = {"test": {"man-part": {"mrr": 90.0}}, "mean": {"val": 91.0, "test": 90.0}}
    result = {
        "data": {"man-part": data},
        "more_pages": {"man-part": {"val": 40, "test": 48}},
        "models": {"tfidf": row, "tfidf+x (shipped weights)": {**row, "weight_shipped": 0.5}},
    }
    page = "\n".join(run.render_long_retrieval(result))
    assert page.startswith("## Long-document retrieval")
    assert "no model trained on" in page and "val / test: man-part 40 / 48." in page
    assert "`tfidf+x (shipped weights)` w=0.5" in page and "Rows `(shipped weights)`" in page
    del result["more_pages"], result["models"]["tfidf+x (shipped weights)"]
    page = "\n".join(run.render_long_retrieval(result))
    assert "no model trained on" not in page and "shipped weights" not in page


def test_the_shipped_weights_row_weights_long_queries_by_their_own_weight(bench, monkeypatch):
    """Where its val chose other weights, a run also scores each fusion as shipped: `tfidf+retriever` at
    0.55, say, and at 0.9 for a long query, where the model part then outweighs the lexical one."""
    from docembed.models import fusion

    monkeypatch.setitem(fusion.VALIDATED_WEIGHTS, ("tfidf", "retriever"), 0.55)
    monkeypatch.setitem(fusion.VALIDATED_LONG_QUERY_WEIGHTS, ("tfidf", "retriever"), 0.9)
    reading = bench.SHIPPED["retriever"]
    lexical = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # the answer (column i for query i) first ...
    model = np.array([[0.5, 1.0, 0.0], [0.5, 1.0, 0.0]])  # ... and second in the model part
    lexical[1], model[1] = lexical[1, [1, 0, 2]], model[1, [1, 0, 2]]  # query 1's answer is candidate 1
    results = {"tfidf": {}, reading: {}}
    for split in bench.SPLITS:
        results["tfidf"][split], results[reading][split] = {"t": lexical}, {"t": model}
    excluded = {"t": {split: np.zeros((2, 3), dtype=bool) for split in bench.SPLITS}}
    long = {"retriever": {split: {"t": np.array([False, True])} for split in bench.SPLITS}}
    rows = bench.shipped_fusion_rows(results, excluded, long, chosen={})
    row = rows[f"tfidf+{reading} (shipped weights)"]
    assert (row["weight"], row["long_query_weight"]) == (0.55, 0.9)
    short_query, long_query = row["rr"]["test"]["t"]
    assert short_query == 1.0 and long_query < 1.0  # the same scores, ranked apart by the query's kind
    assert set(rows) == {f"tfidf+{reading} (shipped weights)"}  # only the pairs both of whose parts ran
    shipped = {"weight": row["weight"], "long_query_weight": row["long_query_weight"]}
    same = {f"tfidf+{reading} (zscore, by query kind)": shipped}  # this run's val chose the product's
    assert bench.shipped_fusion_rows(results, excluded, long, chosen=same) == {}
    lexical_rr = {rule: {split: {"t": np.ones(2)} for split in bench.SPLITS} for rule in bench.LEXICAL}
    rr = {**lexical_rr, **{k: v["rr"] for k, v in rows.items()}}
    weights = {
        k: {"weight": v["weight"], "long_query_weight": v["long_query_weight"]} for k, v in rows.items()
    }
    summary = bench.summarise(rr, {"t": {}}, weights, {})["models"][f"tfidf+{reading} (shipped weights)"]
    assert (summary["weight_shipped"], summary["long_query_weight_shipped"]) == (0.55, 0.9)
    assert "weight_chosen_on_val" not in summary  # the product's weights, not this run's choice


def test_each_side_is_cached_by_its_own_texts_so_new_queries_keep_the_documents(bench, monkeypatch, tmp_path):
    encoded_texts = []

    def fake_encode(label, texts, cache):  # one vector per text: its length
        encoded_texts.append(texts)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, seconds=np.array(1.0), vectors=np.array([[len(t)] for t in texts], np.float32))
        return 1.0

    monkeypatch.setattr(bench, "WORK", tmp_path)
    monkeypatch.setattr(bench, "encode_to_cache", fake_encode)
    timings = {}
    first = bench.encoded("static", "man-part", "val", {"queries": ["a b"], "candidates": ["doc"]}, timings)
    again = bench.encoded("static", "man-part", "val", {"queries": ["a b c"], "candidates": ["doc"]}, timings)
    assert encoded_texts == [["a b"], ["doc"], ["a b c"]]  # the documents were encoded once
    assert first["queries"][0, 0] == 3 and again["queries"][0, 0] == 5 and again["candidates"][0, 0] == 3
    assert timings == {"static": 4.0}  # every side's seconds count, cached or not


def test_a_part_query_is_the_first_words_of_the_passage_its_page_lost(bench, monkeypatch):
    monkeypatch.setattr(bench, "summary_task", lambda pages, roots: ([], []))  # reads this machine's man
    paragraphs = [f"paragraph {i} " + " ".join(f"w{i}x{k}" for k in range(30)) for i in range(20)]
    pages = [{"id": f"page{i}", "text": "\n".join(paragraphs), "split": "val"} for i in range(6)]
    tasks = bench.page_tasks(pages, pages, seed=3)
    for kind in ("man", "docs"):
        for queries, candidates in tasks[f"{kind}-part"].values():
            for query, page in zip(queries, candidates, strict=True):
                words = query.split()
                assert len(words) == bench.QUERY_WORDS and words[0] == "paragraph"
                assert query not in " ".join(page.split())  # taken out of the page, not only shortened


def test_the_headroom_of_a_task_every_query_of_which_ranks_alike_has_no_division_by_zero(bench):
    """A quick run's few queries may all be answered first by the lexical rule: nothing to show, no crash."""
    assert bench.perfect_ranker_headroom(np.ones(8))["ses"] == 0.0
    assert bench.perfect_ranker_headroom(np.full(8, 0.5))["ses"] is None  # a gap with no spread to measure it
    assert bench.perfect_ranker_headroom(np.array([1.0, 0.5, 1.0, 0.25]))["ses"] > 0


def test_configuration_scores_are_cached_by_the_vectors_and_scored_again_when_they_change(
    bench, monkeypatch, tmp_path
):
    monkeypatch.setattr(bench, "WORK", tmp_path)
    calls = []

    def scored(label, vectors, texts, tokenizer=None):
        calls.append(label)
        return {"static": vectors["queries"] @ vectors["candidates"].T, "static, twice": np.eye(2)}

    monkeypatch.setattr(bench, "model_configurations", scored)
    rng = np.random.default_rng(0)
    vectors = {"queries": rng.normal(size=(2, 4)), "candidates": rng.normal(size=(3, 4))}
    texts = {"queries": ["q0", "q1"], "candidates": ["d0", "d1", "d2"]}
    first = bench.configuration_scores("static", "man-part", "val", vectors, texts)
    again = bench.configuration_scores("static", "man-part", "val", vectors, texts)
    assert calls == ["static"] and list(again) == ["static", "static, twice"]
    assert all(np.array_equal(first[name], again[name]) for name in first)  # exact: ties decide ranks
    assert [p.name for p in tmp_path.rglob("*") if p.is_file() and p.name.startswith(".")] == []
    vectors["candidates"] = vectors["candidates"] + 1.0  # the model's weights changed, say
    bench.configuration_scores("static", "man-part", "val", vectors, texts)
    assert calls == ["static", "static"]


def test_two_models_are_fused_too_and_long_queries_follow_the_part_with_passages(bench):
    """MODEL_PAIRS: the student's passages fused with NUGGET's get rows like a lexical rule's, with a weight
    for long queries from the student (NUGGET's vectors say nothing of a query's kind)."""
    first, second = bench.SHIPPED["student-passages"], bench.SHIPPED["nugget-passages"]
    right_first = np.eye(3)  # query i's answer is candidate i: the first model ranks it first ...
    second_wrong = np.roll(np.eye(3), 1, axis=1)  # ... and the second puts another first
    results = {first: {}, second: {}}
    for split in bench.SPLITS:
        results[first][split], results[second][split] = {"t": right_first}, {"t": second_wrong}
    excluded = {"t": {split: np.zeros((3, 3), dtype=bool) for split in bench.SPLITS}}
    long = {"student": {split: {"t": np.array([False, False, True])} for split in bench.SPLITS}}
    rows = bench.fusion_rows(results, [], excluded, long)
    assert set(rows) == {f"{first}+{second} ({kind})" for kind in ("zscore", "rrf", "zscore, by query kind")}
    row = rows[f"{first}+{second} (zscore)"]
    assert row["weight"] < 0.5 and row["rr"]["test"]["t"].tolist() == [1.0, 1.0, 1.0]  # the first decides
    assert bench.long_family(first, second, long) == "student"
    assert bench.long_family("tfidf", second, long) is None  # no part with passages: one weight


def test_an_update_keeps_the_rows_it_did_not_score_and_names_them(bench):
    earlier = {
        "models": {"tfidf": {"mean": {"val": 1.0}}, "nugget": {"mean": {"val": 2.0}}, "tfidf+nugget": {}},
        "encode_seconds": {"nugget": 40.0, "retriever": 30.0},
    }
    now = {
        "models": {"tfidf": {"mean": {"val": 1.5}}, "retriever": {}},
        "encode_seconds": {"retriever": 31.0},
    }
    summary = bench.kept_rows(now, earlier)
    assert summary["models"]["tfidf"] == {"mean": {"val": 1.5}}  # this run's row replaces the earlier one
    assert summary["models"]["nugget"] == {"mean": {"val": 2.0}} and "retriever" in summary["models"]
    assert summary["kept_from_earlier_run"] == ["nugget", "tfidf+nugget"]
    assert summary["encode_seconds"] == {"nugget": 40.0, "retriever": 31.0}


def test_each_test_cell_is_compared_with_the_issues_rules_not_with_a_new_lexical_side(bench):
    ones, halves = np.ones(4), np.full(4, 0.5)
    rr = {rule: {s: {"t": halves} for s in bench.SPLITS} for rule in bench.LEXICAL}
    rr["tfidf-bigrams"] = {s: {"t": ones} for s in bench.SPLITS}  # the strongest rule here
    rr["m"] = {s: {"t": np.array([1.0, 1.0, 0.5, 0.5])} for s in bench.SPLITS}
    cell = bench.summarise(rr, {"t": {}}, {}, {})["models"]["m"]["test"]["t"]["vs_lexical"]
    assert "tfidf-bigrams" in bench.LEXICAL and "tfidf-bigrams" not in bench.COMPARED_RULES
    assert cell["rule"] in bench.COMPARED_RULES and cell["diff"] == pytest.approx(25.0)


def test_filling_one_splits_cache_encodes_and_scores_each_of_its_tasks_and_no_other_split(bench, monkeypatch):
    tasks = {
        "man-part": {"val": (["q1"], ["d1"]), "test": (["q2"], ["d2"])},
        "ng-thread": {"val": (["q3"], ["d3"]), "test": (["q4"], ["d4"])},
    }
    monkeypatch.setattr(bench, "build_tasks", lambda ng_docs: tasks)
    monkeypatch.setattr(bench, "more_page_tasks", lambda: {"more": {"man-part": {"val": (["q5"], ["d5"])}}})
    encoded, scored = [], []

    def fake_encoded_task(label, task, split, own, blocks, timings):
        encoded.append((label, task, split))
        return {"queries": np.zeros((1, 2)), "candidates": np.zeros((1, 2))}

    def fake_scores(label, task, split, vectors, texts, tokenizer=None):
        scored.append((label, task, split, texts["queries"], texts["candidates"]))
        return {}

    monkeypatch.setattr(bench, "encoded_task", fake_encoded_task)
    monkeypatch.setattr(bench, "configuration_scores", fake_scores)
    bench.fill_cache("val", ["static"], ng_docs=150)
    assert encoded == [("static", "man-part", "val"), ("static", "ng-thread", "val")]
    # each task is scored on its own texts followed by the added pages', as the plain run scores it
    assert scored == [
        ("static", "man-part", "val", ["q1", "q5"], ["d1", "d5"]),
        ("static", "ng-thread", "val", ["q3"], ["d3"]),
    ]
