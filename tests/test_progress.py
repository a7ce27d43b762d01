"""Progress of encoding (#47): a rich bar on a terminal; off one, with -v, a status line per period
(`runtime.STATUS_INTERVAL`, 0 here) and one at the end; nothing with -q. The count moves with every batch a
model reports (`runtime.report_batch`), not once per chunk of 1,024 texts."""

import importlib
import re

import numpy as np
import pytest

from cli_helpers import invoke
from docembed import runtime
from docembed.io.readers import Document

STATUS = re.compile(
    r"^(encode[^:\n]*): ([\d,]+)(?:/([\d,]+))? (documents|texts), [\d.]+ (?:docs|texts)/s.*", re.M
)


def counts(err: str) -> list[int]:
    return [int(match.group(2).replace(",", "")) for match in STATUS.finditer(err)]


@pytest.fixture
def lines_mode(monkeypatch):
    """Off a terminal (pytest's captured stderr) with -v, every step printed."""
    monkeypatch.setattr(runtime, "STATUS_INTERVAL", 0.0)
    monkeypatch.setattr(runtime.settings, "verbose", True)
    monkeypatch.setattr(runtime.settings, "quiet", False)
    monkeypatch.setattr(runtime.settings, "progress", None)


class Batched:
    """An encoder that, like the model families, runs `batch_size` texts per pass and reports each pass."""

    name = "batched"

    def __init__(self):
        self.calls = []

    def encode(self, texts, batch_size=32):
        texts = list(texts)
        self.calls.append(len(texts))
        for start in range(0, len(texts), batch_size):
            runtime.report_batch(min(start + batch_size, len(texts)), len(texts))
        return np.ones((len(texts), 3), dtype=np.float32)

    def metadata(self):
        return {"model": self.name}


def documents(n: int):
    return [Document(str(i), f"text {i}") for i in range(n)]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("".join(f"document number {i} about things\n" for i in range(2100)))
    return path


def test_verbose_off_a_terminal_prints_status_lines(capfd, monkeypatch, tmp_path, corpus):
    monkeypatch.setattr(runtime, "STATUS_INTERVAL", 0.0)
    result = invoke(capfd, "-v", "encode", corpus, "-m", "glove-avg", "-o", tmp_path / "out.npy")
    assert result.code == 0, result.err
    lines = [m.group(0) for m in STATUS.finditer(result.err)]
    # glove-avg reports no batches (a chunk is one vectorised pass): one line per chunk of 1,024
    assert counts(result.err) == [1024, 2048, 2100], result.err
    for match in STATUS.finditer(result.err):
        assert (match.group(1), match.group(3)) == ("encode [glove-avg]", "2,100"), result.err
    assert "ETA" in lines[0]
    assert re.search(r"2,100/2,100 documents, [\d.]+ docs/s, done in \d", result.err)


def test_status_lines_wait_for_the_period(capfd, tmp_path, corpus):
    """At the default period a quick run prints the first step and the end, nothing between."""
    result = invoke(capfd, "-v", "encode", corpus, "-m", "glove-avg", "-o", tmp_path / "out.npy")
    assert result.code == 0, result.err
    assert counts(result.err) == [1024, 2100]


@pytest.mark.parametrize("flags", [["-q"], [], ["-q", "-v"]])
def test_quiet_or_not_verbose_prints_no_progress(capfd, monkeypatch, tmp_path, corpus, flags):
    monkeypatch.setattr(runtime, "STATUS_INTERVAL", 0.0)
    result = invoke(capfd, *flags, "encode", corpus, "-m", "glove-avg", "-o", tmp_path / "out.npy")
    assert result.code == 0, result.err
    assert counts(result.err) == []
    if "-q" in flags:
        assert result.err == ""


def test_progress_moves_with_every_batch_not_every_chunk(capsys, lines_mode):
    from docembed.encoding import encode_documents

    model = Batched()
    embeddings = encode_documents(model, documents(100), batch_size=10, total=100)
    assert model.calls == [100]  # the model still gets the whole chunk in one call: the same vectors
    assert len(embeddings) == 100
    assert counts(capsys.readouterr().err) == list(range(10, 101, 10))


