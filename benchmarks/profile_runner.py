"""Where the thread runner's CPU goes: py-spy samples of a zephon-nodes run, by category.

Runs the benchmark pipeline (thread runner); after its warm-up ``py-spy record`` attaches for
``--seconds`` (sampling every thread, idle threads left out, so samples are CPU time; waits
py-spy does not see as idle are dropped too), then sorts each
sample's stack into one category by the innermost frame it recognises:

* ``tokenizer``: inside sentencepiece's or ``tokenizers``' encode (the raw limit's work)
* ``parse``: reading shards, zstd, JSON lines (``operators/parse.py``, ``io/``)
* ``tokenize glue``: ``operators/tokenize.py`` outside the tokenizer call (id copies)
* ``pack``: ``operators/pack.py`` / ``bestfit.py``
* ``shuffle``: ``operators/shuffle.py`` and the seeded generator
* ``collate``: batching, numpy -> torch (``operators/batch.py``, torch)
* ``metrics``: ``engine/metrics.py``
* ``hand-offs``: queues, locks, futures, thread pools (``queue``, ``threading``,
  ``concurrent``, ``engine/pool.py``, ``engine/parallel_map.py``)
* ``engine``: the rest of ``zephon_nodes/engine`` (lanes, multiplexer, stages)
* ``other``: anything else (the benchmark's own loop, interpreter)

Usage::

    python -m benchmarks.profile_runner --seq-len 2048 --tokenizer sp --seconds 20
    python -m benchmarks.profile_runner --seq-len 256 --tokenizer hf --json out.json

py-spy is not a dependency of the project (``pip install py-spy``); without it the script
falls back to cProfile on every thread (slower, distorts short calls).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# (category, substrings of a frame "function (file:line)"), checked innermost frame first.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # A native extension's frames are invisible: the Python frame calling into Rust is the
    # tokenizer (its list comprehension copying the ids out is a frame of its own: glue).
    (
        "tokenizer",
        (
            "sentencepiece",
            "tokenizers/",
            "HFTokenizer.encode_batch (",
            "HFTokenizer._encode_one (",
            "encode_batch (benchmarks",
        ),
    ),
    ("metrics", ("engine/metrics.py",)),
    ("shuffle", ("operators/shuffle.py", "core/seeding.py")),
    ("pack", ("operators/pack.py", "operators/bestfit.py")),
    ("tokenize glue", ("operators/tokenize.py",)),
    ("parse", ("operators/parse.py", "zephon_nodes/io/", "zstandard", "json/")),
    ("collate", ("operators/batch.py", "torch/", "collate")),
    (
        "hand-offs",
        (
            "queue.py",
            "threading.py",
            "concurrent/",
            "engine/pool.py",
            "engine/parallel_map.py",
        ),
    ),
    ("engine", ("zephon_nodes/engine/", "zephon_nodes/operators/")),
)


# Innermost frames of a thread that waits (py-spy's idle detection misses some under load).
IDLE = ("Condition.wait", "Event.wait", "SimpleQueue.get", "Thread.join", "sleep (")


def categorize(stack: str) -> str:
    """Category of one collapsed stack (``frame;frame;...``, outermost first)."""
    frames = stack.split(";")
    if any(frames[-1].startswith(k) or k in frames[-1] for k in IDLE):
        return "idle"
    for frame in reversed(frames):
        for name, keys in RULES:
            if any(k in frame for k in keys):
                return name
    return "other"


def summarize(raw: str) -> dict[str, float]:
    """Share of samples per category from py-spy's ``--format raw`` output."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        c = categorize(stack)
        if c == "idle":
            continue
        counts[c] = counts.get(c, 0) + int(n)
        total += int(n)
    return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {}


def _workload(args: argparse.Namespace) -> None:
    """The profiled process: build the pipeline, run ``seconds`` after a warm-up."""
    from benchmarks.pipelines import BenchConfig, zephon_pipeline
    from benchmarks.run import _build, corpus_args
    from benchmarks.timing import tree_cpu_s

    corpus = _build(corpus_args(args.tiny, args.root))
    cfg = BenchConfig(
        seq_len=args.seq_len, tokenizer=args.tokenizer, num_workers=args.workers, runner="thread"
    )
    if args.tiny:
        cfg = replace(cfg, shuffle_buffer=4, chunk_size=8, flush_every=2)
    _, node, pool = zephon_pipeline(corpus, cfg)
    it = iter(node)
    next(it)
    end = time.perf_counter() + args.warmup
    while time.perf_counter() < end:
        next(it)
    if args.ready:
        Path(args.ready).write_text(str(os.getpid()))
    c0, t0, tokens = tree_cpu_s(), time.perf_counter(), 0
    end = t0 + args.seconds + 1.0  # py-spy attaches and samples ``seconds`` meanwhile
    while time.perf_counter() < end:
        b = next(it)
        tokens += int((b["labels"] != -100).sum())
    out = {"tokens": tokens, "cpu_s": tree_cpu_s() - c0, "wall_s": time.perf_counter() - t0}
    print(json.dumps(out), flush=True)
    pool.close()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    """Profile one shape; print the categories (and JSON with ``--json``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_runner")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--tokenizer", choices=("sp", "hf"), default="sp")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--root", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--raw", default=None, help="keep py-spy's collapsed stacks here")
    p.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ready", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.workload:
        _workload(args)
        return 0
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(pyspy, os.X_OK):
        raise SystemExit("py-spy not found: pip install py-spy")
    passthrough = list(argv if argv is not None else sys.argv[1:])
    for opt in ("--json", "--raw"):
        if opt in passthrough:
            i = passthrough.index(opt)
            del passthrough[i : i + 2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        out, ready = Path(tmp) / "raw.txt", Path(tmp) / "ready"
        cmd = [sys.executable, "-m", "benchmarks.profile_runner", "--workload"]
        work = subprocess.Popen(
            [*cmd, *passthrough, "--ready", str(ready)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        while not ready.exists() and work.poll() is None:
            time.sleep(0.1)
        spy = [pyspy, "record", "--format", "raw", "-r", str(args.rate), "-o", str(out)]
        spy += ["-p", str(work.pid), "-d", str(max(1, int(args.seconds)))]
        subprocess.run(spy, capture_output=True, text=True, check=False)
        stdout, _ = work.communicate()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if not lines or not out.is_file():
            raise SystemExit("profiled run failed (is py-spy allowed to attach? run as root)")
        run: dict[str, Any] = json.JSONDecoder().raw_decode(lines[-1])[0]
        shares = summarize(out.read_text())
        if args.raw:
            shutil.copy(out, args.raw)
    load = os.getloadavg()[0]
    per_cpu = run["tokens"] / run["cpu_s"] / 1e6 if run["cpu_s"] else 0.0
    print(
        f"seq_len {args.seq_len}, tokenizer {args.tokenizer}: {per_cpu:.3f} Mtok per CPU-s, "
        f"load {load:.1f}"
    )
    print("| category | share of CPU samples |\n|---|---|")
    for k, v in shares.items():
        print(f"| {k} | {v * 100:.1f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"run": run, "shares": shares, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
