"""Run the real `docembed` entry point in-process (fast) or as a subprocess (signals, pipes, timing)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DOCEMBED = str(Path(sys.executable).with_name("docembed"))


@dataclass
class Result:
    code: int
    out: str
    err: str


def invoke(capfd, *args: str) -> Result:
    """docembed.cli.main() with argv = args; returns exit code, stdout and stderr."""
    from docembed.cli import main

    old_argv = sys.argv
    sys.argv = ["docembed", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        sys.argv = old_argv
    out, err = capfd.readouterr()
    return Result(code, out, err)


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([DOCEMBED, *map(str, args)], capture_output=True, text=True, **kwargs)


def start_server(*args, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`docembed serve --port 0 ARGS` in its own process: (the process, the URL its bind line names). Its
    stderr keeps being read, so the request log cannot fill the pipe."""
    import re
    import threading

    server = subprocess.Popen(
        [sys.executable, "-m", "docembed", "serve", "--port", "0", *map(str, args)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    url = None
    for line in server.stderr:  # the bind line says which port was picked
        found = re.search(r"on (http://[\d.]+:\d+)", line)
        if found:
            url = found.group(1)
            break
    assert url, "the server never said where it listens"
    threading.Thread(target=server.stderr.read, daemon=True).start()
    return server, url


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args, nproc: int = 2, timeout: float = 300, script=None) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node NPROC -m docembed ARGS` (or SCRIPT ARGS) on CPU (gloo), one thread per
    rank. On a timeout the launcher and its ranks are killed together (a hung rank must not outlive the
    test)."""
    import os
    import signal
    import uuid

    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    launcher += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    launcher += [str(script)] if script else ["-m", "docembed"]
    run_id = uuid.uuid4().hex  # finds the ranks at a timeout: they run in sessions of their own
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", DOCEMBED_TEST_RUN=run_id)
    cmd = [*launcher, *map(str, args)]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _kill_marked(f"DOCEMBED_TEST_RUN={run_id}")  # a hung rank keeps the pipes open
            out, err = proc.communicate()
            raise AssertionError(f"torchrun timed out after {timeout} s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment holds `marker` (Linux /proc)."""
    import os
    import signal
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone, or not ours to read
            continue


def encode_fp32_and_int8(capfd, model_dir: Path, texts: list[str], suffix: str) -> dict:
    """`docembed encode --precision fp32|int8` of a saved model over `texts`, each checked to exit 0 with
    nothing on stdout (the quantiser's chatter goes to stderr): precision -> the loaded EmbeddingSet."""
    from docembed.io.embeddings import load_embeddings

    work = model_dir.parent
    corpus = work / "docs.txt"
    corpus.write_text("\n".join(t for t in texts if t) + "\n", encoding="utf-8")
    outputs = {}
    for precision in ("fp32", "int8"):
        output = work / f"{precision}{suffix}"
        result = invoke(capfd, "encode", corpus, "-m", model_dir, "--precision", precision, "-o", output)
        assert result.code == 0, result.err
        assert not result.out
        outputs[precision] = load_embeddings(str(output))
    assert outputs["int8"].metadata.get("inference") == "openvino-int8"
    assert "inference" not in outputs["fp32"].metadata
    return outputs


def tiny_distill_args(corpus: Path, out: Path, student: Path, sbert: Path, cache: Path) -> list[str]:
    """`train-distill` of a tiny student from the tiny sbert teacher alone (fast: no PV teacher to train)."""
    args = ["-q", "train-distill", str(corpus), "-o", str(out), "--student", str(student)]
    args += ["--teacher", "sbert", "--sbert-model", str(sbert), "--batch-size", "4"]
    return [*args, "--cache-dir", str(cache)]


def encode_and_index(capfd, folder: Path, model, texts, *options) -> Path:
    """`texts` as docs.jsonl (ids d0, d1, ...) in `folder`, encoded by `model` with `options` and indexed
    (faiss): the index folder, its metadata what encode recorded."""
    import json

    corpus = folder / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    encoded = invoke(capfd, "encode", corpus, "-m", model, "-o", folder / "docs.npz", *options)
    assert encoded.code == 0, encoded.err
    built = invoke(capfd, "index", "build", folder / "docs.npz", "-o", folder / "docs.index")
    assert built.code == 0, built.err
    return folder / "docs.index"
