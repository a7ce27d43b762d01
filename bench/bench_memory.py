"""Peak memory of `docembed encode` on one huge document (#49): for each family, a fresh process encodes a
one-line JSONL document of `--mb` MB (English sentences repeated) and, separately, one page (about 3 KB);
its peak resident set (the kernel's ru_maxrss, read by wait4) is compared. The goal: the huge document
costs at most twice the page, for every family, since long texts are streamed through bounded windows.

Families whose output itself grows with the text (nugget: 1.66 GB of vectors for 50 MB) are held to the same
goal: past 64 MB, one document's output goes to a temporary file, written out a block at a time
(tensors.GrowingRows). `bm25` is a scorer: its row is `fit bm25` on the document.
Not a timed bench: seconds are recorded only to say how long each row took. One thread per process.

    .venv/bin/python bench/bench_memory.py [--mb 50] [--only static,glove-avg] [--limit 1800]
    .venv/bin/python bench/run.py --only memory
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
DOCEMBED = str(pathlib.Path(sys.executable).with_name("docembed"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

SENTENCES = (
    "The committee met on Tuesday to review the budget for the coming year.",
    "Several members asked why the costs of maintenance had risen so quickly.",
    "A report from the engineers explained that the old pumps were failing.",
    "After a long discussion, they agreed to replace two of them in spring.",
    "Dr. Smith noted that the river levels would be lower then, e.g. in April.",
    "Nobody expected the vote to be close, but it passed by a single voice!",
)

# family -> the encode options (tfidf: a model fitted on the page first; bm25: `fit bm25` of the text)
FAMILIES: dict[str, list[str]] = {
    "sbert": ["-m", "sbert"],
    "sbert-truncate": ["-m", "sbert", "--long", "truncate"],
    "sbert-windows": ["-m", "sbert-windows"],
    "sbert-tokens": ["-m", "sbert-tokens"],
    "nugget": ["-m", "nugget"],
    "student": ["-m", "student"],
    "static": ["-m", "static"],
    "glove-avg": ["-m", "glove-avg"],
    "quickthoughts": ["-m", "quickthoughts"],
    "tfidf": [],
    "bm25": [],
}


def english(chars: int) -> str:
    """About `chars` characters of English sentences, one line."""
    paragraph = " ".join(SENTENCES)
    return (" ".join([paragraph] * (chars // (len(paragraph) + 1) + 1)))[:chars].rsplit(" ", 1)[0]


def write_document(path: pathlib.Path, chars: int) -> pathlib.Path:
    path.write_text(json.dumps({"id": "d0", "text": english(chars)}) + "\n", encoding="utf-8")
    return path


def peak_rss(command: list[str], limit: float) -> dict:
    """Run `command`; its peak RSS in MB (ru_maxrss), wall seconds and whether it finished in `limit`."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    timer = threading.Timer(limit, proc.kill)
    timer.start()
    stderr = proc.stderr.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "peak_mb": round(usage.ru_maxrss / 1024, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "finished": proc.returncode == 0,
        **({} if proc.returncode == 0 else {"exit": proc.returncode, "stderr": stderr.strip()[-300:]}),
    }


def measure(family: str, document: pathlib.Path, work: pathlib.Path, limit: float) -> dict:
    out = work / f"{family}-{document.stem}.npy"
    if family == "bm25":
        command = [DOCEMBED, "-q", "fit", "bm25", str(document), "-o", str(work / "bm25-fit"), "--overwrite"]
    else:
        options = FAMILIES[family] or ["-m", str(work / "tfidf")]
        command = [DOCEMBED, "-q", "encode", str(document), *options, "-o", str(out), "--overwrite"]
    return peak_rss(command, limit)


def main(out_dir: pathlib.Path | None = None, full: bool = False, mb: float = 50.0, only=None, limit=1800.0):
    out_dir = pathlib.Path(out_dir or BENCH_DIR / "results")
    families = list(only or FAMILIES)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        page = write_document(work / "page.jsonl", 3_000)
        huge = write_document(work / "huge.jsonl", int(mb * 1_000_000))
        if "tfidf" in families:
            subprocess.run([DOCEMBED, "-q", "fit", "tfidf", str(page), "-o", str(work / "tfidf")], check=True)
        for family in families:
            page_row = measure(family, page, work, limit)
            huge_row = measure(family, huge, work, limit)
            ratio = round(huge_row["peak_mb"] / page_row["peak_mb"], 2)
            rows[family] = {"page": page_row, "huge": huge_row, "ratio": ratio}
            done = "" if huge_row["finished"] else ", NOT FINISHED"
            print(
                f"{family:15s} page {page_row['peak_mb']:.1f} MB, {mb:g} MB doc {huge_row['peak_mb']:.1f} MB "
                f"({ratio}x, {huge_row['seconds']} s{done})",
                file=sys.stderr,
                flush=True,
            )
    summary = {
        "bench": "memory",
        "document_mb": mb,
        "page_chars": 3_000,
        "threads": 1,
        "goal": "peak RSS of the huge document <= 2x the page's, for every family",
        "families": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "memory.json"
    if path.exists() and only:  # a run of some families keeps the others' earlier rows
        earlier = json.loads(path.read_text(encoding="utf-8"))
        if earlier.get("document_mb") == mb:
            summary["families"] = {**earlier.get("families", {}), **rows}
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


if __name__ == "__main__":
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--mb", type=float, default=50.0, help="size of the huge document in MB")
    parser.add_argument("--only", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds before a run is stopped")
    parser.add_argument("--out", default=str(BENCH_DIR / "results"), help="folder for memory.json")
    args = parser.parse_args()
    only = args.only.split(",") if args.only else None
    main(pathlib.Path(args.out), mb=args.mb, only=only, limit=args.limit)
