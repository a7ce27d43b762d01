"""Interop with sentence-transformers both ways: `docembed export` writes a folder SentenceTransformer loads
(the same vectors), and any sentence-transformers folder works as `--model DIR` / docembed.load(DIR)."""

import numpy as np
import pytest

import docembed
from cli_helpers import invoke

TEXTS = ["a first short text", "and a second one, a little longer than the first"]


def test_export_writes_a_folder_sentence_transformers_loads(tiny_sbert_dir, tmp_path, capfd):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "st"
    result = invoke(capfd, "export", str(tiny_sbert_dir), "-o", str(out))
    assert result.code == 0, result.err
    assert (out / "modules.json").exists() and not (out / "config.json").read_text().count('"family"')
    theirs = SentenceTransformer(str(out), device="cpu").encode(TEXTS)
    ours = docembed.load(str(tiny_sbert_dir), device="cpu").encode(TEXTS)
    assert np.allclose(theirs, ours, atol=1e-6)


def test_export_keeps_an_existing_output_and_refuses_other_families(tiny_sbert_dir, tmp_path, capfd):
    out = tmp_path / "st"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for overwrite in ((), ("--overwrite",)):  # a folder docembed did not write is never replaced
        result = invoke(capfd, "export", str(tiny_sbert_dir), "-o", str(out), *overwrite)
        assert result.code == 1 and "not a sentence-transformers model" in result.err
        assert (out / "notes.txt").read_text() == "mine"
    exported = tmp_path / "exported"
    assert invoke(capfd, "export", str(tiny_sbert_dir), "-o", str(exported)).code == 0
    assert invoke(capfd, "export", str(tiny_sbert_dir), "-o", str(exported)).code == 1  # exists
    assert invoke(capfd, "export", str(tiny_sbert_dir), "-o", str(exported), "--overwrite").code == 0
    result = invoke(capfd, "export", "glove-avg", "-o", str(tmp_path / "glove"))
    assert result.code == 2 and "only sbert-family" in result.err
    assert not (tmp_path / "glove").exists()


def test_export_says_what_a_tokens_model_becomes(tiny_sbert_tokens_dir, tiny_bert_dir, tmp_path, capfd):
    result = invoke(capfd, "export", str(tiny_sbert_tokens_dir), "-o", str(tmp_path / "st"))
    assert result.code == 0, result.err
    assert "one vector per token" in result.err and "mean-pooled" in result.err
    from tiny_models import (
        save_tiny_sbert,  # windows (sbert-windows, the retriever): their weights export too
    )

    windows = save_tiny_sbert(tiny_bert_dir, tmp_path / "windows", output="windows")
    result = invoke(capfd, "export", str(windows), "-o", str(tmp_path / "st-windows"))
    assert result.code == 0, result.err
    assert "one vector per window" in result.err and (tmp_path / "st-windows" / "modules.json").exists()


def test_a_sentence_transformers_folder_is_a_model(tiny_sbert_dir, tmp_path, capfd):
    from docembed.models.sbert import ST_SUBDIR

    st_folder = tiny_sbert_dir / ST_SUBDIR  # what SentenceTransformer.save wrote
    direct = docembed.load(str(st_folder), device="cpu")
    assert direct.family == "sbert"
    # the same network as the docembed folder holding it (which was saved with one pass, "mean"; these
    # short texts are one window, the folder's default reading, so the same vectors up to rounding)
    saved = docembed.load(str(tiny_sbert_dir), device="cpu")
    assert np.allclose(direct.encode(TEXTS), saved.encode(TEXTS), atol=1e-6)
    result = invoke(capfd, "similarity", TEXTS[0], TEXTS[1], "-m", str(st_folder))
    assert result.code == 0, result.err
    assert float(result.out) == pytest.approx(float(direct.similarity(TEXTS[0], TEXTS[1])[0, 0]), abs=2e-6)
