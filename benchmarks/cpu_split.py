"""Where zephon-nodes' CPU goes, by thread clocks: the first batch, or steady steps.

Runs the benchmark shape (``benchmarks/pipelines.py``, thread runner) in this process and
reports CPU seconds (not wall: they hold under load): the whole process, the consumer
(main) thread, and each pool operator measured with the worker thread's own CPU clock.
sentencepiece encodes on a C++ thread of its own, which no Python thread's clock sees: it is
in ``rest`` (the process less the threads measured).

Usage::

    python -m benchmarks.cpu_split --first                 # fresh first batch
    python -m benchmarks.cpu_split --first --resume-after 20
    python -m benchmarks.cpu_split --steps 200 --seq-len 2048
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from benchmarks.pipelines import BenchConfig, zephon_pipeline
from benchmarks.run import _build, corpus_args
from benchmarks.timing import tree_cpu_s

_CPU: dict[str, float] = {}
_LOCK = threading.Lock()


def _timed_call(self: Any, item: Any) -> tuple[Any, tuple[tuple[str, float], ...]]:
    """``TimedCall.__call__`` that also adds each operator's thread CPU time to ``_CPU``."""
    from zephon_nodes.core.operator import operator_name

    ops = getattr(self.fn, "operators", None) or [self.fn]
    times = []
    for op in ops:
        t0, c0 = time.perf_counter(), time.thread_time()
        item = op(item)
        with _LOCK:
            _CPU[operator_name(op)] = _CPU.get(operator_name(op), 0.0) + time.thread_time() - c0
        times.append((operator_name(op), time.perf_counter() - t0))
    return item, tuple(times)


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line of CPU seconds."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_split")
    p.add_argument("--first", action="store_true", help="time the first batch of a new node")
    p.add_argument("--resume-after", type=int, default=0, help="--first: resume after N steps")
    p.add_argument("--steps", type=int, default=200, help="steady steps measured")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--tokenizer", choices=("sp", "hf"), default="sp")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--root", default=None)
    args = p.parse_args(argv)
    from zephon_nodes.engine import metrics
    from zephon_nodes.operators import tokenize

    metrics.TimedCall.__call__ = _timed_call  # type: ignore[method-assign]
    corpus = _build(corpus_args(args.tiny, args.root))
    cfg = BenchConfig(seq_len=args.seq_len, tokenizer=args.tokenizer)
    if args.tiny:
        cfg = BenchConfig(seq_len=128, shuffle_buffer=4, chunk_size=8, flush_every=2)
    state = None
    if args.first and args.resume_after:
        _, node, pool = zephon_pipeline(corpus, cfg)
        it = iter(node)
        for _ in range(args.resume_after):
            next(it)
        state = node.state_dict()
        pool.close()
    tokenize._TOKENIZERS.clear()  # a restart loads its tokenizer again
    _CPU.clear()
    c0, m0, t0 = tree_cpu_s(), time.thread_time(), time.perf_counter()
    _, node, pool = zephon_pipeline(corpus, cfg)
    if state is not None:
        node.reset(state)
    it = iter(node) if state is None else node
    steps, tokens = (1 if args.first else args.steps), 0
    if not args.first:
        for _ in range(args.warmup_steps):
            next(it)
        _CPU.clear()
        c0, m0, t0 = tree_cpu_s(), time.thread_time(), time.perf_counter()
    for _ in range(steps):
        tokens += int((next(it)["labels"] != -100).sum())
    cpu, main_cpu = tree_cpu_s() - c0, time.thread_time() - m0
    out: dict[str, Any] = {
        "mode": f"first, resumed after {args.resume_after}" if args.first else "steady",
        "seq_len": cfg.seq_len,
        "steps": steps,
        "tokens": tokens,
        "wall_s": round(time.perf_counter() - t0, 3),
        "cpu_s": round(cpu, 3),
        "main_thread_cpu_s": round(main_cpu, 3),
        **{f"{k}_cpu_s": round(v, 3) for k, v in _CPU.items()},
        "rest_cpu_s": round(cpu - main_cpu - sum(_CPU.values()), 3),
        "mtok_per_cpu_s": round(tokens / cpu / 1e6, 3) if cpu else None,
        "load": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(out), flush=True)
    pool.close()
    os._exit(0)  # worker threads may be inside a C++ tokenizer call (see benchmarks/run.py)


if __name__ == "__main__":
    main()
