"""Storage benchmarks: start-up with and without a dataset index, S3 vs local throughput.

1. Time to the first global batch (imports excluded) over N tiny local shards, with a dataset
   index (`zephon index`, built beforehand and not timed) and without one (every shard read
   and hashed), for N = 1,000, 10,000 and 100,000 (``--quick``: 20 and 60). Target: the
   indexed time at 100,000 shards at most 1.5x the time at 1,000 (best of 3 builds; the
   first build on a machine, which converts the index into cached columns, is reported
   apart).
2. Text throughput (tokens/s) of the same recipe over the same shards from a local S3 server
   (moto, on 127.0.0.1) and from local disk, in the same run, alternating, best of
   ``--repeats``. Target: S3 at least 0.9x local.

    python -m benchmarks.storage [--quick] [--json OUT] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec, simulate
from zephon_nodes.io.index import index as index_mod
from zephon_nodes.io.storage import storage

__all__ = ["main"]


def tiny_shards(root: Path, n: int) -> None:
    """``n`` shards of two short records each, in subfolders of 1,000."""
    for k in range(n):
        d = root / f"{k // 1000:03d}"
        if k % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"s{k:06d}.jsonl").write_text(
            f'{{"text": "shard {k} first record"}}\n{{"text": "shard {k} second"}}\n'
        )


def recipe(paths: list[str], seq_len: int = 64, chunk_size: int = 2) -> Recipe:
    """A byte-tokenizer recipe over ``paths``."""
    return Recipe(
        datasets=(DatasetSpec("web", paths=tuple(paths)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=1,
        num_lanes=8,
        global_batch_size=16,
        seq_len=seq_len,
        flush_every=4,
        # Round-robin: the start-up measured is the index's, not balanced dealing's sizing of
        # every work item (benchmarks/end_of_data.py measures that).
        work=WorkSpec(chunk_size=chunk_size, deal="round_robin"),
    )


def first_batch_s(r: Recipe, no_index: bool, cpu: list[float] | None = None) -> float:
    """Seconds from building the pipeline to the first global batch (dp 1).

    ``cpu`` (optional) receives the CPU seconds of this process (all its threads) over the
    same span: less sensitive than wall time to other jobs on a shared machine.
    """
    index_mod.forget()
    if no_index:
        os.environ["ZEPHON_NO_INDEX"] = "1"
    try:
        c = time.process_time()
        t = time.perf_counter()
        next(simulate(Pipeline(r), 1, 1, num_workers=2))
        if cpu is not None:
            cpu.append(time.process_time() - c)
        return time.perf_counter() - t
    finally:
        os.environ.pop("ZEPHON_NO_INDEX", None)


def startup(root: Path, sizes: list[int], no_index_max: int) -> dict[str, Any]:
    """Time to first batch with and without an index for each shard count."""
    out: dict[str, Any] = {}
    for n in sizes:
        d = root / f"startup-{n}"
        tiny_shards(d, n)
        r = recipe([str(d / "*" / "*.jsonl")])
        cache = Path(tempfile.mkdtemp(prefix="zc-bench-"))
        old = os.environ.get("ZEPHON_CACHE_DIR")
        os.environ["ZEPHON_CACHE_DIR"] = str(cache)
        try:
            # Cold machine without an index: every shard read, hashed and indexed (skipped
            # above --no-index-max shards: minutes at 100,000).
            no_index_cold = no_index_warm = None
            if n <= no_index_max:
                no_index_cold = first_batch_s(r, no_index=True)
                no_index_warm = first_batch_s(r, no_index=True)
            t = time.perf_counter()
            directory, manifest = index_mod.build_index([str(d / "*" / "*.jsonl")], workers=8)
            build = time.perf_counter() - t
            index_mod.write_index(manifest, str(Path(directory) / index_mod.INDEX_NAME))
            shutil.rmtree(cache)
            cache.mkdir()
            # The first build on a machine converts the index into cached columns (once).
            indexed_cold = first_batch_s(r, no_index=False)
            cpu: list[float] = []
            indexed = min(first_batch_s(r, no_index=False, cpu=cpu) for _ in range(3))
        finally:
            if old is None:
                os.environ.pop("ZEPHON_CACHE_DIR", None)
            else:
                os.environ["ZEPHON_CACHE_DIR"] = old
            shutil.rmtree(cache, ignore_errors=True)
        out[str(n)] = {
            "indexed_first_batch_s": round(indexed, 3),
            "indexed_cold_first_batch_s": round(indexed_cold, 3),
            "indexed_first_batch_cpu_s": round(min(cpu), 4),
            "no_index_cold_first_batch_s": _round(no_index_cold),
            "no_index_warm_first_batch_s": _round(no_index_warm),
            "index_build_s": round(build, 3),
        }
        print(
            f"{n:>7} shards: first batch {indexed:.3f} s with an index (CPU {min(cpu):.4f} s; "
            f"{indexed_cold:.2f} s "
            f"the first time on this machine), "
            f"{_round(no_index_cold)} s without (cold), {_round(no_index_warm)} s (warm "
            f"cache); zephon index {build:.2f} s",
            file=sys.stderr,
        )
        shutil.rmtree(d)
    lo, hi = str(sizes[0]), str(sizes[-1])
    ratio = out[hi]["indexed_first_batch_s"] / max(out[lo]["indexed_first_batch_s"], 1e-9)
    cpu_ratio = out[hi]["indexed_first_batch_cpu_s"] / max(
        out[lo]["indexed_first_batch_cpu_s"], 1e-9
    )
    return {
        "shards": out,
        f"ratio_{hi}_over_{lo}": round(ratio, 2),
        f"cpu_ratio_{hi}_over_{lo}": round(cpu_ratio, 2),
        "target_ratio": 1.5,
        "load_average": round(os.getloadavg()[0], 2),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def throughput(root: Path, shards: int, records: int, steps: int, repeats: int) -> dict[str, Any]:
    """Tokens/s of one recipe from local disk and from a local S3 server."""
    import boto3

    d = root / "throughput"
    d.mkdir(parents=True)
    text = "the quick brown fox jumps over the lazy dog " * 20
    for k in range(shards):
        with open(d / f"part-{k:03d}.jsonl", "w") as f:
            for i in range(records):
                f.write(json.dumps({"text": f"{k} {i} {text}"}) + "\n")
    port = _free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage._forget_filesystems()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        client.create_bucket(Bucket="bench")
        for p in sorted(d.iterdir()):
            client.upload_file(str(p), "bench", f"t/{p.name}")
        recipes = {
            "local": recipe([str(d / "*.jsonl")], seq_len=512, chunk_size=16),
            "s3": recipe(["s3://bench/t/*.jsonl"], seq_len=512, chunk_size=16),
        }
        best: dict[str, float] = {}
        for _ in range(repeats):
            for name, r in recipes.items():
                pipeline = Pipeline(r)  # built (and the S3 copy indexed) outside the timing
                t = time.perf_counter()
                tokens = sum(x.tokens for x, _ in simulate(pipeline, 2, steps, num_workers=2))
                rate = tokens / (time.perf_counter() - t)
                best[name] = max(best.get(name, 0.0), rate)
        ratio = best["s3"] / best["local"]
        print(
            f"throughput: local {best['local']:,.0f} tokens/s, S3 {best['s3']:,.0f} tokens/s "
            f"({ratio:.2f}x)",
            file=sys.stderr,
        )
        return {
            "tokens_per_s": {k: round(v) for k, v in best.items()},
            "s3_over_local": round(ratio, 3),
            "target": 0.9,
            "corpus_bytes": sum(p.stat().st_size for p in d.iterdir()),
            "steps": steps,
        }
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        storage._forget_filesystems()
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; print a table and optionally write JSON."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.storage", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--root", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=None, help="throughput repeats")
    ap.add_argument("--sizes", default=None, help="comma-separated shard counts (default: by mode)")
    ap.add_argument(
        "--no-index-max",
        type=int,
        default=10000,
        help="largest shard count also timed without an index (default 10000)",
    )
    args = ap.parse_args(argv)
    root = Path(args.root or tempfile.mkdtemp(prefix="zephon-bench-storage-"))
    root.mkdir(parents=True, exist_ok=True)
    sizes = [20, 60] if args.quick else [1000, 10000, 100000]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    result: dict[str, Any] = {
        "quick": args.quick,
        "startup": startup(root, sizes, args.no_index_max),
    }
    if args.quick:
        result["throughput"] = throughput(root, 2, 100, 2, args.repeats or 1)
    else:
        result["throughput"] = throughput(root, 16, 2000, 60, args.repeats or 3)
    s = result["startup"]
    t = result["throughput"]
    print(
        f"| first batch ratio {sizes[-1]}/{sizes[0]} shards (indexed) | "
        f"{s[f'ratio_{sizes[-1]}_over_{sizes[0]}']} (target <= 1.5) |\n"
        f"| S3 / local throughput | {t['s3_over_local']} (target >= 0.9) |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
