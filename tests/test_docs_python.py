"""docs/python.md is a doctest: every `>>>` example on the page runs here, with the output it shows."""

import doctest
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def test_the_python_page_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failures, attempted = doctest.testfile(str(PAGE), module_relative=False, optionflags=flags)
    assert attempted >= 25, f"only {attempted} examples found in {PAGE.name}"
    assert failures == 0, f"{failures} of {attempted} examples in {PAGE.name} fail (see the output above)"


def test_the_readme_python_example_runs():
    import re

    readme = (PAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "the README shows Python"
    for block in blocks:
        names: dict = {}
        exec(compile(block, "README.md", "exec"), names)
        assert names["pooled"].shape == (names["model"].dim,)
        assert names["scores"].shape == (1, 2)
