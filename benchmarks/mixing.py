"""Mixing benchmark: token shares vs weights, scheduled shares, padding per packing mode,
and the throughput cost of mixing. Prints Markdown tables.

Usage::

    python -m benchmarks.mixing            # full run (a few minutes on 2 cores)
    python -m benchmarks.mixing --tiny     # smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from zephon_nodes import DatasetSpec, Pipeline, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.recipe import MixtureSpec, PackSpec
from zephon_nodes.verification.simulate import simulate

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "from",
    "at",
    "an",
    "which",
    "not",
    "data",
    "lane",
    "flush",
    "token",
    "mixture",
    "packing",
    "shard",
    "record",
    "worker",
    "rank",
    "step",
    "batch",
    "window",
    "seed",
    "def",
    "return",
    "import",
    "class",
    "self",
    "value",
    "index",
    "list",
    "dict",
    "yield",
    "lambda",
    "print",
    "range",
    "len",
]

# name -> (documents, min words, max words, records per work item): short "code",
# medium "web", long "books"; "web2"/"web3" are more of "web" (the throughput baseline).
DATASETS = {
    "web": (3000, 40, 400, 16),
    "code": (6000, 5, 60, 64),
    "books": (300, 1500, 5000, 1),
}
COPIES = {"web2": (3000, 40, 400, 16), "web3": (3000, 40, 400, 16)}


def write_corpus(root: Path, scale: float) -> None:
    rng = random.Random(0)
    for name, (n, lo, hi, _) in {**DATASETS, **COPIES}.items():
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(max(20, int(n * scale))):
                words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
                f.write(json.dumps({"text": " ".join(words)}) + "\n")


def recipe(root: Path, names: list[str], weights: list[float], **kw: object) -> Recipe:
    chunks = {n: c for n, (*_, c) in {**DATASETS, **COPIES}.items()}
    datasets = tuple(
        DatasetSpec(
            n,
            paths=(f"{n}.jsonl",),
            base_dir=root,
            weight=w,
            on_exhausted="repeat",
            chunk_size=chunks[n],
        )
        for n, w in zip(names, weights, strict=True)
    )
    args: dict[str, object] = {
        "datasets": datasets,
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 1,
        "num_lanes": 8,
        "global_batch_size": 32,
        "seq_len": 1024,
        "flush_every": 8,
        "work": WorkSpec(chunk_size=16, epochs=1),
        "shuffle": ShuffleSpec(16),
    }
    args.update(kw)
    return Recipe(**args)  # type: ignore[arg-type]


def dynamic_recipe(root: Path) -> Recipe:
    """web + code 0.5/0.5, seq_len 1024, 64 rows per step over 8 lanes, 4 records per item."""
    r = recipe(
        root,
        ["web", "code"],
        [0.5, 0.5],
        seq_len=1024,
        global_batch_size=64,
        flush_every=4,
        work=WorkSpec(chunk_size=4, epochs=1),
    )
    return replace(r, datasets=tuple(replace(d, chunk_size=4) for d in r.datasets))


def dynamic(root: Path, steps: int, window: int = 2, decide_at: int = 6) -> dict[str, object]:
    """Shares per window after a decision web/code 0.5/0.5 -> 0.2/0.8 (dynamic mixture)."""
    stats = compute_stats(
        dynamic_recipe(root),
        steps,
        2,
        mixture_updates=[(decide_at, {"web": 0.2, "code": 0.8})],
        window_steps=window,
    )
    windows = stats["token_shares_per_window"]
    print(f"\n### Dynamic mixture: web 0.5 -> 0.2 after step {decide_at} ({window}-step windows)\n")
    print("| steps | weights in force (web) | measured web share |")
    print("|---|---|---|")
    for w in windows[: decide_at // window + 4]:
        a, b = w["steps"]
        print(f"| {a}-{b} | {w['weights']['web']:.2f} | {w['token_shares']['web']:.4f} |")
    out: dict[str, object] = {"steps": steps, "window_steps": window, "decide_at": decide_at}
    for skip in range(4):
        first = decide_at // window + skip
        follow = [w["token_shares"]["web"] for w in windows[first : first + 50]]
        if not follow:
            break
        mean = statistics.fmean(follow)
        dev = max(abs(x - 0.2) for x in follow)
        print(
            f"- {len(follow)} windows from step {windows[first]['steps'][0]}: mean web share "
            f"{mean:.4f} (target 0.2), largest single-window deviation {dev:.3f}"
        )
        out[f"from_step_{windows[first]['steps'][0]}"] = {
            "windows": len(follow),
            "mean": round(mean, 4),
            "max_window_deviation": round(dev, 3),
        }
    return out


def token_shares(root: Path, steps: int) -> None:
    weights = [0.5, 0.3, 0.2]
    names = list(DATASETS)
    stats = compute_stats(recipe(root, names, weights), steps)
    print(f"\n### Static mixture ({steps} steps, {stats['tokens']:,} non-padding tokens)\n")
    print("| dataset | weight | token share | document share |")
    print("|---|---|---|---|")
    for n, w in zip(names, weights, strict=True):
        print(
            f"| {n} | {w:.2f} | {stats['token_shares'][n]:.4f} | "
            f"{stats['document_shares'][n]:.4f} |"
        )


def scheduled(root: Path, steps: int) -> None:
    half = steps // 2
    schedule = ((0, {"web": 0.8, "code": 0.2}), (half, {"web": 0.2, "code": 0.8}))
    r = recipe(root, ["web", "code"], [1, 1], mixture=MixtureSpec(schedule=schedule, block=64))
    pipeline = Pipeline(r, provenance=True)
    window = max(1, steps // 8)
    print(f"\n### Scheduled mixture: web 0.8 -> 0.2 over {half} steps, then held\n")
    print("| steps | scheduled web share (window middle) | measured web share |")
    print("|---|---|---|")
    counts = [0, 0]
    start = 0
    for result, mbs in simulate(pipeline, 1, steps, keep_batches=True):
        for mb in mbs or []:
            real = mb["labels"] != -100
            for d in (0, 1):
                counts[d] += int(((mb["dataset_ids"] == d) & real).sum())
        if result.step % window == 0:
            middle = (start + result.step) / 2
            want = 0.8 - 0.6 * min(middle / half, 1.0)
            print(f"| {start + 1}-{result.step} | {want:.3f} | {counts[0] / sum(counts):.4f} |")
            counts, start = [0, 0], result.step


def padding(root: Path, steps: int) -> None:
    print(f"\n### Padding per packing mode (web + code + books, {steps} steps, flush_every 8)\n")
    print("| seq_len | concat | best-fit 4 bins | best-fit 16 bins | best-fit 64 bins |")
    print("|---|---|---|---|---|")
    names, weights = list(DATASETS), [0.5, 0.3, 0.2]
    for seq_len in (512, 2048):
        row = []
        for pack in (
            PackSpec("concat"),
            PackSpec("bestfit", bins=4),
            PackSpec("bestfit", bins=16),
            PackSpec("bestfit", bins=64),
        ):
            r = recipe(root, names, weights, seq_len=seq_len, pack=pack)
            row.append(compute_stats(r, steps)["padding_fraction"])
        print(f"| {seq_len} | " + " | ".join(f"{x:.4f}" for x in row) + " |")


def throughput(root: Path, steps: int, rounds: int) -> None:
    # The same kind of documents either as one dataset or as a 3-way mixture of copies: the
    # difference is the cost of mixing (plan + per-dataset permutations), not of the data.
    single = recipe(root, ["web"], [1.0])
    mixed = recipe(root, ["web", "web2", "web3"], [0.4, 0.3, 0.3])
    bestfit = replace(single, pack=PackSpec("bestfit", bins=16))
    runs: dict[str, list[float]] = {"single": [], "mixed": [], "single+bestfit": []}
    pipelines = {}
    for name, r in zip(runs, (single, mixed, bestfit), strict=True):
        t0 = time.perf_counter()
        pipelines[name] = Pipeline(r)
        build = time.perf_counter() - t0
        print(f"- Pipeline({name}) built in {build:.2f} s (mixtures: token estimate included)")
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, p in pipelines.items():  # alternate, so load changes hit all alike
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = sum(res.tokens for res, _ in simulate(p, 1, steps, num_workers=2))
            runs[name].append(tokens / (time.perf_counter() - t0))
            cpu[name].append((time.process_time() - c0) / tokens * 1e6)
    print(f"\n### Throughput (dp 1, 2 threads, {steps} steps, median of {rounds})\n")
    print("single: web alone; mixed: web + web2 + web3 (same kind of documents) at 0.4/0.3/0.3\n")
    print("| recipe | tokens/s (wall) | vs single | CPU s per 1M tokens | vs single |")
    print("|---|---|---|---|---|")
    base = statistics.median(runs["single"])
    base_cpu = statistics.median(cpu["single"])
    for name, values in runs.items():
        m, c = statistics.median(values), statistics.median(cpu[name])
        print(f"| {name} | {m:,.0f} | {m / base:.2f}x | {c:.3f} | {c / base_cpu:.2f}x |")
    print("\n| work source | microseconds per work(lane, i) |\n|---|---|")
    for name in ("single", "mixed"):
        ws = pipelines[name].work_source
        t0 = time.perf_counter()
        n = 20_000
        for i in range(n):
            ws.work(i % 8, i // 8)
        print(f"| {type(ws).__name__} | {(time.perf_counter() - t0) / n * 1e6:.1f} |")


def main() -> None:
    """Run every section."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="small smoke run")
    parser.add_argument(
        "--only", choices=["shares", "dynamic", "padding", "throughput"], default=None
    )
    args = parser.parse_args()
    scale, steps, rounds = (0.05, 6, 1) if args.tiny else (1.0, 400, 5)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        write_corpus(root, scale)
        if args.only in (None, "shares"):
            token_shares(root, steps)
            scheduled(root, steps // 2)
        if args.only in (None, "dynamic"):
            result = dynamic(root, 20 if args.tiny else 110)
            print(json.dumps({"dynamic": result}))
        if args.only in (None, "padding"):
            padding(root, max(4, steps // 8))
        if args.only in (None, "throughput"):
            throughput(root, max(4, steps // 2), rounds)


if __name__ == "__main__":
    main()