def test_progress_over_several_chunks_and_without_a_total(capsys, lines_mode):
    from docembed.encoding import encode_texts

    encode_texts(Batched(), [f"t{i}" for i in range(25)], batch_size=4, chunk_size=10)
    err = capsys.readouterr().err
    # chunks of 10 (batches 4, 8, 10), 10 more, then 5; without a total the last step is not known as
    # the last, and the closing line repeats its count
    assert counts(err) == [4, 8, 10, 14, 18, 20, 24, 25, 25]
    assert "done in" in err.splitlines()[-1]
    assert not re.search(r"\d/\d", err)  # no total: no "n/N"
    assert "ETA" not in err


def test_reused_rows_count_at_once_and_fresh_ones_per_batch(capsys, lines_mode):
    from docembed.encoding import encode_documents, encode_documents_reusing, reuse_metadata, text_digest

    model = Batched()
    old_docs = documents(20)
    old = encode_documents(model, old_docs, batch_size=5)
    digests = b"".join(text_digest(d.text) for d in old_docs)
    old.metadata.update(reuse_metadata(model, digests))
    capsys.readouterr()
    changed = [*old_docs[:10], *(Document(d.id, d.text + " changed") for d in old_docs[10:])]
    _, encoded = encode_documents_reusing(model, changed, old, "old.npy", batch_size=5, total=20)
    assert encoded == 10
    assert counts(capsys.readouterr().err) == [15, 20]


def test_ctrl_c_is_honoured_between_batches(monkeypatch, lines_mode):
    from docembed.encoding import encode_texts

    class Interrupted(Batched):
        def encode(self, texts, batch_size=32):
            runtime.report_batch(1, len(texts))
            monkeypatch.setattr(runtime, "_interrupt_requested", True)
            runtime.report_batch(2, len(texts))
            raise AssertionError("the second report should have raised KeyboardInterrupt")

    monkeypatch.setattr(runtime, "_interrupt_requested", False)
    with pytest.raises(KeyboardInterrupt):
        encode_texts(Interrupted(), ["a"] * 8, batch_size=1)


def test_a_fusion_that_reports_twice_never_goes_back(capsys, lines_mode):
    """A model that runs two passes over the call (a fusion's two models) reports from 0 twice."""
    from docembed.encoding import encode_texts

    class Twice(Batched):
        def encode(self, texts, batch_size=32):
            super().encode(texts, batch_size)
            return super().encode(texts, batch_size)

    encode_texts(Twice(), [f"t{i}" for i in range(6)], batch_size=3, total=6)
    assert counts(capsys.readouterr().err) == [3, 6]


def test_a_family_that_runs_its_texts_in_parts_reports_in_the_calls_units(capsys, lines_mode):
    """The usual texts together, then each long one streamed in sub-calls that each report done/total of
    their own: `reporting_texts` keeps the count in the whole call's texts."""
    from docembed.encoding import encode_texts

    class InParts(Batched):
        def encode(self, texts, batch_size=32):
            texts = list(texts)
            long = [t for t in texts if t.startswith("long")]
            short = [t for t in texts if not t.startswith("long")]
            with runtime.reporting_texts(0, len(short), len(texts)):
                super().encode(short, batch_size)
            for k, _ in enumerate(long):
                with runtime.reporting_texts(len(short) + k, 1, len(texts)):
                    for _ in range(3):  # the long text's windows, a batch at a time: each its own call
                        super().encode(["window"] * batch_size, batch_size)
            return np.ones((len(texts), 3), dtype=np.float32)

    texts = [f"t{i}" for i in range(8)] + ["long a", "long b"]
    encode_texts(InParts(), texts, batch_size=4, total=10)
    assert counts(capsys.readouterr().err) == [4, 8, 9, 10]


