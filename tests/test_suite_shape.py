"""The test suite's own shape: every test file reads in one sitting (issue #28: under about 500 lines)."""

from pathlib import Path

LINE_LIMIT = 550  # a little slack over 500, so that one added test does not force a split


def test_every_test_file_is_under_the_line_limit():
    files = sorted(Path(__file__).parent.glob("test_*.py"))
    assert len(files) > 1, "found no test files: the glob is wrong"  # never pass by checking nothing
    too_long = {path.name: n for path in files if (n := len(path.read_text().splitlines())) >= LINE_LIMIT}
    assert not too_long, f"split these test files by topic (under {LINE_LIMIT} lines each): {too_long}"
