"""Debian packages fetched from the archive and unpacked, once, into a cache folder: the source of the
documentation and man pages the corpora and benchmarks read (scripts/debian_docs.py, scripts/man_corpus.py).

The archive's current versions are taken (the .deb names in the cache say which). The Debian packages
linux-doc-* and python3*-doc are reserved for independent evaluation: `fetch` refuses them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

RESERVED = re.compile(r"^(linux-doc|python3.*-doc)")


def fetch(packages: list[str], cache: Path) -> Path:
    """Download and unpack `packages` into `cache` once: the folder holding one unpacked tree per package
    (cache/unpacked/PACKAGE/usr/...)."""
    reserved = [p for p in packages if RESERVED.match(p)]
    if reserved:
        sys.exit(f"reserved for independent evaluation, never fetched here: {', '.join(reserved)}")
    unpacked = cache / "unpacked"
    if (unpacked / ".done").exists():
        return unpacked
    unpacked.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(["apt-get", "download", *packages], cwd=cache, capture_output=True, text=True)
    if got.returncode != 0:
        sys.exit(f"apt-get download failed (the Debian archive must be reachable): {got.stderr.strip()}")
    for deb in sorted(cache.glob("*.deb")):
        print(f"unpacking {deb.name}", file=sys.stderr)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked / deb.name.split("_")[0])], check=True)
    (unpacked / ".done").write_text("")
    return unpacked


def decoded(data: bytes) -> str:
    """A packaged text file's bytes as text: UTF-8, else Latin-1, the encoding of older pages (a page that
    declares UTF-8 may still hold a Latin-1 no-break space, as bacula-doc's do). Decoding UTF-8 with
    errors="replace" turned each such byte into U+FFFD."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")