def test_one_worker_reports_every_batch(capsys, lines_mode):
    from docembed.parallel import WorkerModel, encode_documents_in_processes, piece_size

    model = Batched()
    embeddings = encode_documents_in_processes(
        WorkerModel("unused"), model, documents(50), 1, batch_size=5, total=50
    )
    assert len(embeddings) == 50
    assert model.calls == [piece_size(5), piece_size(5), 50 - 2 * piece_size(5)]  # pieces as before
    assert counts(capsys.readouterr().err) == list(range(5, 51, 5))


def test_status_line_format():
    lines = runtime._StatusLines("encode [m]", 50_000, "documents")
    assert runtime.duration(1314) == "21m54s"
    assert runtime.duration(3725) == "1h02m"
    assert runtime.duration(9.4) == "9s"
    assert runtime.rate_unit("documents") == "docs/s" and runtime.rate_unit("texts") == "texts/s"
    assert lines.done == 0


def test_progress_mode_follows_the_flags(monkeypatch):
    monkeypatch.setattr(runtime.settings, "progress", None)
    monkeypatch.setattr(runtime.settings, "quiet", False)
    monkeypatch.setattr(runtime.settings, "verbose", True)
    assert runtime.progress_mode() == "lines"  # pytest's stderr is not a terminal
    monkeypatch.setattr(runtime.settings, "verbose", False)
    assert runtime.progress_mode() is None
    monkeypatch.setattr(runtime.settings, "progress", True)  # the Python API's show_progress_bar=True
    assert runtime.progress_mode() == "bar"
    monkeypatch.setattr(runtime.settings, "quiet", True)
    assert runtime.progress_mode() is None


# --- the model families report their batches ---------------------------------------------------------------
def reports_batches(module: str) -> bool:
    return hasattr(importlib.import_module(module), "report_batch")


@pytest.mark.skipif(
    not reports_batches("docembed.models.sbert"), reason="sbert does not report its batches yet (#47)"
)
@pytest.mark.parametrize("fixture", ["tiny_sbert_dir", "tiny_sbert_tokens_dir"])
def test_sbert_reports_every_batch(capsys, lines_mode, request, fixture):
    from docembed.encoding import encode_documents
    from docembed.models.registry import load_model

    model = load_model(str(request.getfixturevalue(fixture)))
    texts = [Document(str(i), "word " * (i % 7 + 1)) for i in range(20)]
    encode_documents(model, texts, batch_size=4, total=20)
    assert counts(capsys.readouterr().err) == [4, 8, 12, 16, 20]


@pytest.mark.skipif(
    not reports_batches("docembed.models.nugget"), reason="nugget does not report its batches yet (#47)"
)
def test_nugget_reports_every_batch(capsys, lines_mode, minilm_tokenizer):
    from docembed.encoding import encode_documents
    from tiny_models import tiny_nugget

    texts = [Document(str(i), "word " * (i % 7 + 1)) for i in range(20)]
    encode_documents(tiny_nugget(minilm_tokenizer), texts, batch_size=4, total=20)
    assert counts(capsys.readouterr().err) == [4, 8, 12, 16, 20]


@pytest.mark.skipif(
    not reports_batches("docembed.models.sbert"), reason="sbert does not report its batches yet (#47)"
)
def test_workers_send_their_batches_to_the_parent(monkeypatch, lines_mode, tiny_sbert_dir):
    from docembed import parallel
    from docembed.models.registry import load_model
    from docembed.parallel import WorkerModel, encode_documents_in_processes

    reported = []
    report = parallel.PieceProgress.report

    def recording(self, piece, size, done, total):
        reported.append((piece, done, total))
        report(self, piece, size, done, total)

    monkeypatch.setattr(parallel.PieceProgress, "report", recording)
    spec = WorkerModel(str(tiny_sbert_dir))
    texts = [Document(str(i), "word " * (i % 5 + 1)) for i in range(40)]
    embeddings = encode_documents_in_processes(spec, load_model(str(tiny_sbert_dir)), texts, 2, batch_size=4)
    assert len(embeddings) == 40
    # pieces of 16 texts, each reported batch by batch (4 texts) from inside its worker
    assert {(piece, done) for piece, done, _ in reported} >= {(0, 4), (0, 8), (1, 4), (2, 4)}
