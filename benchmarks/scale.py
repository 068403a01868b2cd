"""One rank of a large job (simulated): start-up, memory and checkpoint bytes per rank.

Builds ONE data-parallel rank (the last) of a job over a synthetic indexed corpus of tiny
jsonl shards and reports, per configuration:

- ``build_s``: ``Pipeline(recipe)`` plus ``rank_node`` (wall and CPU seconds);
- ``first_s``: from ``reset()`` to the first batch (wall and CPU seconds);
- ``rss_mb``: the process's RSS after the first batch, and its growth over the RSS after the
  imports (``psutil`` if installed, else ``resource.getrusage`` peak); ``anon_growth_mb``:
  the growth of its private part (``RssAnon``: not the mapped files, whose pages are the
  node's page cache shared by its ranks);
- ``state_bytes``: the rank's state file as :func:`zephon_nodes.state.files.save_state`
  writes it, and the TorchTitan DCP tensors (:func:`zephon_nodes.state.dcp.to_dcp_state`),
  in total and per lane of the rank; ``contents_bytes`` is the part of the state file that
  names every shard's content identity (``recipe.contents``, O(shards), not O(lanes)).

Each configuration runs in a fresh interpreter (so RSS is its own), twice, in a new empty
cache directory (``$ZEPHON_CACHE_DIR``): the **first start** of a rank on a node
(``first_build_s``, ``first_build_cpu_s``: it converts the dataset index into the shard
table and computes the dealing's exact token sizes, both kept in the cache directory for
the node), then a **later start** (every other rank of the node, every restart), whose
numbers are the row's. The corpus (``N`` shards of 4 records each) is generated and indexed
once (``zephon_nodes.io.index.index``, what ``zephon index`` runs) under
``~/.cache/zephon_bench/scale/<N>``, so start-up reads the index, not every shard.
The table compares every configuration to the first (the small one): the goal is start-up
and memory per rank flat (<= 1.5x) and checkpoint bytes per lane unchanged.

Usage::

    python -m benchmarks.scale                        # dp 8/256 lanes/1k shards vs 1,024/4,096/100k
    python -m benchmarks.scale --shards 1000 10000 --lanes 256 4096 --dp 8 1024 --json out.json
    python -m benchmarks.scale --smoke                # 200 shards, 64 lanes, dp 8 vs 16 (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RECORDS = 4  # records per shard
SEQ_LEN = 64


def cache_root() -> Path:
    """Where the corpora live (``$ZEPHON_BENCH_CACHE`` or ``~/.cache/zephon_bench/scale``)."""
    env = os.environ.get("ZEPHON_BENCH_CACHE")
    return Path(env) / "scale" if env else Path.home() / ".cache" / "zephon_bench" / "scale"


def _pattern(folder: Path) -> str:
    return str(folder / "*.jsonl")


def _recipe(folder: Path, lanes: int) -> Any:
    from zephon_nodes import DatasetSpec, Recipe, TokenizerSpec, WorkSpec

    return Recipe(
        datasets=(DatasetSpec("web", paths=(_pattern(folder),)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=1,
        num_lanes=lanes,
        global_batch_size=lanes,
        seq_len=SEQ_LEN,
        work=WorkSpec(chunk_size=RECORDS),
    )


def corpus(shards: int, root: Path | None = None) -> Path:
    """The folder of ``shards`` indexed shards (generated and indexed on first use)."""
    from zephon_nodes.io.index import index

    folder = (root or cache_root()) / str(shards)
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        lines = "".join(
            json.dumps({"text": f"shard {i} record {j} " + "word " * ((i + j) % 9)}) + "\n"
            for j in range(RECORDS)
        )
        (folder / f"s{i:06d}.jsonl").write_text(lines, encoding="utf-8")
    directory, manifest = index.build_index([_pattern(folder)], workers=2)
    index.write_index(manifest, str(folder / index.INDEX_NAME), directory)
    index.forget()
    done.write_text("ok\n")
    return folder


def _anon_mb() -> float:
    """This process's private (anonymous) RSS in MB; 0 where /proc is missing.

    The rest of the RSS is mapped files: libraries and the shard table's columns, whose
    pages are the node's page cache, shared by every rank of the node.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _rss_mb() -> float:
    try:
        import psutil

        return float(psutil.Process().memory_info().rss) / 2**20
    except ImportError:  # peak, in KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(folder: Path, lanes: int, dp: int) -> dict[str, Any]:
    """Build the last rank of ``dp`` over ``lanes`` lanes on ``folder``; its numbers."""
    import torch  # noqa: F401  (imported before the baseline RSS, as in a trainer)

    from zephon_nodes import Pipeline, WorkerPool
    from zephon_nodes.state.dcp import to_dcp_state
    from zephon_nodes.state.files import save_state

    base_rss, base_anon = _rss_mb(), _anon_mb()
    recipe = _recipe(folder, lanes)
    w0, c0 = time.perf_counter(), time.process_time()
    p = Pipeline(recipe)
    with WorkerPool(2, "thread") as pool:
        node = p.rank_node(dp, dp - 1, pool=pool)
        w1, c1 = time.perf_counter(), time.process_time()
        node.reset()
        node.next()
        w2, c2 = time.perf_counter(), time.process_time()
        state = node.get_state()
        node.close()
    rss, anon = _rss_mb(), _anon_mb()
    rank_lanes = lanes // dp
    with tempfile.TemporaryDirectory() as d:
        file_bytes = save_state(d, state).stat().st_size
    sd = to_dcp_state(state, dp_world_size=dp, local_batch_size=recipe.global_batch_size // dp)
    dcp_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    lane_bytes = sum(t.numel() * t.element_size() for k, t in sd.items() if k.startswith("lane_"))
    return {
        "shards": int(folder.name),
        "lanes": lanes,
        "dp": dp,
        "rank_lanes": rank_lanes,
        "build_s": round(w1 - w0, 4),
        "build_cpu_s": round(c1 - c0, 4),
        "first_s": round(w2 - w1, 4),
        "first_cpu_s": round(c2 - c1, 4),
        "rss_mb": round(rss, 1),
        "rss_growth_mb": round(rss - base_rss, 1),
        "anon_growth_mb": round(anon - base_anon, 1),
        "file_bytes": file_bytes,
        "file_bytes_per_lane": round(file_bytes / rank_lanes, 1),
        "contents_bytes": len(
            json.dumps(state.get("recipe", {}).get("contents", {}), separators=(",", ":"))
        ),
        "lanes_json_per_lane": round(len(json.dumps(state["lanes"])) / rank_lanes, 1),
        "dcp_bytes": dcp_bytes,
        "dcp_lane_bytes_per_lane": lane_bytes / rank_lanes,
    }


def run_one(folder: Path, lanes: int, dp: int, cache: str) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter (its own RSS), cache directory ``cache``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), *sys.path]))}
    env["ZEPHON_CACHE_DIR"] = cache
    cmd = [sys.executable, "-m", "benchmarks.scale", "--one", str(folder), str(lanes), str(dp)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


GROWN = {
    "first_build_cpu_s": "first start",
    "build_cpu_s": "later start",
    "first_cpu_s": "first batch",
    "rss_growth_mb": "RSS",
    "anon_growth_mb": "private RSS",
    "dcp_lane_bytes_per_lane": "DCP per lane",
}


def run_inline(folder: Path, lanes: int, dp: int, cache: str) -> dict[str, Any]:
    """:func:`measure` in this interpreter, cache directory ``cache`` (RSS accumulates)."""
    before = os.environ.get("ZEPHON_CACHE_DIR")
    os.environ["ZEPHON_CACHE_DIR"] = cache
    try:
        return measure(folder, lanes, dp)
    finally:
        if before is None:
            os.environ.pop("ZEPHON_CACHE_DIR", None)
        else:
            os.environ["ZEPHON_CACHE_DIR"] = before


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per configuration, growth against the first."""
    head = (
        "| shards | lanes | dp | rank lanes | first start: build s (CPU s) | later start: build s "
        "(CPU s) | first batch s (CPU s) | RSS MB (growth; private growth) | state file B (shard "
        "contents B) "
        "| DCP B (lane B per lane) | growth vs first |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    first = rows[0]
    lines = []
    for r in rows:
        growth = ", ".join(f"{name} {r[k] / max(first[k], 1e-9):.2f}x" for k, name in GROWN.items())
        lines.append(
            f"| {r['shards']:,} | {r['lanes']:,} | {r['dp']:,} | {r['rank_lanes']} "
            f"| {r['first_build_s']} ({r['first_build_cpu_s']}) "
            f"| {r['build_s']} ({r['build_cpu_s']}) | {r['first_s']} ({r['first_cpu_s']}) "
            f"| {r['rss_mb']} ({r['rss_growth_mb']}; {r['anon_growth_mb']}) | {r['file_bytes']:,} "
            f"({r['contents_bytes']:,}) | {r['dcp_bytes']:,} ({r['dcp_lane_bytes_per_lane']}) "
            f"| {growth} |"
        )
    return head + "\n".join(lines)


def _configs(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    if args.smoke:
        return [(200, 64, 8), (200, 64, 16)]
    n = max(len(args.shards), len(args.lanes), len(args.dp))
    pick = lambda xs, i: xs[min(i, len(xs) - 1)]  # noqa: E731
    return [(pick(args.shards, i), pick(args.lanes, i), pick(args.dp, i)) for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[1_000, 100_000])
    ap.add_argument("--lanes", type=int, nargs="+", default=[256, 4_096])
    ap.add_argument("--dp", type=int, nargs="+", default=[8, 1_024])
    ap.add_argument("--smoke", action="store_true", help="200 shards, 64 lanes, dp 8 vs 16")
    ap.add_argument("--root", default=None, help="corpus cache (default: cache_root())")
    ap.add_argument("--json", default=None, help="write the results here ('-': stdout)")
    ap.add_argument(
        "--inline",
        action="store_true",
        help="measure in this interpreter (faster; RSS then accumulates across rows)",
    )
    ap.add_argument("--one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(Path(args.one[0]), int(args.one[1]), int(args.one[2]))))
        return 0
    root = Path(args.root) if args.root else None
    for s, lanes, _ in _configs(args):
        if s < lanes:
            ap.error(f"{s} shards for {lanes} lanes: each lane needs a shard (a work item)")
    one = run_inline if args.inline else run_one
    rows = []
    for s, lanes, dp in _configs(args):
        folder = corpus(s, root)
        with tempfile.TemporaryDirectory(prefix="zephon-scale-cache-") as cache:
            first = one(folder, lanes, dp, cache)  # the node's first start
            later = one(folder, lanes, dp, cache)
        rows.append(
            {
                **later,
                "first_build_s": first["build_s"],
                "first_build_cpu_s": first["build_cpu_s"],
                "first_rss_mb": first["rss_mb"],
            }
        )
    res = {"load": os.getloadavg()[0], "rows": rows}
    if args.json == "-":
        json.dump(res, sys.stdout, indent=1)
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1), encoding="utf-8")
    print(table(rows))
    print(f"load {res['load']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
