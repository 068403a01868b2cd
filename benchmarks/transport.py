"""Transport benchmark: tokens per second and per CPU-second, thread vs process runner with
shared memory vs process runner pickling its results (the byte tokenizer, so results are
large int32 arrays: 4 bytes per text byte).

Usage::

    python -m benchmarks.transport                 # 3 alternating rounds of 8 s
    python -m benchmarks.transport --tiny          # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.corpus import default_root
from benchmarks.timing import tree_cpu_s
from zephon_nodes import DatasetSpec, Pipeline, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.engine.pool import WorkerPool

WORDS = ["the", "of", "and", "to", "in", "data", "lane", "flush", "replay", "token"]


def make_corpus(root: Path, docs: int) -> Path:
    """Write (once) ``docs`` documents of about 4 KiB of words as one jsonl file."""
    path = root / f"transport-{docs}.jsonl"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for _ in range(docs):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(400, 1000)))
                f.write(json.dumps({"text": text}) + "\n")
        tmp.replace(path)
    return path


def recipe(path: Path) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("words", paths=(path.name,), base_dir=path.parent),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=1,
        num_lanes=8,
        global_batch_size=8,
        seq_len=2048,
        flush_every=8,
        work=WorkSpec(chunk_size=64, epochs=None),
        shuffle=ShuffleSpec(0),
    )


def run(r: Recipe, runner: str, workers: int, shared_memory: bool, seconds: float) -> dict:
    """Tokens (non-padding labels) per second and per CPU-second of one rank over 8 lanes."""
    pipeline = Pipeline(r)
    with (
        WorkerPool(workers, runner, shared_memory=shared_memory) as pool,
        pipeline.rank_node(pool=pool) as node,
    ):
        node.reset(None)
        for _ in range(8):  # warm-up: workers started, look-ahead filled
            next(node)
        t0, c0, tokens = time.perf_counter(), tree_cpu_s(), 0
        while time.perf_counter() - t0 < seconds:
            tokens += int((next(node)["labels"] != -100).sum())
        wall, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
    return {"tokens_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu, "cpu_per_s": cpu / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    seconds = 0.5 if args.tiny else args.seconds
    r = recipe(make_corpus(default_root(), 200 if args.tiny else 4000))
    w = args.workers
    runs: dict[str, Any] = {
        f"thread x{w}": lambda: run(r, "thread", w, False, seconds),
        f"process x{w} (shared memory)": lambda: run(r, "process", w, True, seconds),
        f"process x{w} (pickled)": lambda: run(r, "process", w, False, seconds),
    }
    rounds: dict[str, list[dict]] = {k: [] for k in runs}
    for _ in range(1 if args.tiny else args.rounds):
        for k, fn in runs.items():
            rounds[k].append(fn())
    load = os.getloadavg()[0]
    print(f"byte tokenizer, 8 lanes, seq_len 2048; median of {len(rounds[k])} rounds "
          f"(load {load:.1f})\n")  # fmt: skip
    print("| runner | Mtok/s | CPU s per s | Mtok per CPU s |")
    print("|---|---:|---:|---:|")
    out = {}
    for k, measured in rounds.items():
        med = sorted(measured, key=lambda x: x["tokens_per_cpu_s"])[len(measured) // 2]
        out[k] = med
        print(
            f"| {k} | {med['tokens_s'] / 1e6:.2f} | {med['cpu_per_s']:.2f} | "
            f"{med['tokens_per_cpu_s'] / 1e6:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"runs": out, "load_average": load}, indent=1))


if __name__ == "__main__":
    main()
