"""``zephon relane``: change a checkpoint's lane count, every document still used once."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from zephon_nodes.commands.inspect import add_checkpoint_arg, load_any
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.files import check_writable, save_state

if TYPE_CHECKING:
    from zephon_nodes.engine.pipeline import Pipeline

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "relane",
        help="write a checkpoint with another lane count (no document lost or repeated)",
        description=(
            "Re-lane CHECKPOINT (taken with RECIPE, whose num_lanes may be the old or the new "
            "count) to --num-lanes lanes and write it to --output. Each new lane first replays "
            "the rest of its old lanes' current flush windows, then takes the untouched work "
            "items in their old global order; resume with RECIPE at num_lanes = --num-lanes, "
            "at any dp size dividing it (see docs/lanes.md, Changing the lane count)."
        ),
    )
    p.add_argument("recipe", help="recipe TOML file the checkpoint was taken with")
    add_checkpoint_arg(p)
    p.add_argument("--num-lanes", type=int, required=True, help="the new lane count")
    p.add_argument("--output", required=True, help="directory to write zephon_state.json to")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon relane``."""
    check_writable(args.output)
    state = load_any(args.checkpoint)
    from zephon_nodes.engine.pipeline import Pipeline  # the engine imports torch: not for --help
    from zephon_nodes.engine.relane import relane_state

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
    from zephon_nodes.engine.relane import pipeline_at
    from zephon_nodes.engine.timeline import unreachable

    left = unreachable(pipeline_at(pipeline, int(new["num_lanes"])), new)
    if left is not None:
        out["unreachable_work_items"] = left.items
        warning = left.warning(f"the re-lane after step {new['step']}")
        if warning is not None and not starved:
            print(warning, file=sys.stderr)
    if starved:
        out["lanes_without_untouched_items"] = starved
        print(
            f"warning: {len(starved)} of {new['num_lanes']} new lanes get no untouched work item "
            f"(lanes {starved[:8]}{'...' if len(starved) > 8 else ''}): the finite data ends "
            f"when their leftovers run out and the other lanes' samples go unused; fewer lanes "
            f"or an earlier checkpoint keeps more of the data",
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
    from zephon_nodes.engine.relane import RelanedWorkSource, for_state, pipeline_at

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
