"""NUGGET through the CLI: train-nugget (autoencoding and similarity, one process and two torchrun ranks)
on conftest's session-wide tiny BERT as `--backbone`, then encode and inspect."""

from __future__ import annotations

import json

from nugget_helpers import TEXTS

# The backbone is conftest's tiny BERT (2 layers: --scorer-layer 1 freezes the first); the CLI only reads it.


def test_cli_train_nugget_then_encode_and_inspect(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(t or "empty" for t in TEXTS * 3) + "\n")
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "-q",
            "train-nugget",
            str(corpus),
            "-o",
            str(tmp_path / "model"),
            "--backbone",
            str(tiny_bert_dir),
            "--kind",
            "bert",
            "--scorer-layer",
            "1",
            "--max-steps",
            "2",
            "--batch-size",
            "4",
            "--max-length",
            "24",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model" / "train_summary.json").exists()
    result = runner.invoke(
        app,
        [
            "-q",
            "encode",
            str(corpus),
            "-m",
            str(tmp_path / "model"),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--ratio",
            "0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(TEXTS) * 3 and all(len(r["positions"]) == len(r["vectors"]) for r in rows)
    result = runner.invoke(
        app,
        [
            "-q",
            "inspect",
            str(corpus),
            "-m",
            str(tmp_path / "model"),
            "--show",
            "1",
            "--bleu",
            "2",
            "--bleu-max-length",
            "12",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "chosen when seen" in result.output and '"bleu"' in result.output


def test_train_nugget_under_torchrun_two_ranks(tiny_bert_dir, tmp_path):
    from cli_helpers import torchrun
    from docembed.models.registry import load_model

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(t or "empty" for t in TEXTS * 4) + "\n")
    out = tmp_path / "model"
    args = ["-q", "train-nugget", corpus, "-o", out, "--backbone", tiny_bert_dir, "--kind", "bert"]
    args += ["--scorer-layer", "1", "--batch-size", "2", "--max-length", "24", "--log-every", "1"]
    proc = torchrun(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4  # 8 global batches of 2, 2 per step
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 4  # rank 0 alone writes the log
    assert load_model(str(out)).encode(["the cat sat ."]).counts.tolist() == [1]


def test_cli_train_nugget_sim_with_frozen_encoder_and_idf_prior(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app
    from docembed.models.registry import load_model

    pairs = tmp_path / "pairs.jsonl"
    rows = [{"source": t, "target": t.upper() + " ok"} for t in TEXTS if t]
    pairs.write_text("\n".join(json.dumps(r) for r in rows * 2) + "\n")
    args = ["-q", "train-nugget", str(pairs), "-o", str(tmp_path / "model"), "--objective", "sim"]
    args += ["--backbone", str(tiny_bert_dir), "--kind", "bert", "--scorer-layer", "1"]
    args += ["--freeze", "encoder", "--no-feedback", "--idf-prior", "1", "--max-steps", "2", "-b", "3"]
    args += ["--max-length", "24", "--decoder-layers", "1", "--ratio", "0.25", "--train-ratio", "0.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    model = load_model(str(tmp_path / "model"))
    assert model.config.idf_prior == 1.0 and model.config.max_length == 24
    assert model.config.ratio == 0.25  # trained selecting at 0.5, it encodes at --ratio
    assert float(model.model.idf.max()) > 1.0  # the table was fitted on the training text and saved

    # encode with the rules it is measured against, a cap, and vectors stored in int8
    from docembed.io.embeddings import load_embeddings

    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(t for t in TEXTS if t) + "\n")
    base = ["-q", "encode", str(docs), "-m", str(tmp_path / "model")]
    for selector in ("idf", "prune", "pool"):
        out = tmp_path / f"{selector}.npz"
        result = CliRunner().invoke(app, [*base, "--selector", selector, "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert load_embeddings(str(out)).metadata["count"] == 3
    capped = CliRunner().invoke(
        app, [*base, "--ratio", "1", "--max-vectors", "2", "-o", str(tmp_path / "c.npz")]
    )
    assert capped.exit_code == 0, capped.output
    assert max(load_embeddings(str(tmp_path / "c.npz")).data.counts) == 2
    stored = CliRunner().invoke(app, [*base, "--storage", "int8", "-o", str(tmp_path / "s.npy")])
    assert stored.exit_code == 0, stored.output
    assert load_embeddings(str(tmp_path / "s.npy")).metadata["storage"] == "int8"
    refused = CliRunner().invoke(app, [*base, "--storage", "int8", "-o", str(tmp_path / "s.jsonl")])
    assert refused.exit_code != 0 and "npy, npz and safetensors" in str(refused.exception)
    assert not (tmp_path / "s.jsonl").exists()


def test_cli_train_nugget_refuses_negatives_that_are_not_texts(tmp_path):
    from typer.testing import CliRunner

    from docembed.cli import app

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"source": "a b c d", "target": "d c b a", "negatives": "x y z"}) + "\n")
    result = CliRunner().invoke(
        app, ["train-nugget", str(pairs), "-o", str(tmp_path / "m"), "--objective", "sim"]
    )
    assert result.exit_code == 1 and "'negatives' must be a list of texts" in str(result.exception)
