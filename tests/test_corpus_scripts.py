"""The corpus scripts' text handling: Debian documentation pages to prose paragraphs, long documents cut into
training segments (scripts/debian_docs.py, scripts/student_corpus.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_html_pages_keep_prose_paragraphs_in_order_and_drop_code_and_navigation(tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        "<html><head><title>A title that is long enough to count</title></head><body>"
        "<div>Prev Home Next</div>"
        "<p>The first paragraph explains what the tool does in some words.</p>"
        "<pre>for x in range(10): print(x) and more code words here</pre>"
        "<ul><li>An item of a list that reads like a sentence &amp; more.</li></ul>"
        "<p>Tail text without a closing tag but with enough words"
    )
    paragraphs = _script("debian_docs").html_paragraphs(page)
    assert paragraphs == [
        "The first paragraph explains what the tool does in some words.",
        "An item of a list that reads like a sentence & more.",
        "Tail text without a closing tag but with enough words",
    ]


def test_split_of_is_stable_and_roughly_a_tenth_each():
    split_of = _script("debian_docs").split_of
    splits = [split_of(f"pkg/page{i}.html") for i in range(2000)]
    assert splits == [split_of(f"pkg/page{i}.html") for i in range(2000)]
    assert 120 < splits.count("val") < 280 and 120 < splits.count("test") < 280


def test_segments_cut_at_paragraphs_within_the_word_budget_and_spread_the_kept_ones():
    segments = _script("student_corpus").segments
    text = "\n".join(f"p{i} " + "word " * 9 for i in range(40))  # 40 paragraphs of 10 words
    pieces = segments(text, max_words=100, keep=10)
    assert len(pieces) == 4 and all(len(p.split()) == 100 for p in pieces)
    assert "\n".join(pieces) == text  # nothing lost, nothing reordered
    kept = segments(text, max_words=100, keep=2)
    assert kept == [pieces[0], pieces[2]]
    assert segments("one short paragraph", max_words=100, keep=3) == ["one short paragraph"]
