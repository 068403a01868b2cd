"""``zephon relane``: change a checkpoint's lane count, every document still used once.

Its arguments are declared, and its checkpoint loaded, by
:mod:`zephon_nodes.commands.relane_args`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import RelanedWorkSource, for_state, pipeline_at, relane_state
from zephon_nodes.engine.timeline import unreachable
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.files import save_state

__all__ = ["run", "starved_lanes"]


def run(args: argparse.Namespace) -> int:
    """Run ``zephon relane`` (``args.state``: the checkpoint loaded before it)."""
    state = args.state
    pipeline = Pipeline(Recipe.from_toml(args.recipe))
    new = relane_state(pipeline, state, args.num_lanes)
    path = save_state(args.output, new)
    lineage = new["lineage"]
    out = {
        "output": str(path),
        "step": new["step"],
        "from_lanes": lineage["num_lanes"],
        "num_lanes": new["num_lanes"],
        "fingerprint": new["fingerprint"],
        "relanes": _depth(lineage),
    }
    starved = starved_lanes(pipeline, new)
    left = unreachable(pipeline_at(pipeline, int(new["num_lanes"])), new)
    if left is not None:
        out["unreachable_work_items"] = left.items
        warning = left.warning(f"the re-lane after step {new['step']}")
        if warning is not None and not starved:
            print(warning, file=sys.stderr)
    if starved:
        out["lanes_without_untouched_items"] = starved
        every = len(starved) == int(new["num_lanes"])
        print(
            f"warning: {len(starved)} of {new['num_lanes']} new lanes get no untouched work item "
            f"(lanes {starved[:8]}{'...' if len(starved) > 8 else ''}): the finite data ends "
            + (
                "when the lanes' leftovers run out; "
                if every
                else "when their leftovers run out and the other lanes' samples go unused; "
            )
            + "fewer lanes or an earlier checkpoint keeps more of the data",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(
        f"re-laned the checkpoint of step {out['step']} from {out['from_lanes']} to "
        f"{out['num_lanes']} lanes: {path}"
    )
    print(
        f"resume it with the recipe at num_lanes = {out['num_lanes']} (fingerprint "
        f"{str(out['fingerprint'])[:16]}...), at any dp size dividing {out['num_lanes']}"
    )
    return 0


def starved_lanes(pipeline: Pipeline, state: dict[str, Any]) -> list[int]:
    """New lanes of a re-laned finite stream that get no untouched work item (sorted)."""
    source = for_state(pipeline_at(pipeline, int(state["num_lanes"])), state).work_source
    if not isinstance(source, RelanedWorkSource) or source.untouched.total is None:
        return []
    return [lane for lane in range(source.num_lanes) if source.untouched_length(lane) == 0]


def _depth(lineage: Any) -> int:
    n = 0
    while isinstance(lineage, dict):
        n += 1
        lineage = lineage.get("parent")
    return n
