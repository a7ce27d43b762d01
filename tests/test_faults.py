"""Fault injection through the CLI: full disks, read-only folders, kills, concurrent writers, pipes and bad
input. Each case checks the exit status, that stderr is ONE line `docembed: error: ...` without a
traceback, and that the previous output is intact or absent, never mixed. The model is a tiny tf-idf."""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cli_helpers import DOCEMBED, invoke
from docembed.io.embeddings import load_embeddings

WORDS = [f"w{i}" for i in range(64)]


@pytest.fixture(scope="module")
def model(tiny_tfidf_dir):
    return tiny_tfidf_dir


def corpus(path, n: int, prefix: str = "d", id_length: int = 0):
    pad = "x" * id_length
    rows = [
        {"id": f"{prefix}{i}{pad}", "text": " ".join(WORDS[(i * 7 + k) % 64] for k in range(6))}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("docembed: error: "), err
    assert "Traceback" not in err
    return lines[0]


def leftovers(folder) -> list[str]:
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name.startswith(".") and (".tmp" in p.name or ".commit" in p.name or p.name.endswith(".lock"))
    )


def same_set(a, b) -> bool:
    return a.ids == b.ids and np.array_equal(a.data, b.data)


def run_cli(*args, limit_bytes: int | None = None, **kwargs) -> subprocess.CompletedProcess:
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [DOCEMBED, "-q", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit if limit_bytes else None,
        timeout=120,
        **kwargs,
    )


