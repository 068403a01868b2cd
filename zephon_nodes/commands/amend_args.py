"""``zephon amend``'s arguments: light, so that ``--help`` imports no engine.

The command runs in :mod:`zephon_nodes.commands.amend` (the engine, and with it torch,
imported only when it runs; see :mod:`zephon_nodes.cli`).
"""

from __future__ import annotations

from typing import Any

from zephon_nodes.commands.inspect import add_checkpoint_arg, load_checkpoint_for_output

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "amend",
        help="write a checkpoint that continues the run with a changed recipe",
        description=(
            "Amend CHECKPOINT (taken with OLD_RECIPE) so that the run continues with "
            "NEW_RECIPE after step --at-step (default: the checkpoint's step; a later step is "
            "reached by running OLD_RECIPE from the checkpoint). Datasets kept continue where "
            "each lane left them, removed ones are no longer read, added ones start at their "
            "beginning; each lane's shuffle buffer and the rest of the document the change "
            "cuts are dropped and counted. "
            "The same change written as a [[stages]] entry starting at that step gives the "
            "same batches (see docs/changing-recipes.md)."
        ),
    )
    p.add_argument("old_recipe", help="recipe TOML file the checkpoint was taken with")
    add_checkpoint_arg(p)
    p.add_argument("new_recipe", help="recipe TOML file to continue with")
    p.add_argument("--at-step", type=int, default=None, help="the step the change follows")
    p.add_argument("--output", required=True, help="directory to write zephon_state.json to")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(run="zephon_nodes.commands.amend", prepare=load_checkpoint_for_output)
