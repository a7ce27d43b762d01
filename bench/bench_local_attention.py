"""The student's local attention on CPU (issue 15, speed): transformers' LongformerSelfAttention against the
blocked attention of docembed/models/local_attention.py, and against SBERT over 256-token chunks.

Model: all-MiniLM-L6-v2 converted to a Longformer (`convert_long("sbert")`: 6 layers, 384-d, window 256);
speed does not depend on the distilled weights. Text: 20 Newsgroups training posts joined into one
document, cut to 512 / 1,024 / 2,048 / 4,096 student tokens ([CLS] and [SEP] included). For each length:
`encode` seconds of the student with transformers' attention (`student-hf`), with the local attention
(`student-local`), and of `sbert-chunks` (all-MiniLM-L6-v2 over consecutive 256-token windows, one batch,
averaged), all through docembed's `encode` (tokenization included); and the student's forward alone on the
token ids. One warm-up, then `repeats` rounds of the three paths in turn; medians. One thread by default.
`--profile` adds torch.profiler's top operators of one 4,096-token forward per student path. `--memory`
adds each path's peak memory per length: a fresh process per (path, length) loads the model, encodes a short
text, resets the kernel's peak-RSS mark (Linux /proc/self/clear_refs), encodes the document; the figure is the
peak resident set (VmHWM) minus the RSS before, i.e. the working memory the document itself needs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_local_attention.py      # -> results/local_attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
LENGTHS = (512, 1024, 2048, 4096)


def _document(tokenizer, tokens: int) -> list[int]:
    """Content token ids (no specials) of 20NG training posts joined until there are `tokens` of them."""
    from docembed.datasets import iter_texts

    ids: list[int] = []
    for text in iter_texts("20newsgroups/train", limit=3000):
        if len(text) > 2000:
            ids += tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
            if len(ids) >= tokens:
                return ids
    raise RuntimeError("20newsgroups/train has too little long text")


def _seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _profile(call, rows: int = 8) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    top = [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1000, 1), "calls": e.count} for e in events]
    return [{"op": "total", "self_ms": round(total / 1000, 1), "calls": 0}, *top[:rows]]


def _measure(student, chunks, content: list[int], length: int, repeats: int) -> dict:
    import numpy as np
    import torch

    from docembed.models.local_attention import local_forward

    model, tokenizer = student.model.eval(), student.tokenizer
    text = tokenizer.decode(content[: length - 2])
    ids = torch.tensor([student.tokenize([text])[0]])
    mask = torch.ones_like(ids)

    def encode_student(local: bool):
        student.local_attention = local
        return student.encode([text], batch_size=1)

    paths = {
        "student-hf": lambda: encode_student(False),
        "student-local": lambda: encode_student(True),
        "sbert-chunks": lambda: chunks.encode([text], batch_size=32),
    }
    forwards = {
        "student-hf": lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state,
        "student-local": lambda: local_forward(model, ids, mask),
    }
    with torch.inference_mode():
        hidden = {name: call() for name, call in forwards.items()}  # warm-up, and the outputs compared
    vectors = {name: call() for name, call in paths.items()}  # warm-up
    encode_s = {name: [] for name in paths}
    forward_s = {name: [] for name in forwards}
    for _ in range(repeats):
        for name, call in paths.items():
            encode_s[name].append(_seconds(call))
        with torch.inference_mode():
            for name, call in forwards.items():
                forward_s[name].append(_seconds(call))
    medians = {name: round(statistics.median(v), 4) for name, v in encode_s.items()}
    forward = {name: round(statistics.median(v), 4) for name, v in forward_s.items()}
    return {
        "student_tokens": ids.shape[1],
        "sbert_windows": len(chunks.windows([text])[0]),
        "encode_s": medians,
        "encode_s_all": {name: [round(x, 4) for x in v] for name, v in encode_s.items()},
        "forward_s": forward,
        "speed_vs_sbert_chunks": {
            name: round(medians["sbert-chunks"] / medians[name], 3) for name in forwards
        },
        "local_speedup_encode": round(medians["student-hf"] / medians["student-local"], 3),
        "local_speedup_forward": round(forward["student-hf"] / forward["student-local"], 3),
        "max_abs_diff_hidden": float((hidden["student-hf"] - hidden["student-local"]).abs().max()),
        "max_abs_diff_embedding": float(np.abs(vectors["student-hf"] - vectors["student-local"]).max()),
    }


def run(lengths=LENGTHS, repeats: int = 3, threads: int = 1, profile: bool = False) -> dict:
    import torch

    from docembed.models.local_attention import local_forward
    from docembed.models.registry import load_model
    from docembed.models.student import convert_long

    torch.set_num_threads(threads)
    student = convert_long("sbert", max_length=max(lengths), attention_window=256)
    chunks = load_model("sbert-chunks")
    tokenizer = student.tokenizer
    content = _document(tokenizer, max(lengths))
    results = {}
    for length in lengths:
        results[str(length)] = row = _measure(student, chunks, content, length, repeats)
        print(length, json.dumps({k: row[k] for k in ("encode_s", "speed_vs_sbert_chunks")}), file=sys.stderr)
    out = {"setup": {"threads": threads, "repeats": repeats, "torch": torch.__version__}, "lengths": results}
    if profile:
        model = student.model.eval()
        ids = torch.tensor([[tokenizer.cls_token_id, *content[: max(lengths) - 2], tokenizer.sep_token_id]])
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            out[f"profile_{ids.shape[1]}"] = {
                "student-hf": _profile(lambda: model(input_ids=ids, attention_mask=mask)),
                "student-local": _profile(lambda: local_forward(model, ids, mask)),
            }
    return out


def _memory_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _memory_probe(path: str, length: int) -> None:
    """In this (fresh) process: print the peak-RSS growth in MiB of encoding one `length`-token document
    (Linux: the peak is reset after loading through /proc/self/clear_refs, so loading does not count)."""
    import gc

    import torch

    from docembed.models.registry import load_model
    from docembed.models.student import convert_long

    torch.set_num_threads(1)
    student = convert_long("sbert", max_length=max(LENGTHS), attention_window=256)
    tokenizer = student.tokenizer
    text = tokenizer.decode(_document(tokenizer, max(LENGTHS))[: length - 2])
    if path == "sbert-chunks":
        model = load_model("sbert-chunks")
        encode = lambda texts: model.encode(texts, batch_size=32)  # noqa: E731
    else:
        student.local_attention = path == "student-local"
        encode = lambda texts: student.encode(texts, batch_size=1)  # noqa: E731
    encode(["a short warm-up text of a few words"])
    gc.collect()
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = _memory_kib("VmRSS")
    encode([text])
    peak = _memory_kib("VmHWM")
    print(
        json.dumps(
            {"peak_growth_mib": round((peak - before) / 1024, 1), "baseline_mib": round(before / 1024)}
        )
    )


def memory(lengths=LENGTHS) -> dict:
    """Peak working memory (MiB) of each path at each length, one fresh process each (see the docstring)."""
    import subprocess

    rows: dict[str, dict] = {}
    for length in lengths:
        for path in ("student-hf", "student-local", "sbert-chunks"):
            probe = subprocess.run(
                [sys.executable, __file__, "--memory-probe", path, str(length)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            rows.setdefault(str(length), {})[path] = json.loads(probe.stdout.strip().splitlines()[-1])
            print(length, path, rows[str(length)][path], file=sys.stderr)
    return rows


def _save(out: dict, path: pathlib.Path, note: str = "") -> None:
    out["setup"]["note"] = note
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


def main(out_dir: pathlib.Path, full: bool, **overrides) -> dict:
    """bench/run.py's entry point: 3 repeats, one thread; writes results/local_attention.json."""
    lengths = LENGTHS if full else (512, 1024)
    out = run(lengths, overrides.get("repeats") or 3, profile=full)
    out["peak_memory_mib"] = memory(lengths)
    _save(out, BENCH_DIR / "results" / "local_attention.json")
    return out


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DOCEMBED_DATA", str(ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description="Longformer local attention: transformers vs blocked.")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--profile", action="store_true", help="top operators of one 4,096-token forward")
    parser.add_argument("--memory", action="store_true", help="peak memory per path and length")
    parser.add_argument("--memory-probe", nargs=2, metavar=("PATH", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--note", default="", help="a line saved with the results (e.g. the machine's load)")
    parser.add_argument("--out", type=pathlib.Path, default=BENCH_DIR / "results" / "local_attention.json")
    args = parser.parse_args()
    if args.memory_probe:
        _memory_probe(args.memory_probe[0], int(args.memory_probe[1]))
        sys.exit(0)
    result = run(args.lengths, args.repeats, args.threads, args.profile)
    if args.memory:
        result["peak_memory_mib"] = memory(args.lengths)
    _save(result, args.out, args.note)
    print(json.dumps(result["lengths"], indent=2))
