"""``zephon inspect --recipe``: whether a recipe can resume from a checkpoint, as a resume checks.

Compiling the recipe needs the engine (and torch), so ``zephon inspect`` runs here only with
``--recipe`` (:func:`zephon_nodes.commands.inspect.route_recipe`); it prints what
:mod:`zephon_nodes.commands.inspect` prints, and the verdict.
"""

from __future__ import annotations

import argparse
from typing import Any

from zephon_nodes.commands.inspect import check_shape, load_any, report
from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.restore_checks import check_rank_state
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.identity import summary_diff
from zephon_nodes.state.schema import LANES_KEY, RECIPE_KEY

__all__ = ["resume_check", "run"]


def run(args: argparse.Namespace) -> int:
    """Run ``zephon inspect --recipe``; exit status 1 if the recipe cannot resume."""
    state = check_shape(load_any(args.checkpoint), args.checkpoint)
    return report(args, state, resume_check(state, Recipe.from_toml(args.recipe)))


def resume_check(state: dict[str, Any], recipe: Recipe) -> tuple[bool, str, list[str]]:
    """Check whether ``recipe`` can resume from ``state``, as a resume would check it.

    The recipe is compiled (:class:`~zephon_nodes.engine.pipeline.Pipeline`, the same
    fingerprint and summary a resume compares, the mixture's token estimate included), and
    the state is held to it by the state package's checks.

    Returns:
        ``(ok, message, differing fields)``; the fields are lines such as
        ``seq_len: checkpoint has 128, recipe has 256``.
    """
    pipeline = Pipeline(recipe)
    diffs = summary_diff(state.get(RECIPE_KEY), pipeline.summary, hashes=True)
    lanes = state.get(LANES_KEY)
    owned = [int(k) for k in lanes if str(k).isdigit()] if isinstance(lanes, dict) else []
    try:
        # The checks a resume makes (engine/restore_checks.py): a checkpoint after a recipe
        # change is held to the stage it is in, a re-laned one to its streams.
        check_rank_state(pipeline, state, owned)
    except CheckpointError as e:
        return False, str(e), diffs
    missing = sorted(set(range(recipe.num_lanes)) - set(owned))
    if missing:
        return (
            True,
            f"yes, for the ranks owning lanes {sorted(owned)} (this state lacks lanes "
            f"{missing}; merge every rank's state to resume at any dp size)",
            diffs,
        )
    return True, "yes, at any dp size that divides num_lanes", diffs
