"""The files a restore crosses: library modules entered from ``reset(state)`` to the first batch.

Issue 32 asks that the restore path (a checkpoint's state to the first batch) cross at most
half the files it crossed when the issue was filed. This counts it, for four kinds of state
(plain, after a planned stage, amended, re-laned 4 -> 8), on a tiny corpus written to a
temporary folder (three jsonl datasets, the ``bytes`` tokenizer, one worker thread):

* ``all``: the ``zephon_nodes`` files whose functions are entered (``sys.setprofile`` and
  ``threading.setprofile`` "call" events) over ``node.reset(state); next(node)`` by the calling
  thread and the threads started inside the window (the restore threads that replay the lanes);
  the pool's workers are not counted (they run the operators, the same for a fresh start);
* ``fresh``: the same over ``node.reset(None); next(node)`` on a node of the same pipeline;
* ``restore``: the files in ``all`` and not in ``fresh``: what restoring adds to a first batch;
* ``climbs``: the calls over ``all`` from a module into one that imports it (directly or not,
  by the import graph of ``grimp``, import-linter's): a call back up through an object or a
  function handed down, the "climbs back up" issue 32 counted.

Pipelines, nodes and states are built before the counted window. Usage::

    python -m benchmarks.restore_path            # a table
    python -m benchmarks.restore_path --json     # one JSON object per kind, with the files
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import grimp

import zephon_nodes
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

PACKAGE = str(Path(zephon_nodes.__file__).parent)


def _corpus(root: Path) -> None:
    """Datasets a, b and c: one shard of 300 short documents each."""
    for name in "abc":
        (root / name).mkdir(parents=True, exist_ok=True)
        lines = (json.dumps({"text": f"{name} doc {i} " + "w " * (i % 40)}) for i in range(300))
        (root / name / "s.jsonl").write_text("\n".join(lines) + "\n")


def _recipe(root: Path, names: str = "ab", **top: Any) -> Recipe:
    raw: dict[str, Any] = {
        "seed": 7,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 32,
        "flush_every": 2,
        "tokenizer": {"kind": "bytes"},
        "datasets": [{"name": n, "paths": [f"{n}/*.jsonl"], "weight": 1.0} for n in names],
        "work": {"chunk_size": 4, "epochs": "inf"},
        **top,
    }
    return Recipe.from_dict(raw, base_dir=root)


def _module(path: str) -> str:
    """``zephon_nodes/engine/relane/__init__.py`` -> ``zephon_nodes.engine.relane``."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def entered(call: Callable[[], Any]) -> tuple[set[str], set[tuple[str, str]]]:
    """The package files entered during ``call()`` and the calls between them (caller, callee).

    Counted on the calling thread and on threads started during the call, except the pool's
    workers (``zephon-worker-k``).
    """
    files: set[str] = set()
    calls: set[tuple[str, str]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or threading.current_thread().name.startswith("zephon-worker"):
            return
        name = frame.f_code.co_filename
        if not name.startswith(PACKAGE):
            return
        callee = "zephon_nodes" + name[len(PACKAGE) :]
        files.add(callee)
        back = frame.f_back
        while back is not None and not back.f_code.co_filename.startswith(PACKAGE):
            back = back.f_back  # through the standard library (functools, threading, torchdata)
        if back is not None and back.f_code.co_filename != name:
            calls.add(("zephon_nodes" + back.f_code.co_filename[len(PACKAGE) :], callee))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return files, calls


def climbs(calls: set[tuple[str, str]]) -> list[str]:
    """The calls from a module into one that imports it (``caller -> callee``, modules)."""
    graph = grimp.build_graph("zephon_nodes")  # import-linter's graph (a test dependency)
    out = set()
    for caller, callee in calls:
        a, b = _module(caller), _module(callee)
        if graph.chain_exists(importer=b, imported=a):
            out.add(f"{a.removeprefix('zephon_nodes.')} -> {b.removeprefix('zephon_nodes.')}")
    return sorted(out)


def _saved(pipeline: Pipeline, steps: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    with WorkerPool(1, "thread") as pool:
        for _ in simulate(pipeline, 1, steps, pool=pool, save_at=steps, on_save=out.append):
            pass
    return out[0]


def _first_batch(node: Any, state: dict[str, Any] | None) -> None:
    node.reset(state)
    next(node)


def count(kind: str, pipeline: Pipeline, state: dict[str, Any]) -> dict[str, Any]:
    """Files entered by a fresh first batch and by a restore's, on nodes of ``pipeline``."""
    lanes = list(range(pipeline.recipe.num_lanes))
    with WorkerPool(1, "thread") as pool:
        fresh_node = pipeline.rank_node(lanes=lanes, pool=pool)
        fresh, _ = entered(lambda: _first_batch(fresh_node, None))
        fresh_node.close()
        node = pipeline.rank_node(lanes=lanes, pool=pool)
        every, calls = entered(lambda: _first_batch(node, dict(state)))
        node.close()
    return {
        "kind": kind,
        "all": len(every),
        "fresh": len(fresh),
        "restore": sorted(every - fresh),
        "files": sorted(every),
        "climbs": climbs(calls),
    }


def measure(root: Path) -> list[dict[str, Any]]:
    """The four kinds of state over the corpus in ``root`` (written there if absent)."""
    if not (root / "a").exists():
        _corpus(root)
    plain = Pipeline(_recipe(root))
    staged = Pipeline(
        _recipe(root, stages=[{"start_step": 3, "datasets": [{"name": "c", "paths": ["c/*"]}]}])
    )
    amended_to = Pipeline(_recipe(root, names="ac"))
    eight = Pipeline(_recipe(root, num_lanes=8))
    return [
        count("plain", plain, _saved(plain, 6)),
        count("staged", staged, _saved(staged, 6)),
        count("amended", amended_to, amend_state(plain, _saved(plain, 4), amended_to)),
        count("relaned", eight, relane_state(plain, _saved(plain, 4), 8)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.restore_path", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per kind")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-restore-path-") as tmp:
        rows = measure(Path(tmp))
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print("| state | files, reset + first batch | fresh first batch | restore only | climbs |")
    print("|---|---|---|---|---|")
    for r in rows:
        only = ", ".join(f.removeprefix("zephon_nodes/") for f in r["restore"])
        up = ", ".join(r["climbs"])
        print(f"| {r['kind']} | {r['all']} | {r['fresh']} | {len(r['restore'])}: {only} |", end="")
        print(f" {len(r['climbs'])}: {up} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
