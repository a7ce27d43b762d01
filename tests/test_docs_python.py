"""The doctests of the documentation: every `>>>` example of docs/python.md (and of any other page that has
some) runs here with the output it shows. The pages' other blocks run in tests/test_docs_examples.py."""

import doctest

import pytest

from test_readme_commands import BLOCKS

PAGES = sorted({block.page for block in BLOCKS if block.lang == "python" and ">>>" in block.text})


def test_the_python_page_is_a_doctest():
    assert any(page.name == "python.md" for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_page_runs_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failures, attempted = doctest.testfile(str(page), module_relative=False, optionflags=flags)
    if page.name == "python.md":
        assert attempted >= 25, f"only {attempted} examples found in {page.name}"
    assert failures == 0, f"{failures} of {attempted} examples in {page.name} fail (see the output above)"
