"""Node cache benchmark: bytes fetched per byte trained, exact-future eviction vs LRU.

One recipe over a corpus of whole-file shards read through the node cache
(:func:`zephon_nodes.testing.nodecache.through_node_cache`, the way remote or single-frame
``.zst`` shards are read), run to the end with a cache of 10% of the corpus, once per policy
on the same run:

- ``belady+prefetch``: evict the shard needed farthest in the future, prefetch the next ones;
- ``belady``: the same without the prefetcher;
- ``lru``: least recently used (what a loader without the future can do).

For each: bytes fetched per byte trained (every record is trained once, so 1.0 is the floor
for an unbounded cache and ``items per shard`` is what a cache-less whole-file reader pays),
fetches, hits, evictions, the peak cache bytes (sampled on disk every millisecond) against the
limit, wall time, and whether the digests equal the cache-less run's. ``offline`` replays the
planned access sequence (lanes round-robin) through a textbook Belady and LRU simulation for
reference.

Usage::

    python -m benchmarks.cache --json out.json          # 240 shards, a few minutes
    python -m benchmarks.cache --quick --json out.json  # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.io.nodecache.future import AccessPlan
from zephon_nodes.io.nodecache.nodecache import PREFETCH_ENV, node_cache, set_cache_limit
from zephon_nodes.testing.nodecache import CachedCopyShard, through_node_cache
from zephon_nodes.verification.simulate import simulate

WORDS = [
    *("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on"),
    *("be", "by", "at", "this", "from", "or", "which", "an", "are", "not", "data", "model"),
    *("token", "batch", "lane", "shard", "cache", "future", "eviction", "prefetch", "node"),
]

POLICIES = ("belady+prefetch", "belady", "lru")


def write_corpus(root: Path, shards: int, records: int, seed: int = 0) -> int:
    """Write ``shards`` jsonl shards of ``records`` records of varied length; return bytes."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for s in range(shards):
        lines = []
        for _ in range(records):
            n = rng.randint(20, 120)
            lines.append(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(n))}))
        blob = ("\n".join(lines) + "\n").encode()
        (root / f"shard-{s:05d}.jsonl").write_bytes(blob)
        total += len(blob)
    return total


def make_recipe(data: Path, chunk_size: int) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("corpus", paths=(str(data / "*.jsonl"),)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=11,
        num_lanes=8,
        global_batch_size=16,
        seq_len=256,
        flush_every=4,
        work=WorkSpec(chunk_size=chunk_size, epochs=1),
    )


