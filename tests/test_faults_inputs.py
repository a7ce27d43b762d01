"""Fault injection on inputs and runs (issue #34): hostile JSON rows, closed standard streams, inputs and
addresses that would hang, pathological sizes, damaged --resume state, third-party output on stdout and
outputs of an unknown kind. Each failure is ONE line `docembed: error: ...`, never a traceback or a hang."""

import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest

from cli_helpers import DOCEMBED, free_port, invoke
from docembed.errors import CorruptModelError, DocembedError, InputFormatError
from docembed.io.embeddings import load_embeddings
from test_faults import corpus, one_line_error


@pytest.fixture(scope="module")
def model(tiny_tfidf_dir):
    return tiny_tfidf_dir


def shell(command: str, cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    """`docembed` run by a shell (to close its standard streams), with a time limit: a hang fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        ["bash", "-c", command.replace("docembed", DOCEMBED, 1)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


# --- hostile JSON rows (class: JSON rows) -------------------------------------------------------------------
HOSTILE_ROWS = {
    "a 5,000-digit number": '{"id": ' + "9" * 5000 + ', "text": "w1"}',
    "a 5,000-digit text field": '{"id": "x", "text": ' + "1" * 5000 + "}",
    "deep nesting": '{"id": "x", "text": "w1", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "a lone surrogate in an id": '{"id": "a\\ud800", "text": "w1"}',
    "a lone surrogate in a text": '{"id": "x", "text": "w1 \\udfff w2"}',
    "NaN as id": '{"id": NaN, "text": "w1"}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ROWS))
def test_hostile_rows_are_a_one_line_error_naming_the_line(capfd, model, tmp_path, case):
    src = tmp_path / "d.jsonl"
    src.write_text('{"id": "ok", "text": "w1 w2"}\n' + HOSTILE_ROWS[case] + "\n")
    result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy")
    assert result.code == 1 and "d.jsonl:2:" in one_line_error(result.err), (case, result.err)
    assert not (tmp_path / "x.npy").exists()
    result = invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy", "--skip-invalid")
    assert result.code == 0, (case, result.err)
    assert load_embeddings(str(tmp_path / "x.npy")).ids == ["ok"]


def test_hostile_rows_in_task_and_label_files(capfd, model, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"query": "w1 \\ud800", "candidates": ["w2", "w3"]}\n')
    result = invoke(capfd, "rerank", tasks, "-m", model)
    assert result.code == 1 and "tasks.jsonl:1:" in one_line_error(result.err) and result.out == ""
    tasks.write_text('{"query": "w1", "candidates": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    result = invoke(capfd, "rerank", tasks, "-m", model)
    assert result.code == 1 and "nested too deeply" in one_line_error(result.err)
    from docembed.io.readers import iter_jsonl

    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"id": "a", "label": ' + "7" * 5000 + "}\n")
    with pytest.raises(InputFormatError, match="labels.jsonl:1: unreadable JSON"):
        list(iter_jsonl(labels))


# --- standard streams (class: streams) ----------------------------------------------------------------------
def test_closed_stdin_and_stdout(model, tmp_path):
    src = corpus(tmp_path / "d.jsonl", 3)
    closed_in = shell(f"docembed -q encode - --format jsonl -m {model} -o x.npy <&-", tmp_path)
    assert closed_in.returncode == 1 and "stdin is closed" in one_line_error(closed_in.stderr)
    closed_out = shell(f"docembed -q encode {src} -m {model} -o - >&-", tmp_path)
    assert closed_out.returncode == 1 and "stdout is closed" in one_line_error(closed_out.stderr)
    listing = shell("docembed models >&-", tmp_path)  # not exit 0 with the listing lost
    assert listing.returncode == 1 and "stdout is closed" in one_line_error(listing.stderr)
    to_file = shell(f"docembed -q encode {src} -m {model} -o y.npy >&-", tmp_path)
    assert to_file.returncode == 0 and load_embeddings(str(tmp_path / "y.npy")).ids == ["d0", "d1", "d2"]


def test_an_end_of_file_is_an_error_not_an_interrupt(capfd, monkeypatch):
    # click turns an EOFError escaping a command into Abort, the same as Ctrl-C
    def ends_early(*args, **kwargs):
        raise EOFError("no data left in file")

    monkeypatch.setattr("docembed.models.registry.available_models", ends_early)
    result = invoke(capfd, "models")
    assert result.code == 1 and "end of input" in one_line_error(result.err)


# --- hangs and memory (class: hangs and memory) -------------------------------------------------------------
def test_a_fifo_with_shard_is_refused_instead_of_blocking(model, tmp_path):
    fifo = tmp_path / "docs.jsonl"
    os.mkfifo(fifo)
    result = shell(f"docembed -q encode {fifo} -m {model} --shard 0/2 -o x.npy", tmp_path, timeout=30)
    assert result.returncode == 2 and "regular file" in one_line_error(result.stderr)
    if importlib.util.find_spec("ray") is not None:  # the Ray engine plans line ranges it reads again
        result = shell(f"docembed -q encode {fifo} -m {model} --engine ray -o x.npy", tmp_path, timeout=60)
        assert result.returncode == 2 and "--engine ray needs a regular file" in one_line_error(result.stderr)


def test_a_ray_address_with_nothing_behind_it_fails_with_a_message(model, tmp_path):
    pytest.importorskip("ray")
    src = corpus(tmp_path / "d.jsonl", 3)
    address = f"127.0.0.1:{free_port()}"
    result = shell(
        f"docembed -q encode {src} -m {model} -o x.npy --engine ray --address {address}", tmp_path, timeout=60
    )
    assert result.returncode == 1 and f"cannot reach the Ray cluster at {address}" in result.stderr


def test_ray_probe_times_out_with_a_message(monkeypatch):
    import socket

    from docembed.engines import ray_cluster

    waited = []

    def silent(address, timeout):
        waited.append(timeout)
        raise TimeoutError

    monkeypatch.setattr(socket, "create_connection", silent)
    monkeypatch.setenv("DOCEMBED_RAY_CONNECT_TIMEOUT", "0.5")
    with pytest.raises(DocembedError, match="no answer within 0.5 s"):
        ray_cluster._probe("ray://10.1.2.3:10001")
    assert waited == [0.5]
    ray_cluster._probe("auto")  # Ray finds the cluster itself: nothing to probe


class Recorder:
    """An encoder reading its first 256 tokens that records how much text it was given."""

    name, max_tokens = "recorder", 256

    def __init__(self):
        self.lengths = []

    def encode(self, texts, batch_size=32):
        self.lengths += [len(t) for t in texts]
        return np.zeros((len(texts), 2), dtype=np.float32)


def test_a_huge_one_line_document_is_cut_to_what_the_model_reads():
    from docembed.encoding import CHARS_PER_TOKEN, encode_texts
    from docembed.similarity import similarity_scores

    recorder = Recorder()
    normal = " ".join(["word"] * 1500)  # 7,500 characters: whole, as before
    encode_texts(recorder, ["w" * 20_000_000, normal, ""])
    assert recorder.lengths == [256 * CHARS_PER_TOKEN, len(normal), 0]
    similarity_scores(recorder, ["x" * 5_000_000], ["y"])
    assert recorder.lengths[-2:] == [256 * CHARS_PER_TOKEN, 1]


def test_the_cap_keeps_what_sbert_reads(tiny_sbert_dir):
    from docembed.encoding import encode_texts, text_cap
    from docembed.models.registry import load_model

    sbert = load_model(str(tiny_sbert_dir))
    cap = text_cap(sbert)
    assert cap and cap >= 16 * sbert.max_tokens
    long_text = "some words here " * 20_000
    cut = encode_texts(sbert, [long_text])
    assert np.allclose(cut, sbert.encode([long_text[: cap // 2]]), atol=1e-5)


def test_convert_long_refuses_a_length_beyond_the_limit(capfd, tmp_path):
    result = invoke(capfd, "convert-long", "sbert", "-o", tmp_path / "long", "--max-length", "100000000")
    assert result.code == 2 and "over the limit" in one_line_error(result.err)
    assert not (tmp_path / "long").exists()


# --- output names (class: outputs) --------------------------------------------------------------------------
def test_plot_to_an_unknown_image_format(capfd, model, tmp_path):
    pytest.importorskip("matplotlib")
    src = corpus(tmp_path / "d.jsonl", 6)
    assert invoke(capfd, "encode", src, "-m", model, "-o", tmp_path / "x.npy").code == 0
    (tmp_path / "labels.txt").write_text("a\nb\na\nb\na\nb\n")
    for name in ("map.exe", "map"):
        result = invoke(
            capfd, "plot", tmp_path / "x.npy", "-l", tmp_path / "labels.txt", "-o", tmp_path / name
        )
        assert result.code == 2 and "image format" in one_line_error(result.err), name
        assert not (tmp_path / name).exists()


def test_plot_labels_split_at_newlines_only(tmp_path):
    from docembed.cli.plot import _labels

    (tmp_path / "labels.txt").write_text("a\x0bb\r\nc\u2028d\ne\n", encoding="utf-8")
    assert _labels(str(tmp_path / "labels.txt"), ["0", "1", "2"], "label", "id") == [
        "a\x0bb",
        "c\u2028d",
        "e",
    ]


# --- third-party output and caches of the int8 engines (class: caches) --------------------------------------
@pytest.mark.parametrize("quiet", [False, True])
def test_engine_output_never_reaches_stdout(capfd, quiet, monkeypatch):
    import warnings

    from docembed.models.inference_backends import _engine_output
    from docembed.runtime import settings

    monkeypatch.setattr(settings, "quiet", quiet)
    with _engine_output():
        print("Statistics collection ━━━━ 100%")  # what NNCF prints, from Python ...
        os.write(1, b"Applying Fast Bias correction\n")  # ... or below it
        warnings.warn("TracerWarning: a note no user can act on", stacklevel=1)
    print("data")
    out, err = capfd.readouterr()
    assert out == "data\n"
    assert ("Statistics collection" in err and "Fast Bias" in err) != quiet
    assert "TracerWarning" not in err


def test_a_damaged_int8_cache_is_exported_again_with_a_warning(capfd, tmp_path):
    from docembed.models.inference_backends import cached_runner

    target = tmp_path / "openvino-int8-abc"
    exports = []

    def export(directory):
        exports.append(directory)
        (directory / "model.xml").write_text("complete")
        return {"backend": "fake"}

    def open_runner(directory):
        if (directory / "model.xml").read_text() != "complete":
            raise RuntimeError("Exception from src/core: Check 'is_valid_weights_range' failed")
        return lambda features: "ran"

    assert cached_runner(target, export, open_runner)(None) == "ran" and len(exports) == 1
    assert cached_runner(target, export, open_runner)(None) == "ran" and len(exports) == 1  # cached
    (target / "model.xml").write_text("compl")  # truncated by a full disk or a kill
    capfd.readouterr()
    assert cached_runner(target, export, open_runner)(None) == "ran" and len(exports) == 2
    assert "damaged" in capfd.readouterr().err and (target / "done.json").exists()


# --- damaged --resume state (class: resume) -----------------------------------------------------------------
def _trained(tmp_path, recipe=None):
    from docembed.training.loop import TrainConfig, train
    from toy_recipe import ToyRecipe

    settings = {"output_dir": str(tmp_path / "run"), "epochs": 1, "lr": 0.05, "log_every": 1}
    train(recipe or ToyRecipe(n_batches=4), TrainConfig(**settings, save_every=2))
    return tmp_path / "run", settings


def _resume(settings, recipe=None):
    from docembed.training.loop import TrainConfig, train
    from toy_recipe import ToyRecipe

    return train(recipe or ToyRecipe(n_batches=6), TrainConfig(**{**settings, "epochs": 2}, resume=True))


class WiderRecipe:
    """The toy recipe on 5 features: its checkpoint does not fit a 4-feature model."""

    @staticmethod
    def make():
        import torch

        from toy_recipe import ToyRecipe

        recipe = ToyRecipe(n_batches=4)
        recipe.module.linear = torch.nn.Linear(5, 1)

        def batches(epoch):
            for x, _ in ToyRecipe.batches(recipe, epoch):
                x = torch.cat([x, x[:, :1]], dim=1)
                yield x, x.sum(dim=1)

        recipe.batches = batches
        return recipe


@pytest.mark.parametrize(
    "damage, words",
    [
        ("size", "size mismatch"),
        ("weights", "cannot resume from"),
        ("optimiser", "cannot resume from"),
        ("state", "state.json"),
    ],
)
def test_a_checkpoint_that_cannot_be_resumed_is_one_error(tmp_path, damage, words):
    run, settings = _trained(tmp_path, WiderRecipe.make() if damage == "size" else None)
    checkpoint = run / "checkpoint"
    if damage == "weights":
        (checkpoint / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes()[:40])
    elif damage == "optimiser":
        (checkpoint / "optimizer.pt").write_bytes((checkpoint / "optimizer.pt").read_bytes()[:100])
    elif damage == "state":
        (checkpoint / "state.json").write_text('{"step": 2}')
    with pytest.raises(CorruptModelError, match=words) as caught:
        _resume(settings)
    assert "\n" not in str(caught.value) and str(checkpoint) in str(caught.value)


def test_a_cut_last_log_line_is_dropped_and_a_garbled_one_named(capfd, tmp_path):
    run, settings = _trained(tmp_path)
    log = run / "train_log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines) + '{"step": 5, "lo')  # killed while writing a line
    capfd.readouterr()
    _resume(settings)
    assert "cut short" in capfd.readouterr().err
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == sorted(set(steps)) and len(steps) > len(lines)  # the cut line gone, training went on
    log.write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
    with pytest.raises(DocembedError, match=r"train_log.jsonl:2: not a log line"):
        _resume(settings)


def test_a_recursion_error_a_reader_missed_is_still_one_line(capfd, monkeypatch):
    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    monkeypatch.setattr("docembed.models.registry.available_models", deep)
    result = invoke(capfd, "models")
    assert result.code == 1 and "nested too deeply" in one_line_error(result.err)
