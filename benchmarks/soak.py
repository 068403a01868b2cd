"""Soak: a long zephon-nodes run, its resources sampled every interval, slopes reported.

Runs the benchmark pipeline (thread runner, then process runner) for ``--minutes`` each and
every ``--interval`` seconds records: RSS of the rank and its worker processes (MB, in all
and split: the rank's, the workers'), the number of processes, open files (the process
tree's ``/proc/*/fd``), threads (the rank's), this job's ``/dev/shm`` segments
(``zephon-<pid>-*``) and throughput (Mtok/s and Mtok per CPU-second over the interval).
``--trace`` also runs ``tracemalloc`` in the rank and prints the allocation sites that grew
most from the end of the settle time to the end (a leak in the rank names its line). The
slope of each, per minute, is a least-squares fit over the samples after the first
``--settle`` minutes (buffers filling, allocator warm-up): flat means ~0.

Usage::

    python -m benchmarks.soak                       # 30 minutes per runner
    python -m benchmarks.soak --minutes 3 --interval 20 --json soak.json
    python -m benchmarks.soak --runners process --settle 5 --trace   # a leak's lines
    python -m benchmarks.soak --tiny --minutes 0.05 --interval 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.timing import tree_cpu_s

METRICS = (
    "rss_mb",
    "rss_rank_mb",
    "rss_workers_mb",
    "processes",
    "open_files",
    "threads",
    "shm_segments",
    "mtok_s",
    "mtok_per_cpu_s",
)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def resources() -> dict[str, float]:
    """RSS (MB) and open files of this process tree, this process's threads, shm segments."""
    rss = rank = files = 0.0
    processes = 0
    page = os.sysconf("SC_PAGE_SIZE")
    me = os.getpid()
    for pid in _tree(me):
        try:
            with open(f"/proc/{pid}/statm") as f:
                mb = int(f.read().split()[1]) * page / 2**20
            files += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        rss += mb
        rank += mb if pid == me else 0.0
        processes += 1
    shm = 0
    if os.path.isdir("/dev/shm"):
        shm = sum(1 for n in os.listdir("/dev/shm") if n.startswith(f"zephon-{os.getpid()}-"))
    return {
        "rss_mb": rss,
        "rss_rank_mb": rank,
        "rss_workers_mb": rss - rank,
        "processes": float(processes),
        "open_files": files,
        "threads": float(len(os.listdir("/proc/self/task"))),
        "shm_segments": float(shm),
    }


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


class _Trace:
    """``tracemalloc`` snapshots of the rank: one when the settle time ends, one at the end."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.first: Any = None
        if on:
            tracemalloc.start(8)

    def sample(self, minute: float, settle: float) -> None:
        if self.on and self.first is None and minute >= settle:
            self.first = tracemalloc.take_snapshot()

    def top(self, n: int = 12) -> list[str]:
        """The ``n`` allocation sites that grew most since the first snapshot."""
        if not self.on or self.first is None:
            return []
        stats = tracemalloc.take_snapshot().compare_to(self.first, "traceback")
        tracemalloc.stop()
        out = []
        for st in sorted(stats, key=lambda s: -s.size_diff)[:n]:
            frames = " <- ".join(
                f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in st.traceback
            )
            out.append(f"{st.size_diff / 2**20:+.2f} MB ({st.count_diff:+d} blocks) {frames}")
        return out


def soak(
    runner: str,
    minutes: float,
    interval: float,
    settle: float,
    tiny: bool,
    root: str | None,
    trace: bool = False,
) -> dict[str, Any]:
    """Run one runner for ``minutes``; return the samples and the slopes per minute."""
    from benchmarks.pipelines import BenchConfig, zephon_pipeline
    from benchmarks.run import _build, corpus_args

    corpus = _build(corpus_args(tiny, root))
    cfg = BenchConfig(runner=runner)
    if tiny:
        cfg = replace(cfg, seq_len=128, shuffle_buffer=4, chunk_size=8, flush_every=2)
    _, node, pool = zephon_pipeline(corpus, cfg)
    samples: list[dict[str, float]] = []
    tracer = _Trace(trace)
    try:
        it = iter(node)
        next(it)
        t_start = time.perf_counter()
        end = t_start + minutes * 60
        while True:
            t0, c0, tokens = time.perf_counter(), tree_cpu_s(), 0
            stop = min(end, t0 + interval)
            while time.perf_counter() < stop:
                tokens += int((next(it)["labels"] != -100).sum())
            dt, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
            row = {"minute": (time.perf_counter() - t_start) / 60, **resources()}
            row["mtok_s"] = tokens / dt / 1e6 if dt else 0.0
            row["mtok_per_cpu_s"] = tokens / cpu / 1e6 if cpu else 0.0
            samples.append(row)
            tracer.sample(row["minute"], settle)
            print(
                f"  {runner} {json.dumps({k: round(v, 3) for k, v in row.items()})}",
                file=sys.stderr,
                flush=True,
            )
            if time.perf_counter() >= end:
                break
    finally:
        pool.close()
    late = [s for s in samples if s["minute"] >= settle] or samples
    xs = [s["minute"] for s in late]
    slopes = {m: slope(xs, [s[m] for s in late]) for m in METRICS}
    return {
        "runner": runner,
        "samples": samples,
        "slope_per_minute": slopes,
        "settle_min": settle,
        "trace_top": tracer.top(),
    }


def markdown(results: list[dict[str, Any]]) -> str:
    """One table per runner: first and last sample, and the slope per minute."""
    lines = []
    for r in results:
        first, last = r["samples"][0], r["samples"][-1]
        lines += [
            "",
            f"Runner {r['runner']}: {len(r['samples'])} samples over {last['minute']:.1f} min "
            f"(slope fitted after minute {r['settle_min']:g})",
            "",
            "| metric | first | last | slope per minute |",
            "|---|---|---|---|",
        ]
        for m in METRICS:
            lines.append(
                f"| {m} | {first[m]:.3f} | {last[m]:.3f} | {r['slope_per_minute'][m]:+.4f} |"
            )
        if r.get("trace_top"):
            lines += ["", "Rank allocations that grew most after the settle time:", ""]
            lines += [f"- {t}" for t in r["trace_top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Soak each runner; print the tables (and JSON with ``--json``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=30.0, help="minutes per runner")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--settle", type=float, default=2.0, help="minutes left out of the slopes")
    p.add_argument("--runners", default="thread,process")
    p.add_argument("--tiny", action="store_true", help="tiny corpus and shape (smoke)")
    p.add_argument("--root", default=None, help="cache directory of the corpus")
    p.add_argument("--json", default=None)
    p.add_argument("--trace", action="store_true", help="tracemalloc in the rank (slower)")
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load = os.getloadavg()[0]
    results = [
        soak(
            r,
            args.minutes,
            args.interval,
            min(args.settle, args.minutes / 2),
            args.tiny,
            args.root,
            args.trace,
        )
        for r in args.runners.split(",")
        if r
    ]
    print(f"Load average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}")
    print(markdown(results), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"load_start": load, "results": results}))
    sys.stdout.flush()
    os._exit(0)  # worker threads may still be inside a C++ tokenizer call


if __name__ == "__main__":
    sys.exit(main())
