import os

import pytest

# Tests run offline on the packaged weights; never reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Each test gets its own models home, so nothing leaks into ~/.cache."""
    monkeypatch.setenv("DOCEMBED_HOME", str(tmp_path_factory.mktemp("docembed_home")))
