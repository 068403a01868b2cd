"""``zephon lanes``: suggest lane counts for the dp sizes a run may use, with their cost."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from zephon_nodes.commands.inspect import check_shape, load_any
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.bounds import SETTINGS, check_setting
from zephon_nodes.state.lineage import describe_lineage
from zephon_nodes.state.schema import LINEAGE_KEY, NUM_LANES_KEY, RECIPE_KEY, STEP_KEY

__all__ = ["CHUNK_SIZE", "FLUSH_EVERY", "LaneOption", "add_parser", "run", "suggest_lanes"]

# What --flush-every (without a checkpoint) and --chunk-size assume: a planning guess.
FLUSH_EVERY = 8
CHUNK_SIZE = 64


@dataclass(frozen=True)
class LaneOption:
    """One admissible lane count and what it costs.

    Attributes:
        num_lanes: The lane count ``L`` (a multiple of every dp size, dividing ``G``).
        samples_per_lane: Samples each lane gives every step (``G / L``).
        lanes_per_rank: ``{dp: L / dp}`` for each planned dp size.
        replay_items_per_lane: Work items a lane may replay on restore (at most ``K``).
        replay_records_per_lane: The same in records (``K * chunk_size``).
        replay_items_per_rank: ``{dp: L / dp * K}``: the worst-case replay of one rank.
    """

    num_lanes: int
    samples_per_lane: int
    lanes_per_rank: dict[int, int]
    replay_items_per_lane: int
    replay_records_per_lane: int
    replay_items_per_rank: dict[int, int]


def suggest_lanes(
    dp_sizes: list[int],
    global_batch_size: int,
    *,
    flush_every: int = 8,
    chunk_size: int = 64,
) -> list[LaneOption]:
    """List every lane count that fits all ``dp_sizes`` and divides the global batch.

    Args:
        dp_sizes: Data-parallel sizes the run may use (now or after a resize).
        global_batch_size: Samples per step ``G``.
        flush_every: Work items per flush window ``K``.
        chunk_size: Records per work item.

    Raises:
        RecipeError: If an argument is not positive.
    """
    for name, v in (("global_batch_size", global_batch_size), ("flush_every", flush_every)):
        if v < 1:
            raise RecipeError(f"{name}={v} must be >= 1")
    if chunk_size < 1:
        raise RecipeError(f"{chunk_size=} must be >= 1")
    if not dp_sizes or any(d < 1 for d in dp_sizes):
        raise RecipeError(f"dp sizes must be positive integers, got {dp_sizes}")
    base = math.lcm(*dp_sizes)
    out = []
    for lanes in range(base, global_batch_size + 1, base):
        if global_batch_size % lanes:
            continue
        out.append(
            LaneOption(
                num_lanes=lanes,
                samples_per_lane=global_batch_size // lanes,
                lanes_per_rank={d: lanes // d for d in dp_sizes},
                replay_items_per_lane=flush_every,
                replay_records_per_lane=flush_every * chunk_size,
                replay_items_per_rank={d: lanes // d * flush_every for d in dp_sizes},
            )
        )
    return out


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "lanes",
        help="suggest lane counts for the dp sizes you plan to use",
        description=(
            "List the lane counts L that are common multiples of every dp size and divide "
            "the global batch, with the replay a restore may cost per lane (at most "
            "--flush-every work items) and per rank. Fewer lanes replay less at restore; more "
            "lanes allow larger dp sizes later. Flush padding depends on --flush-every, not "
            "on the lane count."
        ),
    )
    p.add_argument(
        "--dp",
        default=None,
        help="dp sizes, comma-separated, e.g. 8,16,32 (required without --checkpoint)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        help="samples per step G (required without --checkpoint, which records it)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="also show this checkpoint's lane count and lineage (re-lanes); its global batch "
        "is the default --global-batch, so --dp lists the lane counts it can be re-laned to",
    )
    p.add_argument(
        "--flush-every",
        type=int,
        default=None,
        help=f"work items per window K (default: the checkpoint's, else {FLUSH_EVERY})",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=CHUNK_SIZE,
        help="records per work item, for the replay in records (a checkpoint records its "
        "[work] table only as a hash)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=__name__)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon lanes``; exit status 1 when no lane count fits."""
    if args.checkpoint is not None:
        _show_checkpoint(args)
        if args.dp is None:
            return 0
    if args.checkpoint is not None and args.global_batch is None:
        raise RecipeError(
            f"--global-batch is required: checkpoint {args.checkpoint} records no global batch "
            "size (a state without its recipe summary)"
        )
    if args.dp is None or args.global_batch is None:
        raise RecipeError("--dp and --global-batch are required (or give --checkpoint)")
    if args.flush_every is None:
        args.flush_every = FLUSH_EVERY
    try:
        dp_sizes = sorted({int(x) for x in args.dp.split(",") if x.strip()})
    except ValueError:
        raise RecipeError(f"--dp={args.dp!r} must be integers separated by commas") from None
    if not dp_sizes:
        raise RecipeError(f"--dp={args.dp!r} must name at least one dp size")
    for dp in dp_sizes:
        check_setting("--dp", dp, bound=SETTINGS["dp_world_size"])
    options = suggest_lanes(
        dp_sizes, args.global_batch, flush_every=args.flush_every, chunk_size=args.chunk_size
    )
    if args.json:
        print(json.dumps([asdict(o) for o in options]))
        return 0 if options else 1
    base = math.lcm(*dp_sizes)
    if not options:
        print(
            f"no lane count fits: a lane count must be a multiple of lcm({args.dp})={base} "
            f"and divide --global-batch={args.global_batch}; choose a global batch that is a "
            f"multiple of {base}"
        )
        return 1
    header = ["lanes", "samples/lane/step"] + [f"lanes/rank @dp={d}" for d in dp_sizes]
    header += ["replay/lane (items)", "replay/lane (records)"]
    header += [f"replay/rank @dp={d}" for d in dp_sizes]
    rows = [header]
    for o in options:
        row = [str(o.num_lanes), str(o.samples_per_lane)]
        row += [str(o.lanes_per_rank[d]) for d in dp_sizes]
        row += [f"<= {o.replay_items_per_lane}", f"<= {o.replay_records_per_lane}"]
        row += [f"<= {o.replay_items_per_rank[d]}" for d in dp_sizes]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, r in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    best = options[0]
    print()
    print(
        f"suggested: num_lanes={best.num_lanes} (the smallest that fits dp sizes {dp_sizes}: "
        f"least replay at restore and fewest shuffle buffers per rank). A restore replays at "
        f"most --flush-every={args.flush_every} work items per lane, on the rank's worker pool; "
        f"choose a larger multiple of {base} if the run may grow beyond dp={max(dp_sizes)}."
    )
    return 0