class DiskSampler:
    """Samples the bytes in the cache directory (entries and partial fetches) every ms."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.samples = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            total = 0
            # Under the cache's own lock: a scan of data/ and part/ that a rename or an
            # eviction crosses would count one entry twice (or a freed and a new one at once).
            with self._locked():
                for sub in ("data", "part"):
                    with contextlib.suppress(FileNotFoundError):
                        for e in os.scandir(self.root / sub):
                            with contextlib.suppress(FileNotFoundError):
                                total += e.stat().st_size
            self.peak = max(self.peak, total)
            self.samples += 1

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            fd = os.open(self.root / ".lock", os.O_RDWR)
        except FileNotFoundError:  # no cache yet: nothing to count
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def offline(seq: list[tuple[str, int]], limit: int) -> dict[str, int]:
    """Bytes fetched by textbook Belady (farthest next use) and LRU on a known sequence."""
    nxt: list[int] = [0] * len(seq)
    last: dict[str, int] = {}
    for t in range(len(seq) - 1, -1, -1):
        nxt[t] = last.get(seq[t][0], len(seq))
        last[seq[t][0]] = t
    out = {}
    held: dict[str, int] = {}
    next_use: dict[str, int] = {}
    fetched = 0
    for t, (key, size) in enumerate(seq):
        if key not in held:
            fetched += size
            while sum(held.values()) + size > limit and held:
                victim = max(held, key=lambda k: (next_use[k], k))
                del held[victim]
            held[key] = size
        next_use[key] = nxt[t]
    out["belady"] = fetched
    lru: OrderedDict[str, int] = OrderedDict()
    fetched = 0
    for key, size in seq:
        if key in lru:
            lru.move_to_end(key)
            continue
        fetched += size
        while sum(lru.values()) + size > limit and lru:
            lru.popitem(last=False)
        lru[key] = size
    out["lru"] = fetched
    return out


def planned_sequence(pipeline: Pipeline) -> list[tuple[str, int]]:
    """The whole run's cached-shard accesses as the lanes' plan orders them."""
    plan = AccessPlan(pipeline.work_source, horizon=10**9)
    plan.update(dict.fromkeys(range(pipeline.num_lanes), 0))
    seq = []
    for item, _ in plan.items():
        shard = item.shard
        if isinstance(shard, CachedCopyShard):
            seq.append((shard.cache_key, shard.cache_size))
    return seq


def run_policy(
    base: Pipeline,
    policy: str,
    limit: int,
    cache_root: Path,
    world: int,
    workers: int,
    latency_s: float,
) -> tuple[list[str], dict[str, Any]]:
    os.environ["ZEPHON_CACHE_DIR"] = str(cache_root)
    prefetch = 4 if policy == "belady+prefetch" else 0
    set_cache_limit(limit, "lru" if policy == "lru" else "belady", prefetch)
    pipeline = through_node_cache(base, latency_s=latency_s)
    cache = node_cache()
    assert cache is not None
    sampler = DiskSampler(cache_root / "node")
    t0 = time.perf_counter()
    try:
        digests = [r.digest for r, _ in simulate(pipeline, world, 10**9, num_workers=workers)]
    finally:
        sampler.stop()
    wall = time.perf_counter() - t0
    stats = cache.stats()
    cache.close()
    set_cache_limit(None)
    return digests, {
        **stats,
        "wall_s": round(wall, 3),
        "sampled_peak_bytes": sampler.peak,
        "samples": sampler.samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: a small corpus")
    parser.add_argument("--shards", type=int, default=None, help="number of shards")
    parser.add_argument("--fraction", type=float, default=0.10, help="cache limit / corpus")
    parser.add_argument("--dp", type=int, default=2, help="simulated ranks")
    parser.add_argument("--workers", type=int, default=2, help="pool workers")
    parser.add_argument(
        "--latency-ms", type=float, default=None, help="delay per fetch (default 20; quick 2)"
    )
    parser.add_argument("--root", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    shards = args.shards or (40 if args.quick else 240)
    records, chunk = (24, 4) if args.quick else (48, 4)
    latency_ms = args.latency_ms if args.latency_ms is not None else (2.0 if args.quick else 20.0)
    saved_env = {
        k: os.environ.get(k)
        for k in ("ZEPHON_CACHE_DIR", "ZEPHON_CACHE_LIMIT", "ZEPHON_CACHE_POLICY", PREFETCH_ENV)
    }
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="zephon-cache-bench-"))
    try:
        corpus = write_corpus(root / "data", shards, records)
        limit = int(corpus * args.fraction)
        os.environ["ZEPHON_CACHE_DIR"] = str(root / "index-cache")
        set_cache_limit(None)
        base = Pipeline(make_recipe(root / "data", chunk))
        reference = [r.digest for r, _ in simulate(base, args.dp, 10**9, num_workers=args.workers)]
        seq = planned_sequence(through_node_cache(base))
        trained = corpus  # one epoch: every record is trained once
        result: dict[str, Any] = {
            "shards": shards,
            "records_per_shard": records,
            "items_per_shard": -(-records // chunk),
            "corpus_bytes": corpus,
            "limit_bytes": limit,
            "fraction": args.fraction,
            "dp_world_size": args.dp,
            "num_workers": args.workers,
            "fetch_latency_ms": latency_ms,
            "steps": len(reference),
            "accesses": len(seq),
            "runs": {},
        }
        off = offline(seq, limit)
        result["offline_planned_sequence"] = {
            k: {"bytes_fetched": v, "fetched_per_trained": round(v / trained, 4)}
            for k, v in off.items()
        }
        for policy in POLICIES:
            digests, stats = run_policy(
                base,
                policy,
                limit,
                root / f"cache-{policy}",
                args.dp,
                args.workers,
                latency_ms / 1000,
            )
            stats["fetched_per_trained"] = round(stats["bytes_fetched"] / trained, 4)
            stats["digests_equal"] = digests == reference
            stats["peak_within_limit"] = max(stats["sampled_peak_bytes"], stats["peak_bytes"]) <= (
                limit
            )
            result["runs"][policy] = stats
        lru = result["runs"]["lru"]["bytes_fetched"]
        result["lru_over_belady_prefetch"] = round(
            lru / max(result["runs"]["belady+prefetch"]["bytes_fetched"], 1), 3
        )
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    print("| policy | fetched/trained | fetches | hits | evictions | peak / limit | wall s |")
    print("|---|---|---|---|---|---|---|")
    for policy, s in result["runs"].items():
        peak = max(s["sampled_peak_bytes"], s["peak_bytes"])
        print(
            f"| {policy} | {s['fetched_per_trained']} | {s['fetches']} | {s['hits']} | "
            f"{s['evictions']} | {peak} / {limit} | {s['wall_s']} |"
        )
    for name, v in result["offline_planned_sequence"].items():
        print(f"| offline {name} (planned order) | {v['fetched_per_trained']} | | | | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
