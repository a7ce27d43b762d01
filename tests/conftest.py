import os
import sys

import pytest

# Tests run offline on the packaged weights; never reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Each test gets its own models home, so nothing leaks into ~/.cache."""
    monkeypatch.setenv("DOCEMBED_HOME", str(tmp_path_factory.mktemp("docembed_home")))


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """An in-process `encode --threads N` (a docs example, a CLI test) sets torch's threads for the rest of
    the process: put them back, so later tests do not oversubscribe the machine (or run slower than set)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if before is None:  # torch came in during the test: its default is OMP_NUM_THREADS when that is set
        value = os.environ.get("OMP_NUM_THREADS", "")
        before = int(value) if value.isdigit() and int(value) > 0 else None
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


# --- tiny models, built once per session -----------------------------------------------------------------
# Read-only: a test that trains or changes one loads its own copy from the folder (from_pretrained /
# load_model) or builds its own; nothing may write into these folders.


@pytest.fixture(scope="session")
def minilm_tokenizer():
    """MiniLM's WordPiece tokenizer (the offline package), loaded once."""
    from transformers import AutoTokenizer

    from docembed.models.offline import minilm_path

    return AutoTokenizer.from_pretrained(str(minilm_path()))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A saved 2-layer 32-d BERT with TINY_POSITIONS positions and MiniLM's tokenizer."""
    from tiny_models import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_sbert_dir(tiny_bert_dir, tmp_path_factory):
    """A saved docembed sbert model over the tiny BERT: mean pooling, TINY_POSITIONS-token windows."""
    from tiny_models import save_tiny_sbert

    return save_tiny_sbert(tiny_bert_dir, tmp_path_factory.mktemp("tiny_sbert"))


@pytest.fixture(scope="session")
def tiny_sbert_tokens_dir(tiny_bert_dir, tmp_path_factory):
    """The same tiny sbert model with output="tokens": a multi-vector model."""
    from tiny_models import save_tiny_sbert

    return save_tiny_sbert(tiny_bert_dir, tmp_path_factory.mktemp("tiny_sbert_tokens"), output="tokens")


@pytest.fixture(scope="session")
def tiny_tfidf_dir(tmp_path_factory) -> str:
    """A tf-idf fitted on 16 texts of the words w0..w63, with an LSA of 8 dimensions: the fault tests' model
    (their corpora use those words)."""
    from docembed.models.baselines import TfidfConfig, TfidfEncoder

    words = [f"w{i}" for i in range(64)]
    directory = tmp_path_factory.mktemp("tiny_tfidf") / "tfidf"
    texts = [" ".join(words[i : i + 8]) for i in range(0, 64, 4)]
    TfidfEncoder(TfidfConfig(svd_dim=8), name="tiny").fit(texts).save(directory)
    return str(directory)
