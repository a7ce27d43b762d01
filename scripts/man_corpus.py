"""Extra training text for QuickThoughts: this machine's English man pages, rendered to prose, as JSONL.

Each page of /usr/share/man/man{1,5,7,8} (the English sections; translations live in language folders and
are skipped) is rendered by groff (no hyphenation, one paragraph per line), and its paragraphs of six or more
words that contain a letter are kept in page order: {"id": "man1/ls", "text": paragraphs joined by newlines}.
A page whose text equals an earlier page's (links, aliases) is written once.
Option lists, synopses and code are mostly short lines and drop out. Pages named python* are skipped (the
Python documentation is reserved for independent evaluation). Derived data: written under runs/, not shipped.

`--packages CACHE` reads the man pages of MAN_PACKAGES instead, fetched from the Debian archive into CACHE
(scripts/debian_packages.py): packages with long pages this machine does not have. A page this machine has
too is left out, so the two sets never share a page; each row names its package ("source"). The
long-document bench reads them; no training corpus does.

    python scripts/man_corpus.py runs/zoo/man-pages.jsonl [--sections 1,5,7,8] [--limit N] [--min-bytes B]
    python scripts/man_corpus.py runs/man-packages/man-pages.jsonl --packages runs/man-packages \\
        --min-bytes 12000
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

from debian_packages import decoded, fetch

MAN_ROOT = Path("/usr/share/man")
COMMAND_SECTIONS = ("1", "5", "7", "8")  # the default: commands, files, overviews, administration
# -Kutf-8: groff reads its input as Latin-1 unless told, so a UTF-8 page's "’" came out as "â" (until
# 2026-11-29: 16 of the long-document bench's 207 pages). page_paragraphs hands it UTF-8 always.
RENDER = ["groff", "-Kutf-8", "-man", "-Tutf8", "-P-cbou", "-rHY=0", "-rLL=2000n"]
MIN_WORDS = 6
# packages whose man pages of 2,000-10,000 words this machine lacks (commands, files and overviews of
# mail, DNS, VPN, storage, containers, terminals, typesetting, Debian packaging, compilers)
MAN_PACKAGES = (  # noqa: SIM905 (a list of words reads as one)
    "apparmor bpftrace buildah busybox chrony cifs-utils cmus debhelper devscripts dunst erlang-base feh "
    "ffmpeg firejail firewalld fvwm gawk ghc graphviz groff hdparm inkscape khal ledger lvm2 mariadb-client "
    "mmdebstrap mosquitto msmtp nano ncftp netpbm network-manager newsboat nfs-common nsd opendkim "
    "openssh-server podman postfix rdiff-backup rsnapshot rsync rxvt-unicode samba-common-bin sbuild slapd "
    "smartmontools smbclient strongswan-starter strongswan-swanctl sudo supervisor sway sysstat taskwarrior "
    "tcpdump uftrace varnish xfsprogs xorg-docs-core xorriso xserver-xorg-core zsh-common"
).split()


def page_paragraphs(path: Path) -> list[str]:
    """The prose paragraphs of one man page, in order (an empty list when groff fails)."""
    source = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if source.startswith(b".so "):  # a link to another page: its text is read there
        return []
    text = decoded(source)  # UTF-8, or an older page's Latin-1, handed to groff as UTF-8
    rendered = subprocess.run(RENDER, input=text.encode("utf-8"), capture_output=True, timeout=60)
    if rendered.returncode != 0:
        return []
    lines = rendered.stdout.decode("utf-8", errors="replace").splitlines()[1:-1]  # header and footer
    paragraphs = []
    for line in lines:
        text = re.sub(r"\s+", " ", line).strip()
        if len(text.split()) >= MIN_WORDS and re.search(r"[A-Za-z]", text):
            paragraphs.append(text)
    return paragraphs


def man_description(page_id: str, root: Path = MAN_ROOT) -> str | None:
    """The description in the NAME line of man page `man1/ls` ("list directory contents") under `root`, or
    None: the long-document bench's summary queries and the retriever's summaries."""
    section, name = page_id.split("/", 1)
    files = sorted(root.joinpath(section).glob(f"{name}.*"))
    if not files:
        return None
    found = subprocess.run(["lexgrog", str(files[0])], capture_output=True, text=True).stdout
    match = re.search(r'"[^"]*? - (.+)"', found)
    return match.group(1).strip() if match and len(match.group(1).split()) >= 2 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--sections", default=",".join(COMMAND_SECTIONS))
    parser.add_argument("--limit", type=int, default=None, help="pages per section (default: all)")
    parser.add_argument(
        "--min-bytes", type=int, default=0, help="skip page files smaller than this (compressed): long pages"
    )
    parser.add_argument("--packages", type=Path, help="read MAN_PACKAGES, fetched into this cache folder")
    args = parser.parse_args(argv)
    roots = {None: MAN_ROOT}  # package (None: this machine) -> its man folder
    if args.packages:
        unpacked = fetch(MAN_PACKAGES, args.packages)
        roots = {package: unpacked / package / "usr/share/man" for package in MAN_PACKAGES}
    pages = written = paragraphs = 0
    seen: set[str] = set()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as out:
        for (package, root), section in ((r, s) for r in roots.items() for s in args.sections.split(",")):
            folder = root / f"man{section}"
            for path in sorted(folder.iterdir() if folder.is_dir() else [])[: args.limit]:
                if not path.is_file() or path.name.startswith("python"):
                    continue
                if path.stat().st_size < args.min_bytes:
                    continue
                if package and (MAN_ROOT / f"man{section}" / path.name).exists():
                    continue  # this machine's page: the set without --packages has it
                pages += 1
                kept = page_paragraphs(path)
                digest = hashlib.sha1("\n".join(kept).encode("utf-8")).hexdigest()
                if kept and digest not in seen:
                    seen.add(digest)
                    name = path.name.removesuffix(".gz")
                    row = {"id": f"man{section}/{name}", "text": "\n".join(kept)}
                    out.write(json.dumps(row | ({"source": package} if package else {})) + "\n")
                    written += 1
                    paragraphs += len(kept)
                if pages % 1000 == 0:
                    print(f"man pages: {pages} read, {written} kept", file=sys.stderr, flush=True)
    print(
        f"man pages: {pages} read, {written} written, {paragraphs} paragraphs -> {args.output}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
