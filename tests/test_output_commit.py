"""A set's files are renamed into place sidecars first, main file last (io/outputs.py). A writer killed
between the two leaves sidecars without their main file, which the rule refuses as the user's: the commit's
journal says they are docembed's, so the next write sweeps them (CI once caught a SIGKILL landing there)."""

import json
import os
import subprocess
import sys

import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings
from docembed.io.outputs import OutputSet
from test_faults import corpus, leftovers, model, one_line_error  # noqa: F401 (model: the tiny tf-idf fixture)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def killed_commit(folder, journal: bool = True):
    """What a SIGKILL after the sidecars' renames and before the main file's leaves behind."""
    (folder / "x.ids.txt").write_text("d0\n")
    (folder / "x.meta.json").write_text("{}")
    if journal:
        names = ["x.ids.txt", "x.meta.json", "x.offsets.npy"]
        (folder / f".x.npy.commit{dead_pid()}").write_text(json.dumps(names))


def test_the_next_encode_sweeps_what_a_killed_commit_left(capfd, model, tmp_path):  # noqa: F811
    src = corpus(tmp_path / "d.jsonl", 3)
    killed_commit(tmp_path)
    result = invoke(capfd, "-q", "encode", src, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 0, result.err
    assert load_embeddings(str(tmp_path / "x.npy")).ids == ["d0", "d1", "d2"]
    assert leftovers(tmp_path) == []


def test_sidecars_without_a_journal_are_still_the_users(capfd, model, tmp_path):  # noqa: F811
    src = corpus(tmp_path / "d.jsonl", 3)
    killed_commit(tmp_path, journal=False)
    for extra in ([], ["--overwrite"]):
        result = invoke(capfd, "-q", "encode", src, "-m", model, "-o", tmp_path / "x.npy", *extra)
        assert result.code == 1 and "is there without x.npy" in one_line_error(result.err)
    assert (tmp_path / "x.ids.txt").read_text() == "d0\n"


def write_set(folder, text: str, fail_at_main: bool = False, monkeypatch=None) -> None:
    main = folder / "x.npy"
    with OutputSet(main, overwrite=True, companions=[folder / "x.ids.txt"]) as output:
        for target in (main, folder / "x.ids.txt"):
            output.temporary(target).write_text(text)
        if fail_at_main:
            replace = os.replace

            def full_disk(source, target):
                if os.fspath(target) == os.fspath(main):
                    raise OSError(28, "No space left on device")
                replace(source, target)

            monkeypatch.setattr(os, "replace", full_disk)
        output.commit()


def test_a_commit_that_fails_half_way_leaves_no_sidecar_behind(tmp_path, monkeypatch):
    with pytest.raises(OSError):
        write_set(tmp_path, "new", fail_at_main=True, monkeypatch=monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_set(tmp_path, "new")  # and the next write is not refused
    assert (tmp_path / "x.npy").read_text() == (tmp_path / "x.ids.txt").read_text() == "new"
    assert leftovers(tmp_path) == []


def test_a_dead_journal_beside_a_whole_set_only_goes_itself(tmp_path):
    write_set(tmp_path, "old")
    (tmp_path / f".x.npy.commit{dead_pid()}").write_text(json.dumps(["x.ids.txt"]))
    write_set(tmp_path, "new")
    assert (tmp_path / "x.ids.txt").read_text() == "new" and leftovers(tmp_path) == []