# --- writes: all or nothing ---------------------------------------------------------------------------------
def test_full_disk_keeps_the_previous_output_and_leaves_no_orphans(capfd, model, tmp_path):
    out = tmp_path / "x.npy"
    assert invoke(capfd, "encode", corpus(tmp_path / "small.jsonl", 5), "-m", model, "-o", out).code == 0
    before = load_embeddings(str(out))
    big = corpus(tmp_path / "big.jsonl", 3000, id_length=40)  # ids.txt ~150 KB, vectors ~770 KB
    proc = run_cli("encode", big, "-m", model, "-o", out, "--overwrite", limit_bytes=64_000)
    assert proc.returncode == 1 and "file too large" in one_line_error(proc.stderr)
    assert same_set(load_embeddings(str(out)), before) and leftovers(tmp_path) == []
    fresh = tmp_path / "fresh.npy"
    proc = run_cli("encode", big, "-m", model, "-o", fresh, limit_bytes=64_000)
    assert proc.returncode == 1 and "file too large" in one_line_error(proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fresh")) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (a disk that fills up); skipped where this process may not mount one."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_no_space_left_keeps_the_previous_output(capfd, model, tmp_path, small_disk):
    out = small_disk / "x.npy"
    assert invoke(capfd, "encode", corpus(tmp_path / "small.jsonl", 5), "-m", model, "-o", out).code == 0
    before = load_embeddings(str(out))
    big = corpus(tmp_path / "big.jsonl", 3000, id_length=40)
    result = invoke(capfd, "encode", big, "-m", model, "-o", out, "--overwrite")
    assert result.code == 1 and "no space left" in one_line_error(result.err)
    assert same_set(load_embeddings(str(out)), before) and leftovers(small_disk) == []


def test_stdout_on_a_full_device(model, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    src = corpus(tmp_path / "d.jsonl", 2000)
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [DOCEMBED, "-q", "encode", str(src), "-m", model], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert proc.returncode == 1 and "no space left" in one_line_error(proc.stderr)


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder nobody may write: chmod for a normal user; for root (who ignores modes) a read-only tmpfs,
    else the immutable attribute; skipped where neither is possible."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    ):
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
        return
    if (
        shutil.which("chattr")
        and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    ):
        yield folder
        subprocess.run(["chattr", "-i", str(folder)], check=True)
        return
    pytest.skip("cannot make a read-only folder here")


def test_read_only_folder(capfd, model, tmp_path, readonly_dir):
    result = invoke(
        capfd, "encode", corpus(tmp_path / "d.jsonl", 3), "-m", model, "-o", readonly_dir / "x.npy"
    )
    line = one_line_error(result.err)
    assert result.code == 1 and any(w in line for w in ("read-only", "permission denied", "not permitted")), (
        line
    )
    assert list(readonly_dir.iterdir()) == []


def test_unreadable_input(capfd, model, tmp_path, monkeypatch):
    src = corpus(tmp_path / "d.jsonl", 3)
    if os.geteuid() != 0:
        src.chmod(0)
    else:  # root reads anything: make the reader's open fail the way it would for a user
        import docembed.io.readers as readers

        def denied(path, *args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

        monkeypatch.setattr(readers, "open", denied, raising=False)
    result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 1 and "Permission denied" in one_line_error(result.err)
    assert not (tmp_path / "x.npy").exists()


def test_output_targets_that_are_refused(capfd, model, tmp_path):
    src = corpus(tmp_path / "d.jsonl", 3)
    original = src.read_bytes()
    (tmp_path / "a_dir.npy").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    os.mkfifo(tmp_path / "pipe.npy")
    cases = [
        (["-o", tmp_path / "a_dir.npy"], "is a directory"),
        (["-o", blocker / "x.npy"], "not a directory"),
        (["-o", src, "--overwrite"], "is the input"),  # .jsonl out over the .jsonl in
        (["-o", tmp_path / "pipe.npy", "--overwrite"], "not a regular file"),
        (["-o", "/dev/null", "--output-format", "npy", "--overwrite"], "not a regular file"),
    ]
    for extra, message in cases:
        result = invoke(capfd, "encode", src, "-m", model, *extra)
        assert result.code == 1 and message in one_line_error(result.err), (extra, result.err)
    assert src.read_bytes() == original and os.path.exists("/dev/null")
    assert not os.path.isfile("/dev/null")


def test_jsonl_and_npy_outputs_keep_their_own_metadata(capfd, model, tmp_path):
    src = corpus(tmp_path / "d.jsonl", 3)
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy").code == 0
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.jsonl").code == 0
    assert (tmp_path / "x.meta.json").exists() and (tmp_path / "x.jsonl.meta.json").exists()
    assert (
        load_embeddings(str(tmp_path / "x.npy")).metadata["dim"]
        == load_embeddings(str(tmp_path / "x.jsonl")).dim
    )


def test_sigkill_mid_write_then_the_next_write_sweeps(model, tmp_path):
    src = corpus(tmp_path / "big.jsonl", 20000, id_length=20)
    out = tmp_path / "x.npy"
    # temporaries and a lock of a process that died (as a SIGKILL leaves them)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name in (f".x.npy.tmp{dead.pid}", f".x.ids.txt.tmp{dead.pid}", ".x.npy.lock"):
        (tmp_path / name).write_text(str(dead.pid))
    # and a real SIGKILL at some point of a run: whenever it lands, the output is whole or absent
    proc = subprocess.Popen([DOCEMBED, "-q", "encode", str(src), "-m", model, "-o", str(out)])
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not list(tmp_path.glob(f".*.tmp{proc.pid}")):
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if out.exists():
        assert len(load_embeddings(str(out))) == 20000
    result = run_cli("encode", src, "-m", model, "-o", out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert len(load_embeddings(str(out))) == 20000 and leftovers(tmp_path) == []


def test_two_concurrent_writers_cannot_both_succeed(model, tmp_path):
    a, b = corpus(tmp_path / "a.jsonl", 3000, "a"), corpus(tmp_path / "b.jsonl", 3000, "b")
    out = tmp_path / "x.npy"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [DOCEMBED, "-q", "encode", str(s), "-m", model, "-o", str(out)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for s in (a, b)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    assert any(m in one_line_error(loser) for m in ("output exists", "another docembed is writing"))
    winner = "a" if results[0][0] == 0 else "b"
    written = load_embeddings(str(out))
    assert len(written) == 3000 and all(i.startswith(winner) for i in written.ids)
    assert leftovers(tmp_path) == []


# --- pipelines and Makefiles --------------------------------------------------------------------------------
def test_head_closing_the_pipe_is_success(model, tmp_path):
    src = tmp_path / "many.txt"
    src.write_text("".join(f"{WORDS[i % 64]} {WORDS[(i * 3) % 64]}\n" for i in range(5000)))
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; '{DOCEMBED}' encode - --format txt -m '{model}' < '{src}' | head -2",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stdout.count("\n") == 2 and proc.stderr == ""


def test_makefile_rerun_replaces_an_output_older_than_its_input(capfd, model, tmp_path):
    src, out = corpus(tmp_path / "d.jsonl", 3), tmp_path / "x.npy"
    assert invoke(capfd, "encode", src, "-m", model, "-o", out).code == 0
    result = invoke(capfd, "encode", src, "-m", model, "-o", out)  # output newer than input: kept
    assert result.code == 1 and "output exists" in one_line_error(result.err)
    corpus(src, 4)
    later = out.stat().st_mtime + 5
    os.utime(src, (later, later))
    assert invoke(capfd, "encode", src, "-m", model, "-o", out).code == 0
    assert len(load_embeddings(str(out))) == 4


def test_merge_shards(capfd, model, tmp_path):
    src = corpus(tmp_path / "d.jsonl", 7)
    parts = [tmp_path / f"p{i}.npy" for i in range(3)]
    for i, part in enumerate(parts):
        assert invoke(capfd, "encode", src, "-m", model, "--shard", f"{i}/3", "-o", part).code == 0
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "whole.npy").code == 0
    assert invoke(capfd, "merge", *parts, "-o", tmp_path / "merged.npz").code == 0
    assert same_set(
        load_embeddings(str(tmp_path / "merged.npz")), load_embeddings(str(tmp_path / "whole.npy"))
    )
    other, copy = tmp_path / "other.npy", tmp_path / "copy-of-model"
    shutil.copytree(model, copy)  # another saved model: a different source
    assert invoke(capfd, "encode", src, "-m", copy, "-o", other).code == 0
    result = invoke(capfd, "merge", parts[0], other, "-o", tmp_path / "bad.npy")
    assert result.code == 1 and "different models" in one_line_error(result.err)
    assert not (tmp_path / "bad.npy").exists()


# --- inputs -------------------------------------------------------------------------------------------------
def test_byte_order_mark_is_ignored_in_every_format(capfd, model, tmp_path):
    bom = "\ufeff"
    files = {
        "d.jsonl": bom + '{"id": "first", "text": "w1 w2"}\n{"id": "second", "text": "w3"}\n',
        "d.tsv": bom + "first\tw1 w2\nsecond\tw3\n",
        "d.txt": bom + "w1 w2\nw3\n",
    }
    vectors = []
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        out = tmp_path / f"{name}.npy"
        result = invoke(capfd, "encode", tmp_path / name, "-m", model, "-o", out)
        assert result.code == 0, result.err
        emb = load_embeddings(str(out))
        assert emb.ids == (["0", "1"] if name.endswith("txt") else ["first", "second"])
        vectors.append(emb.data)
    assert all(np.array_equal(v, vectors[0]) for v in vectors)


def test_blank_lines_are_skipped_and_counted(capfd, model, tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text('{"id": "a", "text": "w1"}\n\n   \n{"id": "b", "text": "w2"}\n')
    result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 0 and "skipped 2 blank line(s)" in result.err
    assert load_embeddings(str(tmp_path / "x.npy")).ids == ["a", "b"]


def test_bad_ids(capfd, model, tmp_path):
    cases = [
        ('{"id": {"a": 1}, "text": "w1"}\n', "x.npy", "id must be a string or a number"),
        ('{"id": [1], "text": "w1"}\n', "x.npz", "id must be a string or a number"),
        ('{"id": "two\\nlines", "text": "w1"}\n', "x.npy", "line break"),
        ('{"id": "sep\\u2028arated", "text": "w1"}\n', "x.npy", "line break"),
        ('{"id": "nel\\u0085", "text": "w1"}\n', "x.npy", "line break"),
    ]
    for content, name, message in cases:
        src = tmp_path / "ids.jsonl"
        src.write_text(content)
        result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / name)
        assert result.code == 1 and message in one_line_error(result.err), (content, result.err)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("x.")] == []
    # a format that can store a line break in an id keeps it exactly
    src.write_text('{"id": "two\\nlines", "text": "w1"}\n')
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npz").code == 0
    assert load_embeddings(str(tmp_path / "x.npz")).ids == ["two\nlines"]


def test_duplicate_ids_are_warned_about_and_refused_by_index_build(capfd, model, tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text('{"id": "a", "text": "w1"}\n{"id": "a", "text": "w2"}\n{"id": "b", "text": "w3"}\n')
    result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 0 and "1 duplicate id(s)" in result.err
    result = invoke(capfd, "index", "build", tmp_path / "x.npy", "-o", tmp_path / "idx")
    assert result.code == 1 and "duplicate id" in one_line_error(result.err)
    assert not (tmp_path / "idx").exists()
    result = invoke(
        capfd, "index", "build", tmp_path / "x.npy", "-o", tmp_path / "idx", "--allow-duplicate-ids"
    )
    assert result.code == 0 and (tmp_path / "idx").is_dir()


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"docembed_version": "0"}, "no 'family'"),
        ({"family": "tfidf"}, "no 'config'"),
        ({"family": "tfidf", "config": None}, "'config' of None"),
        ({"family": ["tfidf"], "config": {}}, "not a name"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_config_json(capfd, model, tmp_path, payload, message):
    bad = tmp_path / "bad"
    shutil.copytree(model, bad)
    (bad / "config.json").write_text(json.dumps(payload))
    result = invoke(capfd, "encode", corpus(tmp_path / "d.jsonl", 2), "-m", bad, "-o", tmp_path / "x.npy")
    assert result.code == 1 and message in one_line_error(result.err)
    assert not (tmp_path / "x.npy").exists()


def test_option_the_model_lacks(capfd, model, tmp_path):
    result = invoke(
        capfd,
        "encode",
        corpus(tmp_path / "d.jsonl", 2),
        "-m",
        model,
        "--ratio",
        "0.5",
        "-o",
        tmp_path / "x.npy",
    )
    assert result.code == 1 and "does not support --ratio" in one_line_error(result.err)


# --- training -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lr", -1.0, "--lr"),
        ("lr", 0.0, "--lr"),
        ("lr", float("inf"), "--lr"),
        ("lr", float("nan"), "--lr"),
        ("time_budget_s", -5.0, "--time-budget"),
        ("time_budget_s", 0.0, "--time-budget"),
    ],
)
def test_training_settings_are_checked(field, value, message):
    from docembed.errors import UsageError
    from docembed.training.loop import TrainConfig

    with pytest.raises(UsageError, match=message):
        TrainConfig(output_dir="unused", **{field: value})


def test_interrupt_keeps_a_checkpoint_and_resume_truncates_the_log(capfd, tmp_path):
    import docembed.runtime as runtime
    from docembed.training.loop import TrainConfig, train
    from toy_recipe import ToyRecipe

    class InterruptedAfter7(ToyRecipe):
        def batches(self, epoch):
            for index, batch in enumerate(super().batches(epoch)):
                if index == 7:
                    runtime._interrupt_requested = True  # what Ctrl-C (SIGINT) sets
                yield batch

    out = tmp_path / "run"
    settings = {"output_dir": str(out), "epochs": 1, "lr": 0.05, "log_every": 1, "save_every": 100}
    try:
        with pytest.raises(KeyboardInterrupt):
            train(InterruptedAfter7(), TrainConfig(**settings))
    finally:
        runtime._interrupt_requested = False
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 7
    log = out / "train_log.jsonl"
    with open(log, "a") as handle:  # lines a killed run logged after its last checkpoint
        handle.write(
            json.dumps({"step": 8, "loss": 1.0}) + "\n" + json.dumps({"step": 9, "loss": 1.0}) + "\n"
        )
    train(ToyRecipe(), TrainConfig(**settings, resume=True))
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == list(range(1, 13))
    capfd.readouterr()
    train(ToyRecipe(), TrainConfig(**{**settings, "output_dir": str(tmp_path / "new")}, resume=True))
    assert "nothing to resume" in capfd.readouterr().err


@pytest.mark.parametrize("target", ["5", "null", '["a"]'])
def test_train_nugget_refuses_a_target_that_is_not_text(capfd, tmp_path, target):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"source": "one two three four", "target": ' + target + "}\n")
    out = tmp_path / "run"
    result = invoke(capfd, "train-nugget", pairs, "--objective", "mt", "-o", out)
    assert result.code != 0 and "must be strings" in one_line_error(result.err)
    assert not out.exists()


def test_the_lock_appears_with_its_owner_inside_and_stale_staged_locks_are_swept(tmp_path):
    from docembed.io.outputs import output_lock

    target = tmp_path / "x.npy"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staged_by_the_dead = tmp_path / f".x.npy.lock{dead.pid}"  # a kill between staging and linking
    staged_by_the_dead.write_text(str(dead.pid))
    with output_lock(target):
        lock = tmp_path / ".x.npy.lock"
        assert lock.read_text() == str(os.getpid())  # never empty: linked into place with the pid inside
        assert sorted(p.name for p in tmp_path.iterdir()) == [".x.npy.lock"]
    assert list(tmp_path.iterdir()) == []
