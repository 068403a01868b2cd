"""``zephon relane``'s arguments: light, so that ``--help`` imports no engine.

The command runs in :mod:`zephon_nodes.commands.relane` (the engine, and with it torch,
imported only when it runs; see :mod:`zephon_nodes.cli`).
"""

from __future__ import annotations

from typing import Any

from zephon_nodes.commands.inspect import add_checkpoint_arg, load_checkpoint_for_output

__all__ = ["add_parser"]


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
    p.set_defaults(run="zephon_nodes.commands.relane", prepare=load_checkpoint_for_output)