def _show_checkpoint(args: argparse.Namespace) -> None:
    """Print a checkpoint's lane count and lineage; default ``--global-batch`` from it."""
    state = check_shape(load_any(args.checkpoint), args.checkpoint)
    recipe = state.get(RECIPE_KEY) if isinstance(state.get(RECIPE_KEY), dict) else {}
    assert isinstance(recipe, dict)
    # Values from the checkpoint are held to the recipe's bounds, as the flags were.
    where = f"checkpoint {args.checkpoint}: recipe."
    if args.global_batch is None and isinstance(recipe.get("global_batch_size"), int):
        args.global_batch = check_setting(
            "global_batch_size", recipe["global_batch_size"], where=where
        )
    # The replay a restore costs is in the checkpoint's flush_every, unless --flush-every says.
    if args.flush_every is None and isinstance(recipe.get("flush_every"), int):
        args.flush_every = check_setting("flush_every", recipe["flush_every"], where=where)
    lines = describe_lineage(state.get(LINEAGE_KEY))
    if args.json:  # with --dp, the JSON list of lane counts alone
        if args.dp is None:
            out = {"num_lanes": state.get(NUM_LANES_KEY), "step": state.get(STEP_KEY)}
            out["lineage"] = state.get(LINEAGE_KEY)
            print(json.dumps(out, sort_keys=True))
        return
    print(
        f"checkpoint {args.checkpoint}: num_lanes={state.get(NUM_LANES_KEY)} at step "
        f"{state.get(STEP_KEY)}" + ("" if lines else " (never re-laned)")
    )
    for line in lines:
        print(f"  {line}")
    if args.dp is not None:
        print()
