"""The end of finite data: unused samples per dealing, and the start-up cost of dealing.

Usage::

    python -m benchmarks.end_of_data                 # Markdown on stdout
    python -m benchmarks.end_of_data --json out.json --items 10000 100000

* ``unused``: the bundled demo recipe (``examples/default``, built on first run) read to its
  end at dp 2, for round-robin dealing, the earlier opt-in dealing by JSON line bytes, and
  the default (balanced by tokens): steps, samples delivered and unused per lane.
* ``relane`` (``--relane``): the demo recipe re-laned after step ``S`` (8 -> 4 and 8 -> 16
  lanes), read to its end at dp 2, against the same recipe run at 8, 4 and 16 lanes from
  the start: the share of samples never delivered (docs/lanes.md, at the end of finite data).
* ``startup``: ``Pipeline(recipe)`` build time for an in-memory dataset of N work items of
  4 records, round-robin vs the default (by tokens up to ``EXACT_RECORDS`` records, by record
  counts above), and the dealing alone (sizing and dealing every item), best of 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import numpy as np

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkSpec
from zephon_nodes.engine.balance import EXACT_RECORDS, BalancedWorkSource, item_sizes
from zephon_nodes.engine.end_of_data import unused_samples
from zephon_nodes.engine.work import DatasetWorkSource
from zephon_nodes.verification.simulate import simulate


def _to_end(p: Pipeline) -> dict[str, Any]:
    ended: dict[str, Any] = {}
    steps = len(list(simulate(p, 2, 1_000_000, num_workers=2, on_end=ended.update)))
    unused = unused_samples(p, ended)
    total = sum(unused.values())
    delivered = steps * p.recipe.global_batch_size
    return {
        "steps": steps,
        "delivered": delivered,
        "unused": total,
        "share": total / (total + delivered),
        "per_lane": unused,
    }


def _line_bytes(p: Pipeline) -> np.ndarray:
    """Bytes of each work item's JSON lines (the earlier opt-in size)."""
    ds = p.datasets[0]
    out = np.zeros(ds.num_work_items, dtype=np.int64)
    for k in range(ds.num_work_items):
        s, a, b = ds.locate(k)
        out[k] = sum(len(raw) for _, raw in ds.shards[s].read(a, b))
    return out


def unused() -> dict[str, Any]:
    """Unused samples at the end of the demo recipe, per dealing."""
    from zephon_nodes.commands.demo import default_recipe_path, prepare_default

    path = default_recipe_path()
    prepare_default(path)
    base = Recipe.from_toml(path)
    rr = Pipeline(base.replace(work=dataclasses.replace(base.work, deal="round_robin")))
    out = {"round_robin": _to_end(rr)}
    inner = rr.work_source
    assert isinstance(inner, DatasetWorkSource) and inner.total_items is not None
    rr.work_source = BalancedWorkSource(inner, _line_bytes(rr), "bytes")
    out["bytes (earlier opt-in)"] = _to_end(rr)
    out["default (tokens)"] = _to_end(Pipeline(base))
    return out


def _relaned_to_end(base: Recipe, old_lanes: int, new_lanes: int, at: int) -> dict[str, Any]:
    """The demo recipe at ``old_lanes``, re-laned to ``new_lanes`` after step ``at``, to its end."""
    from zephon_nodes.engine.relane import relane_state

    old = Pipeline(base.replace(num_lanes=old_lanes))
    saved: list[dict[str, Any]] = []
    for _ in simulate(old, 2, at, num_workers=2, save_at=at, on_save=saved.append):
        pass
    state = relane_state(old, saved[0], new_lanes)
    new = Pipeline(base.replace(num_lanes=new_lanes))
    ended: dict[str, Any] = {}
    after = len(
        list(simulate(new, 2, 1_000_000, num_workers=2, resume_state=state, on_end=ended.update))
    )
    unused = unused_samples(new, ended)
    total = sum(unused.values())
    delivered = (at + after) * base.global_batch_size
    return {
        "steps": at + after,
        "delivered": delivered,
        "unused": total,
        "share": total / (total + delivered),
        "per_lane": unused,
    }


def relane(at: int = 200) -> dict[str, Any]:
    """Unused samples at the end of the demo recipe re-laned after step ``at``, and without."""
    from zephon_nodes.commands.demo import default_recipe_path, prepare_default

    path = default_recipe_path()
    prepare_default(path)
    base = Recipe.from_toml(path)
    out: dict[str, Any] = {}
    for lanes in (8, 4, 16):
        out[f"{lanes} lanes from the start"] = _to_end(Pipeline(base.replace(num_lanes=lanes)))
    for new in (4, 16):
        out[f"8 -> {new} lanes after step {at}"] = _relaned_to_end(base, 8, new, at)
    return out


def startup(items: int, rounds: int = 3) -> dict[str, Any]:
    """Pipeline build time for ``items`` work items of 4 records, round-robin vs default."""
    records = tuple({"text": f"doc {i} " + "word " * (i * 7 % 50)} for i in range(items * 4))
    recipe = Recipe(
        datasets=(DatasetSpec("m", records=records),),
        tokenizer=TokenizerSpec(kind="bytes"),
        num_lanes=32,
        global_batch_size=32,
        seq_len=256,
        work=WorkSpec(chunk_size=4, epochs=1),
    )
    res: dict[str, Any] = {"items": items, "records": len(records)}
    for deal in ("round_robin", "auto"):
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            p = Pipeline(recipe.replace(work=WorkSpec(chunk_size=4, epochs=1, deal=deal)))
            best = min(best, time.perf_counter() - t0)
        res[f"{deal}_s"] = round(best, 4)
    res["measure"] = getattr(p.work_source, "measure", None)
    # The dealing alone: sizing every item and dealing them (what the default adds).
    rr = Pipeline(recipe.replace(work=WorkSpec(chunk_size=4, epochs=1, deal="round_robin")))
    inner = rr.work_source
    assert isinstance(inner, DatasetWorkSource)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        BalancedWorkSource(inner, *item_sizes(rr.datasets[0], 0, rr.stateless))
        best = min(best, time.perf_counter() - t0)
    res["deal_s"] = round(best, 4)
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the results here ('-': stdout)")
    ap.add_argument("--items", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--skip-demo", action="store_true", help="only the start-up cost")
    ap.add_argument(
        "--relane",
        type=int,
        default=None,
        metavar="STEP",
        help="also re-lane the demo recipe after STEP (8 -> 4 and 8 -> 16 lanes)",
    )
    args = ap.parse_args(argv)
    res: dict[str, Any] = {"exact_records": EXACT_RECORDS}
    if not args.skip_demo:
        res["unused"] = unused()
    if args.relane is not None:
        res["relane"] = relane(args.relane)
    res["startup"] = [startup(n) for n in args.items]
    if args.json == "-":
        json.dump(res, sys.stdout, indent=1)
        return 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    for name, r in [*res.get("unused", {}).items(), *res.get("relane", {}).items()]:
        print(
            f"| {name} | {r['steps']} | {r['delivered']:,} of {r['delivered'] + r['unused']:,} "
            f"| {r['unused']:,} ({r['share']:.2%}) | {r['per_lane']} |"
        )
    for r in res["startup"]:
        print(
            f"| {r['items']:,} items ({r['records']:,} records) | {r['round_robin_s']} s | "
            f"{r['auto_s']} s | {r['deal_s']} s | {r['measure']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
