"""The committed results: small summaries (per-item values stay out of git), one rendering of them
(docs/results.md, regenerated and compared), one copy of each model card, and the table helpers both the
results page and the cards use."""

import ast
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from docembed.evaluation.report import format_cell, format_number, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ZOO = ROOT / "src" / "docembed" / "zoo"


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tracked_results() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    # a file deleted in the working tree but not yet staged is on its way out: count what is there
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _keys(value):
    if isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from _keys(child)
    elif isinstance(value, list):
        for child in value:
            yield from _keys(child)


def test_tracked_result_files_stay_under_one_megabyte():
    files = _tracked_results()
    total = sum(path.stat().st_size for path in files)
    largest = sorted(files, key=lambda p: -p.stat().st_size)[:3]
    assert files and total < 1_000_000, (
        f"{total} bytes; largest: {[str(p.relative_to(ROOT)) for p in largest]}"
    )


def test_no_tracked_result_keeps_per_item_values():
    holding = [
        str(path.relative_to(ROOT))
        for path in _tracked_results()
        if path.suffix == ".json" and "per_item" in set(_keys(json.loads(path.read_text())))
    ]
    assert not holding, f"per-item arrays belong in bench/results/items/ (git-ignored): {holding}"


def test_results_page_is_what_run_py_renders_from_the_committed_summary():
    run = _bench_module("run")
    latest = run.latest_results()
    assert "per_item" not in set(_keys(json.loads(latest.read_text())))  # the summary alone suffices
    page = (ROOT / "docs" / "results.md").read_text()
    assert page == run.render(latest), "docs/results.md is stale: run `python bench/run.py --report-only`"
    assert page.index("## Which model for what") < page.index("## Leaderboard") < page.index("## Changelog")


def test_results_page_shows_only_current_models():
    quality = json.loads(_bench_module("run").latest_results().read_text())["benchmarks"]["quality"]["result"]
    superseded = [m for m in quality["results"] if "shipped" in m or "thesis rule" in m]
    assert not superseded, f"earlier versions belong in bench/results/CHANGELOG.md: {superseded}"


def test_split_items_moves_per_item_values_out_of_the_summary():
    run = _bench_module("run")
    cell = {"score": 50.0, "metrics": {"mrr": 50.0, "per_item": {"mrr": [1.0, 0.0]}}}
    summary, items = run.split_items({"results": {"m": {"pi": cell}}, "seed": 1})
    assert summary == {"results": {"m": {"pi": {"score": 50.0, "metrics": {"mrr": 50.0}}}}, "seed": 1}
    assert items == {"results/m/pi/metrics": {"mrr": [1.0, 0.0]}}


def test_a_summary_a_module_keeps_in_its_own_file_is_named_not_copied(tmp_path):
    run = _bench_module("run")
    summary = {"models": {"tfidf": {"mean": {"val": 1.0}}}}
    (tmp_path / "mine.json").write_text(json.dumps(summary))
    target, merged = tmp_path / "2026-01-01.json", {"date": "2026-01-01", "benchmarks": {}}
    run._store(target, "mine", {"seconds": 1, "result": summary}, merged)
    run._store(target, "other", {"seconds": 2, "result": {"x": 1}}, merged)
    stored = json.loads(target.read_text())["benchmarks"]
    assert stored["mine"] == {"seconds": 1, "result_file": "mine.json"}
    assert stored["other"]["result"] == {"x": 1}
    (tmp_path / "mine.json").write_text(json.dumps({"models": {}}))  # the file moved on: the run's own copy
    run._store(target, "mine", {"seconds": 3, "result": summary}, merged)
    assert json.loads(target.read_text())["benchmarks"]["mine"]["result"] == summary


def test_paired_differences_compare_a_model_with_every_other_on_the_same_items():
    quality = _bench_module("bench_quality")

    def cell(values):
        return {"metrics": {"per_item": {"mrr": values}}}

    results = {
        "mine": {"pi": cell([1.0, 0.5, 1.0, 0.0])},
        "other": {"pi": cell([0.5, 0.5, 0.0, 0.0])},
        "shorter": {"pi": cell([1.0])},  # a different sample: not paired
    }
    found = quality.paired_differences(results, models=["mine"])
    assert list(found["mine"]["pi"]["mrr"]) == ["other"]
    paired = found["mine"]["pi"]["mrr"]["other"]
    # differences x100: 50, 0, 100, 0 -> mean 37.5, sample SD 47.87, SE 23.94
    assert paired == {"diff": 37.5, "se": 23.94, "n": 4, "changed": 2}


def test_each_card_is_stored_once():
    cards = {path.read_bytes(): path for path in ZOO.glob("*/card.md")}
    assert cards, "no shipped model cards found"
    copies = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md") if p.read_bytes() in cards]
    assert not copies, f"copies of src/docembed/zoo/<name>/card.md: {copies}"
    readme = (ROOT / "docs" / "zoo" / "README.md").read_text()
    for card in ZOO.glob("*/card.md"):
        assert f"../../src/docembed/zoo/{card.parent.name}/card.md" in readme


def test_report_helpers_format_a_small_table():
    assert markdown_table(["task", "a", "b"], [["PI", 97.981, None], ["docs/s", 16, "x"]]) == [
        "| task | a | b |",
        "|---|---|---|",
        "| PI | 97.98 | – |",
        "| docs/s | 16 | x |",
    ]
    assert format_number(8753.84, 1) == "8753.8"
    outcome = {"score": 83.667, "metrics": {"accuracy": 83.667, "accuracy_se": 1.51}}
    assert format_cell(outcome, "accuracy") == "83.67 ± 1.5"
    assert format_cell(outcome) == "83.67"
    assert format_cell({"error": "boom"}, "accuracy") == "error"
    assert format_cell({"missing": "not exported"}) == "missing"
    assert format_cell(None) == "–"


def test_card_score_tables_come_from_the_summary_without_bench_code():
    path = ROOT / "scripts" / "zoo.py"
    tree = ast.parse(path.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {"run", "bench", "bench.run"} & imported, "scripts/zoo.py must not import from bench/"
    spec = importlib.util.spec_from_file_location("zoo_script_under_test", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    latest = _bench_module("run").latest_results()
    quality = json.loads(latest.read_text())["benchmarks"]["quality"]["result"]
    table = script.score_table("student", latest)
    assert "| task | student |" in table[2]
    stsb = quality["results"]["student"]["stsb"]["metrics"]["spearman"]
    assert any(line.startswith(f"| STS-B Spearman | {stsb:.2f} |") for line in table)
