"""`docembed encode --reuse` vs a full encode (#32): a corpus of IMDB texts of which 1 % changed.

v1 = the first `n` IMDB texts from $DOCEMBED_DATA (train, then test); v2 = v1 with every 100th text changed
(a sentence appended). `encode v1 -o v1.npy` once, then timed in fresh processes, one thread: `encode v2
-o full.npy` and `encode v2 --reuse v1.npy -o reused.npy`; the two outputs (vectors, ids, metadata) must
be identical bytes. `startup_s` is the same command on a one-document file (start-up and model load),
subtracted in `*_less_startup`.

    .venv/bin/python bench/bench_reuse.py            # -> bench/results/reuse.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import sys
import tempfile

BENCH_DIR = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from bench_index_add import _timed  # noqa: E402  (a docembed command in a fresh process, one thread)


def _write(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main(
    out_dir: pathlib.Path | None = None,
    full: bool = False,
    n: int = 20_000,
    every: int = 100,
    models: tuple[str, ...] = ("static", "glove-avg"),
) -> dict:
    from docembed.datasets import data_root

    rows = []
    for split in ("train", "test"):  # past 25,000 texts the test reviews follow the train ones
        with gzip.open(data_root() / "imdb" / f"{split}.jsonl.gz", "rt", encoding="utf-8") as handle:
            rows += [json.loads(line) for _, line in zip(range(n - len(rows)), handle, strict=False)]
    changed = [
        dict(row, text=row["text"] + " (edited)") if i % every == 0 else row for i, row in enumerate(rows)
    ]
    result = {"texts": len(rows), "changed": sum(1 for i in range(len(rows)) if i % every == 0), "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench_reuse") as tmp:
        tmp = pathlib.Path(tmp)
        v1, v2, one = tmp / "v1.jsonl", tmp / "v2.jsonl", tmp / "one.jsonl"
        _write(v1, rows)
        _write(v2, changed)
        _write(one, rows[:1])
        for model in models:
            old, whole, reused = (
                tmp / f"{model}-v1.npy",
                tmp / f"{model}-full.npy",
                tmp / f"{model}-reused.npy",
            )
            _timed("encode", str(v1), "-m", model, "-o", str(old))
            startup = _timed("encode", str(one), "-m", model, "-o", str(tmp / f"{model}-one.npy"))
            full_s = _timed("encode", str(v2), "-m", model, "-o", str(whole))
            reuse_s = _timed("encode", str(v2), "-m", model, "--reuse", str(old), "-o", str(reused))
            identical = all(
                whole.with_name(whole.name.replace(".npy", suffix)).read_bytes()
                == reused.with_name(reused.name.replace(".npy", suffix)).read_bytes()
                for suffix in (".npy", ".ids.txt", ".meta.json")
            )
            result["models"][model] = {
                "texts": len(rows),
                "full_s": round(full_s, 3),
                "reuse_s": round(reuse_s, 3),
                "startup_s": round(startup, 3),
                "reuse_over_full": round(reuse_s / full_s, 3),
                "reuse_over_full_less_startup": round(
                    max(reuse_s - startup, 0) / max(full_s - startup, 1e-9), 3
                ),
                "identical_bytes": identical,
            }
            print(f"{model}: {result['models'][model]}", file=sys.stderr)
    target = BENCH_DIR / "results" / "reuse.json"
    if target.exists():  # a run of some models keeps the others' rows (each row says its number of texts)
        earlier = json.loads(target.read_text())
        for model, row in earlier.get("models", {}).items():
            row.setdefault("texts", earlier.get("texts"))
            result["models"].setdefault(model, row)
    target.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    os.environ.setdefault("DOCEMBED_DATA", str(BENCH_DIR.parents[1] / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--models", nargs="+", default=["static", "glove-avg"])
    arguments = parser.parse_args()
    print(json.dumps(main(n=arguments.n, models=tuple(arguments.models)), indent=2))
