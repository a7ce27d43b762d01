"""Fault injection for outputs (issue #34): docembed deletes or replaces only what it wrote. A directory
output is replaced only if it is a docembed output of its kind, never the working directory, a folder above
it or a folder holding an input; every file of a set, sidecars included, obeys the output rule; directory
outputs (indexes, fitted and trained models, checkpoints) are written all or nothing; one writer per
output."""

import errno
import json
import os
import subprocess

import numpy as np
import pytest

from cli_helpers import invoke
from docembed.io.embeddings import load_embeddings, save_embeddings
from docembed.io.outputs import output_lock
from docembed.types import EmbeddingSet, MultiVectors
from test_faults import corpus, model, one_line_error, run_cli  # noqa: F401 (model: the tiny tf-idf fixture)


def dead_pid() -> int:
    """The pid of a process that has ended (what a SIGKILLed writer leaves in its file names)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def position(step: int) -> dict:
    return {"step": step, "epoch": 0, "batches_done_in_epoch": step}


def files_of(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def embedded(capfd, model, tmp_path):  # noqa: F811
    """A user's folder holding embeddings (e.npy + sidecars) and a notes file of their own."""
    folder = tmp_path / "embdir"
    folder.mkdir()
    assert (
        invoke(
            capfd, "-q", "encode", corpus(tmp_path / "docs.jsonl", 3), "-m", model, "-o", folder / "e.npy"
        ).code
        == 0
    )
    (folder / "notes.txt").write_text("mine\n")
    return folder


# --- directory outputs: only a docembed output of the same kind is replaced --------------------------------
@pytest.mark.parametrize(
    "where, target, message",
    [
        ("tmp", "embdir", "holds the input"),  # the output folder holds the input
        ("sub", "..", "working directory or a folder above it"),  # `-o ..` from a subfolder
        ("embdir", ".", "working directory or a folder above it"),  # `-o .`
        ("tmp", "other", "is not a docembed index"),  # a user's folder with files
    ],
)
def test_index_build_never_replaces_a_folder_it_did_not_write(
    capfd, tmp_path, embedded, monkeypatch, where, target, message
):
    (tmp_path / "sub").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("keep\n")
    before = {name: files_of(tmp_path / name) for name in ("embdir", "other")}
    monkeypatch.chdir(tmp_path if where == "tmp" else tmp_path / where)
    source = os.path.relpath(embedded / "e.npy")
    result = invoke(capfd, "-q", "index", "build", "--store", "faiss", source, "-o", target, "--overwrite")
    assert result.code == 1
    assert message in one_line_error(result.err)
    assert {name: files_of(tmp_path / name) for name in ("embdir", "other")} == before


def test_a_docembed_index_or_an_empty_folder_is_replaced(capfd, tmp_path, embedded):
    source = embedded / "e.npy"
    (tmp_path / "empty").mkdir()
    assert (
        invoke(capfd, "-q", "index", "build", "--store", "faiss", source, "-o", tmp_path / "empty").code == 0
    )
    refused = invoke(capfd, "-q", "index", "build", "--store", "faiss", source, "-o", tmp_path / "empty")
    assert "pass --overwrite" in one_line_error(refused.err)
    assert (
        invoke(
            capfd, "-q", "index", "build", "--store", "faiss", source, "-o", tmp_path / "empty", "--overwrite"
        ).code
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "docs.jsonl",
        "embdir",
        "empty",
    ]  # nothing left over


@pytest.mark.parametrize("command", ["fit", "train-pv", "encode-fit", "convert-long"])
def test_model_outputs_refuse_a_folder_of_user_files(capfd, tmp_path, command):
    docs = corpus(tmp_path / "docs.jsonl", 4)
    target = tmp_path / ("e.model" if command == "encode-fit" else "out")
    target.mkdir()
    (target / "keep.txt").write_text("keep\n")
    args = {
        "fit": ["fit", "tfidf", docs, "-o", target],
        "train-pv": ["train-pv", docs, "-o", target, "--min-count", "1", "--dim", "4", "--epochs", "1"],
        "encode-fit": ["encode", docs, "--fit", "-m", "tfidf", "-o", tmp_path / "e.npy"],
        "convert-long": ["convert-long", "sbert", "-o", target],
    }[command]
    result = invoke(capfd, "-q", *args, "--overwrite")
    assert result.code == 1
    assert "is not a docembed model" in one_line_error(result.err)
    assert files_of(target) == {"keep.txt": b"keep\n"}


