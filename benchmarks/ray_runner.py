"""Ray runner benchmark: the multimodal pipeline (decode + resize + tokenize + pack) on the
thread runner, on Ray with a local one-node cluster, and on Ray with a two-node cluster
started on this machine (``ray start --head`` + ``ray start``; the same CPUs in total).

Every run produces the same global batches (checked: digests of the first steps); the numbers
show what the Ray transport and scheduling cost on one machine, where a second node adds no
CPUs. On a real cluster the second node brings its own cores. Prints a Markdown table (and
``--json``).

Usage::

    python -m benchmarks.ray_runner [--seconds 10] [--rounds 3] [--workers 2] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.corpus import default_root
from benchmarks.multimodal import Result, _timed, _zephon_count, make_data, recipe
from zephon_nodes import Pipeline, Recipe
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.verification.digest import digest_microbatches


def run(r: Recipe, runner: str, workers: int, seconds: float, name: str) -> tuple[Result, str]:
    """Time one rank owning every lane; also return the digest of its first 4 steps."""
    pipeline = Pipeline(r)
    pool = WorkerPool(workers, runner)
    try:
        node = pipeline.rank_node(1, 0, pool=pool)
        node.reset(None)
        digest = digest_microbatches([next(node) for _ in range(4)])
        node.reset(None)
        return _timed(name, node, _zephon_count, seconds), digest
    finally:
        pool.close()


def one(key: str, r: Recipe, workers: int, seconds: float) -> dict[str, Any]:
    """Run one setting (``thread``, ``ray1`` or ``ray2``) in this process."""
    if key == "thread":
        res = run(r, "thread", workers, seconds, f"thread x{workers}")
    elif key == "ray1":
        res = run(r, "ray", workers, seconds, f"ray, local cluster of 1 node ({workers} CPUs)")
    else:
        from tests.distributed.ray_cluster import LocalRayCluster

        cpus = max(1, workers // 2)
        cluster = LocalRayCluster(extra_nodes=1, cpus=cpus)
        os.environ["RAY_ADDRESS"] = cluster.address
        os.environ["RAY_AUTH_MODE"] = "disabled"
        try:
            res = run(r, "ray", workers, seconds, f"ray, 2 nodes on this machine ({cpus} CPU each)")
        finally:
            cluster.stop()
    return asdict(res[0]) | {"digest": res[1]}


def main() -> None:
    """Run the three settings in alternating rounds, each in a fresh process; print the table.

    A fresh process per run: a process that used a local Ray cluster and then joins another
    cluster bound to 127.0.0.1 gets ``OwnerDiedError`` for its own objects (Ray 2.60).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="smoke run: small data, 1 s per run")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    seconds = 1.0 if args.tiny else args.seconds
    shards, per_shard = (2, 16) if args.tiny else (8, 64)
    paths = make_data(default_root(), shards, per_shard, 128 if args.tiny else 512)
    r = recipe(paths[0].parent, 1024)
    w = args.workers
    if args.one:
        print("RESULT " + json.dumps(one(args.one, r, w, seconds)), flush=True)
        return
    results: dict[str, list[Result]] = {}
    digests: dict[str, str] = {}
    for _ in range(1 if args.tiny else args.rounds):
        for key in ("thread", "ray1", "ray2"):
            cmd = [sys.executable, "-m", "benchmarks.ray_runner", "--one", key,
                   "--seconds", str(seconds), "--workers", str(w)]  # fmt: skip
            if args.tiny:
                cmd.append("--tiny")
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not line:
                raise SystemExit(f"{key} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
            data = json.loads(line[0][7:])
            digests[key] = data.pop("digest")
            results.setdefault(key, []).append(Result(**data))
    if len(set(digests.values())) != 1:
        raise SystemExit(f"digests differ between runners: {digests}")
    load = os.getloadavg()[0]
    print(f"median of {len(results['thread'])} rounds of {seconds:g} s (load {load:.1f})\n")
    print("| pipeline | images/s | tokens/s | images/s range |")
    print("|---|---:|---:|---:|")
    report: dict[str, Any] = {"load": load, "runs": {}}
    for key, measured in results.items():
        rs = sorted(measured, key=lambda x: x.images_s)
        med = rs[len(rs) // 2]
        report["runs"][key] = asdict(med) | {"images_s": med.images_s, "tokens_s": med.tokens_s}
        print(
            f"| {med.name} | {med.images_s:,.0f} | {med.tokens_s:,.0f} | "
            f"{rs[0].images_s:,.0f}-{rs[-1].images_s:,.0f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
