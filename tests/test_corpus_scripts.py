"""The corpus scripts' text handling: Debian documentation pages to prose paragraphs, long documents cut into
training segments, Debian packages fetched and their man pages read (scripts/debian_docs.py,
scripts/student_corpus.py, scripts/debian_packages.py, scripts/man_corpus.py)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    # the scripts import each other, as `python scripts/NAME.py` lets them
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
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


@pytest.mark.parametrize("lang, kept", [("pt-br", False), ("en-US", True), ("", True)])
def test_a_page_in_another_language_than_english_gives_no_text(tmp_path, lang, kept):
    """apache2-doc's English folder holds a few Portuguese pages: their own <html lang> leaves them out."""
    page = tmp_path / "page.html"
    attribute = f' lang="{lang}"' if lang else ""
    page.write_text(f"<html{attribute}><body><p>A paragraph of enough words to be read as prose.</p></body>")
    paragraphs = _script("debian_docs").html_paragraphs(page)
    assert paragraphs == (["A paragraph of enough words to be read as prose."] if kept else [])


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


def test_evaluation_pages_are_val_or_test_half_and_half_and_reserved_packages_are_never_fetched(tmp_path):
    split_of = _script("debian_docs").split_of
    splits = [split_of(f"pkg/page{i}.html", evaluation=True) for i in range(2000)]
    assert set(splits) == {"val", "test"} and 900 < splits.count("val") < 1100
    # the same hash: a page val in the training packages' split stays val here
    assert all(split_of(f"p{i}", evaluation=True) == "val" for i in range(300) if split_of(f"p{i}") == "val")
    fetch = _script("debian_packages").fetch
    for reserved in ("linux-doc-6.1", "python3.11-doc", "python3-doc"):
        with pytest.raises(SystemExit, match="reserved for independent evaluation"):
            fetch(["debian-policy", reserved], tmp_path)
    assert not (tmp_path / "unpacked").exists()  # refused before anything was downloaded


def test_man_pages_of_packages_leave_out_the_pages_this_machine_has_and_name_their_package(
    tmp_path, monkeypatch
):
    man_corpus = _script("man_corpus")
    page = ".TH {name} 1\n.SH NAME\n{name} \\- a tool\n.SH DESCRIPTION\n{body}\n"
    body = "This paragraph has more than six words in it, so it is kept as prose."
    machine = tmp_path / "machine"
    (machine / "man1").mkdir(parents=True)
    (machine / "man1" / "shared.1.gz").write_bytes(
        gzip.compress(page.format(name="shared", body=body).encode())
    )
    unpacked = tmp_path / "cache" / "unpacked"
    for package, name in (("pkg-a", "shared"), ("pkg-a", "fresh"), ("pkg-b", "other")):
        folder = unpacked / package / "usr" / "share" / "man" / "man1"
        folder.mkdir(parents=True, exist_ok=True)
        source = page.format(name=name, body=f"{body} It is {name}'s page.")
        (folder / f"{name}.1.gz").write_bytes(gzip.compress(source.encode()))
    monkeypatch.setattr(man_corpus, "MAN_ROOT", machine)
    monkeypatch.setattr(man_corpus, "MAN_PACKAGES", ["pkg-a", "pkg-b"])
    monkeypatch.setattr(man_corpus, "fetch", lambda packages, cache: cache / "unpacked")
    out = tmp_path / "pages.jsonl"
    man_corpus.main([str(out), "--packages", str(tmp_path / "cache"), "--sections", "1"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["source"]) for r in rows] == [("man1/fresh.1", "pkg-a"), ("man1/other.1", "pkg-b")]
    assert "It is fresh's page." in rows[0]["text"]
    root = unpacked / "pkg-b" / "usr" / "share" / "man"
    assert man_corpus.man_description("man1/other.1", root) == "a tool"


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_man_page_keeps_its_characters_in_utf8_or_latin1(tmp_path, encoding):
    # groff alone reads Latin-1: a UTF-8 page's "it’s" came out as "itâs"
    man_corpus = _script("man_corpus")
    words = "caf\u00e9 it\u2019s" if encoding == "utf-8" else "caf\u00e9 na\u00efve"
    body = f"This paragraph of the {words} page has more than six words."
    page = tmp_path / "page.1.gz"
    page.write_bytes(gzip.compress(f".TH PAGE 1\n.SH DESCRIPTION\n{body}\n".encode(encoding)))
    assert man_corpus.page_paragraphs(page) == [body]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_documentation_pages_keep_their_characters_in_utf8_or_latin1(tmp_path, encoding):
    # a page that declares UTF-8 may hold Latin-1 bytes (bacula-doc's); pod2text writes a Latin-1 pod as
    # Latin-1 unless told: both came back with U+FFFD in place of the character
    debian_docs = _script("debian_docs")
    body = "A paragraph by \u00c6var Arnfj\u00f6r\u00f0 with more than six words."
    page = tmp_path / "page.html"
    page.write_bytes(f'<html><head><meta charset="utf-8"></head><body><p>{body}</p></body>'.encode(encoding))
    assert debian_docs.html_paragraphs(page) == [body]
    if shutil.which("pod2text") is None:
        pytest.skip("pod2text (perl) is not installed")
    pod = tmp_path / "page.pod"
    declared = "utf8" if encoding == "utf-8" else "latin1"
    pod.write_bytes(f"=encoding {declared}\n\n{body}\n".encode(encoding))
    assert debian_docs.pod_paragraphs(pod) == [body]


def test_an_evaluation_set_is_named_and_a_folder_named_like_a_page_is_not_read(tmp_path, monkeypatch):
    debian_docs = _script("debian_docs")
    fetched = []
    monkeypatch.setattr(debian_docs, "fetch", lambda packages, cache: fetched.append(packages) or cache)
    prose = "<p>" + "This sentence of the manual is prose with more than six words. " * 60 + "</p>"
    manual = tmp_path / "octave-doc" / "usr" / "share" / "doc" / "octave" / "octave.html"
    (manual / "liboctave.html").mkdir(parents=True)  # a folder the page pattern matches
    (manual / "Basics.html").write_text(f"<html><body>{prose}</body></html>")
    out = tmp_path / "manuals.jsonl"
    debian_docs.main([str(out), "--cache", str(tmp_path), "--evaluation", "manuals"])
    assert fetched == [list(debian_docs.MANUAL_PACKAGES)]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["source"]) for r in rows] == [("octave-doc/Basics.html", "octave-doc")]
    assert rows[0]["split"] in ("val", "test")
    debian_docs.main([str(out), "--cache", str(tmp_path), "--evaluation"])  # a bare flag: the first set
    assert fetched[-1] == list(debian_docs.EVALUATION_PACKAGES) and out.read_text() == ""