@pytest.mark.parametrize("family", ["tfidf", "pv"])
def test_fitting_from_python_refuses_a_folder_of_user_files_and_replaces_a_model(tmp_path, family):
    from docembed.errors import DocembedError
    from docembed.models.baselines import fit_tfidf
    from docembed.models.paragraph_vector import PVConfig, fit_pv

    texts = ["cats sit on mats", "dogs run in parks", "birds fly over trees"]
    fit = {
        "tfidf": lambda output: fit_tfidf(texts, output=output),
        "pv": lambda output: fit_pv(texts, PVConfig(vector_size=4, min_count=1, epochs=1), output),
    }[family]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("keep\n")
    with pytest.raises(DocembedError, match="not a docembed model"):
        fit(tmp_path / "mine")
    assert files_of(tmp_path / "mine") == {"keep.txt": b"keep\n"}
    fit(tmp_path / "model")
    fit(tmp_path / "model")  # a docembed model is replaced whole
    assert json.loads((tmp_path / "model" / "config.json").read_text())["family"] == family
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "model"]


@pytest.mark.parametrize("command", ["train-setenc", "train-nugget", "train-quickthoughts", "train-distill"])
def test_train_commands_refuse_a_non_empty_folder_they_did_not_write(capfd, tmp_path, command):
    target = tmp_path / "run"
    target.mkdir()
    (target / "keep.txt").write_text("keep\n")
    docs = corpus(tmp_path / "docs.jsonl", 4)
    options = {"train-setenc": ["--dim", "8", "--word-dim", "8", "--hidden", "8", "--heads", "2"]}
    result = invoke(capfd, "-q", command, docs, "-o", target, "--epochs", "1", *options.get(command, []))
    assert result.code == 1
    assert "not a docembed model or training run" in one_line_error(result.err)
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


# --- every file of a set obeys the rule ---------------------------------------------------------------------
def test_a_sidecar_that_is_an_input_is_refused(capfd, model, tmp_path):  # noqa: F811
    source = tmp_path / "notes.ids.txt"
    source.write_text("cats sit\ndogs run\n")
    result = invoke(
        capfd, "-q", "encode", source, "--format", "txt", "-m", model, "-o", tmp_path / "notes.npy"
    )
    assert result.code == 1
    assert "is the input" in one_line_error(result.err)
    assert source.read_text() == "cats sit\ndogs run\n"
    assert not (tmp_path / "notes.npy").exists()


@pytest.mark.parametrize("sidecar", ["report.meta.json", "report.offsets.npy", "report.ids.txt"])
def test_a_sidecar_without_its_set_is_the_users_and_is_kept(capfd, model, tmp_path, sidecar):  # noqa: F811
    """A file at a sidecar name of report.npy, with no report.npy: not docembed's, so never replaced, not
    even with --overwrite (a stale report.offsets.npy beside a dense set would read it as multi-vector)."""
    docs = corpus(tmp_path / "docs.jsonl", 3)
    (tmp_path / sidecar).write_text("mine\n")
    for extra in ([], ["--overwrite"]):
        result = invoke(capfd, "-q", "encode", docs, "-m", model, "-o", tmp_path / "report.npy", *extra)
        assert result.code == 1 and "docembed did not write it" in one_line_error(result.err)
    assert (tmp_path / sidecar).read_text() == "mine\n" and not (tmp_path / "report.npy").exists()
    (tmp_path / sidecar).unlink()
    assert invoke(capfd, "-q", "encode", docs, "-m", model, "-o", tmp_path / "report.npy").code == 0
    assert not load_embeddings(str(tmp_path / "report.npy")).is_multi


@pytest.mark.parametrize("format", ["npy", "jsonl"])
def test_a_dense_set_over_a_multi_vector_one_reads_back_dense(tmp_path, format):
    path = str(tmp_path / f"x.{format}")
    vectors = np.arange(12, dtype=np.float32).reshape(6, 2)
    multi = MultiVectors(vectors, np.array([0, 2, 6]), np.arange(6))
    save_embeddings(EmbeddingSet(multi, ["a", "b"], {}), path)
    dense = EmbeddingSet(np.ones((2, 2), dtype=np.float32), ["a", "b"], {})
    save_embeddings(dense, path, overwrite=True)
    back = load_embeddings(path)
    assert not back.is_multi and np.array_equal(back.data, dense.data)
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["x.ids.txt", "x.meta.json", "x.npy"] if format == "npy" else ["x.jsonl", "x.jsonl.meta.json"]
    )


# --- all or nothing: kills, SIGTERM, full disks -------------------------------------------------------------
def test_a_killed_index_build_is_swept_by_the_next(capfd, tmp_path, embedded):
    pid = dead_pid()
    staging = tmp_path / f".idx.tmp{pid}"  # what a SIGKILL in the middle of a build leaves
    staging.mkdir()
    (staging / ".docembed-staging").write_text(str(pid))
    (staging / "index.faiss").write_bytes(b"half")
    (tmp_path / ".idx.lock").write_text(str(pid))
    assert (
        invoke(
            capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", tmp_path / "idx"
        ).code
        == 0
    )
    assert not staging.exists() and not (tmp_path / ".idx.lock").exists()
    assert (tmp_path / "idx" / "index.faiss").stat().st_size > 4


def test_an_index_a_killed_swap_took_away_is_put_back(capfd, tmp_path, embedded):
    target = tmp_path / "idx"
    assert (
        invoke(capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", target).code == 0
    )
    before = files_of(target)
    os.rename(target, tmp_path / f".idx.old{dead_pid()}")  # SIGKILL between the two renames of a rebuild
    result = invoke(capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", target)
    assert "pass --overwrite" in one_line_error(result.err)  # the previous index is back, and kept
    assert files_of(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl", "embdir", "idx"]


def test_a_folder_the_sweep_cannot_tell_is_ours_is_left_alone(capfd, tmp_path, embedded):
    foreign = tmp_path / f".idx.tmp{dead_pid()}"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("keep\n")
    assert (
        invoke(
            capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", tmp_path / "idx"
        ).code
        == 0
    )
    assert files_of(foreign) == {"keep.txt": b"keep\n"}


def test_a_failed_swap_puts_the_previous_index_back(capfd, tmp_path, embedded, monkeypatch):
    target = tmp_path / "idx"
    assert (
        invoke(capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", target).code == 0
    )
    before = files_of(target)
    rename = os.rename

    def failing_rename(source, destination):  # the disk fills (or a SIGTERM lands) as the new index moves in
        if str(destination) == str(target) and ".tmp" in str(source):
            raise OSError(errno.ENOSPC, "No space left on device")
        return rename(source, destination)

    monkeypatch.setattr(os, "rename", failing_rename)
    result = invoke(
        capfd, "-q", "index", "build", "--store", "faiss", embedded / "e.npy", "-o", target, "--overwrite"
    )
    assert "no space left" in one_line_error(result.err)
    assert files_of(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl", "embdir", "idx"]


@pytest.mark.parametrize("fault", [KeyboardInterrupt, OSError(errno.ENOSPC, "No space left on device")])
def test_fit_keeps_the_previous_model_on_sigterm_or_a_full_disk(capfd, tmp_path, monkeypatch, fault):
    from docembed.models import baselines

    target = tmp_path / "m"
    assert invoke(capfd, "-q", "fit", "tfidf", corpus(tmp_path / "a.jsonl", 4), "-o", target).code == 0
    before = files_of(target)

    def failing_weights(arrays, directory):  # config.json and vocab.json are written; the weights fail
        raise fault

    monkeypatch.setattr(baselines, "_save_arrays", failing_weights)
    other = corpus(tmp_path / "b.jsonl", 9, prefix="z")
    result = invoke(capfd, "-q", "fit", "tfidf", other, "-o", target, "--overwrite", "--svd-dim", "2")
    assert result.code == (130 if fault is KeyboardInterrupt else 1)
    assert files_of(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "m"]


def test_fit_on_a_full_disk_keeps_the_previous_model(capfd, tmp_path):
    target = tmp_path / "m"
    assert invoke(capfd, "-q", "fit", "tfidf", corpus(tmp_path / "a.jsonl", 4), "-o", target).code == 0
    before = files_of(target)
    big = tmp_path / "big.jsonl"  # 6,000 distinct words: vocab.json ~100 KB, over the file size limit
    big.write_text(
        "".join(json.dumps({"id": str(i), "text": f"word{i} term{i} tok{i}"}) + "\n" for i in range(2000))
    )
    proc = run_cli("fit", "tfidf", big, "-o", target, "--overwrite", limit_bytes=40_000)
    assert proc.returncode == 1 and "file too large" in one_line_error(proc.stderr)
    assert files_of(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "big.jsonl", "m"]


def test_train_pv_interrupted_keeps_the_previous_model(capfd, tmp_path, monkeypatch):
    from docembed.models.paragraph_vector import ParagraphVectorEncoder

    docs = corpus(tmp_path / "docs.jsonl", 4)
    options = ["--min-count", "1", "--dim", "4", "--epochs", "1"]
    assert invoke(capfd, "-q", "train-pv", docs, "-o", tmp_path / "pv", *options).code == 0
    before = files_of(tmp_path / "pv")

    def interrupted(self, directory):
        raise KeyboardInterrupt  # SIGTERM unwinds as Ctrl-C does

    monkeypatch.setattr(ParagraphVectorEncoder, "save", interrupted)
    assert invoke(capfd, "-q", "train-pv", docs, "-o", tmp_path / "pv", *options, "--overwrite").code == 130
    assert files_of(tmp_path / "pv") == before


def test_a_checkpoint_swap_cut_short_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    import torch

    from docembed.training.loop import Checkpoint

    module = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(module.parameters())
    checkpoint = Checkpoint(tmp_path)
    checkpoint.save(module, optimizer, position(1))
    rename, cuts = os.rename, []

    def cut(source, destination):  # the kill lands between taking the old one away and moving the new in
        if str(destination) == str(checkpoint.dir) and not cuts:
            cuts.append(source)
            raise KeyboardInterrupt
        return rename(source, destination)

    monkeypatch.setattr(os, "rename", cut)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(module, optimizer, position(2))
    monkeypatch.setattr(os, "rename", rename)
    assert checkpoint.exists() and checkpoint.load(module, optimizer, "cpu") == position(1)


def test_a_trained_model_saved_over_another_is_all_or_nothing(tmp_path):
    from docembed.training.loop import TrainConfig, train
    from toy_recipe import ToyRecipe

    class FullDiskRecipe(ToyRecipe):
        def save(self, directory):  # the config is written, then the disk fills
            (directory / "config.json").write_text('{"family": "setenc", "config": {"new": 1}}')
            raise OSError(errno.ENOSPC, "No space left on device")

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"family": "setenc", "config": {}}')  # the model of an earlier run
    (run / "model.safetensors").write_bytes(b"old weights")
    with pytest.raises(OSError):
        train(FullDiskRecipe(n_batches=2), TrainConfig(output_dir=str(run), epochs=1))
    assert (run / "config.json").read_text() == '{"family": "setenc", "config": {}}'
    assert (run / "model.safetensors").read_bytes() == b"old weights"
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]


def test_a_checkpoint_taken_away_by_a_killed_run_is_put_back(tmp_path):
    import torch

    from docembed.training.loop import Checkpoint

    module = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(module.parameters())
    Checkpoint(tmp_path).save(module, optimizer, position(3))
    os.rename(tmp_path / "checkpoint", tmp_path / f".checkpoint.old{dead_pid()}")  # SIGKILL between renames
    checkpoint = Checkpoint(tmp_path)
    assert checkpoint.exists() and checkpoint.load(module, optimizer, "cpu") == position(3)


# --- one writer per output ----------------------------------------------------------------------------------
def test_a_second_fit_to_the_same_output_fails_at_once(capfd, tmp_path):
    target = tmp_path / "m"
    with output_lock(target):  # another `fit` to the same output is running
        result = invoke(capfd, "-q", "fit", "tfidf", corpus(tmp_path / "docs.jsonl", 4), "-o", target)
    assert result.code == 1
    assert "another docembed is writing" in one_line_error(result.err)
    assert not target.exists()
    assert invoke(capfd, "-q", "fit", "tfidf", tmp_path / "docs.jsonl", "-o", target).code == 0
    assert json.loads((target / "config.json").read_text())["family"] == "tfidf"
