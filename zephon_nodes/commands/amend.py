"""``zephon amend``: continue a run with a changed recipe, no document repeated.

Its arguments are declared, and its checkpoint loaded, by
:mod:`zephon_nodes.commands.amend_args`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.engine.timeline import unreachable
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.state.files import save_state
from zephon_nodes.state.identity import summary_diff
from zephon_nodes.state.schema import STAGE_KEY, STEP_KEY, RankState
from zephon_nodes.verification.simulate import simulate

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Run ``zephon amend`` (``args.state``: the checkpoint loaded before it)."""
    state = args.state
    step = RankState.from_dict(state).step
    old = Pipeline(Recipe.from_toml(args.old_recipe))
    new = Pipeline(Recipe.from_toml(args.new_recipe))
    if args.at_step is not None:
        check_setting("at_step", args.at_step)
        if args.at_step < step:
            raise RecipeError(
                f"--at-step={args.at_step} is before the checkpoint's step {step}: the batches "
                f"up to step {step} were delivered already; amend at step {step} or later"
            )
        if args.at_step > step:
            state = _run_to(old, state, args.at_step)
    amended = amend_state(old, state, new)
    path = save_state(args.output, amended)
    section = amended[STAGE_KEY]
    lanes = section["lanes"].values()
    out = {
        "output": str(path),
        "step": amended[STEP_KEY],
        "fingerprint": amended["fingerprint"],
        "changed": [
            line.replace("checkpoint has", "old recipe has").replace(", recipe has", ", new has")
            for line in summary_diff(old.summary, new.summary)
        ],
        "amendments": len(section.get("amended", [])),
        "datasets": section["names"],
        "dropped_samples": sum(row[-2] for row in lanes),
        "dropped_tokens": sum(row[-1] for row in lanes),
    }
    left = unreachable(new, amended)
    if left is not None:
        out["unreachable_work_items"] = left.items
        warning = left.warning(f"the amendment after step {amended[STEP_KEY]}")
        if warning is not None:
            print(warning, file=sys.stderr)
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"amended the checkpoint of step {out['step']}: {path}")
    print("changed: " + ("; ".join(out["changed"]) or "nothing but the fingerprint"))
    print(
        f"dropped by the run's changes so far (each lane's shuffle buffer and the rest of the "
        f"document each change cut): {out['dropped_samples']} samples, "
        f"{out['dropped_tokens']} tokens"
    )
    print(
        f"resume it with {args.new_recipe} (fingerprint {str(out['fingerprint'])[:16]}...); "
        f"any other recipe is refused"
    )
    return 0


def _run_to(pipeline: Pipeline, state: dict[str, Any], step: int) -> dict[str, Any]:
    """Run ``pipeline`` from ``state`` to after ``step`` and return the merged state there."""
    first = RankState.from_dict(state).step
    saved: list[dict[str, Any]] = []
    for _ in simulate(
        pipeline, 1, step - first, resume_state=state, save_at=step, on_save=saved.append
    ):
        pass
    if not saved:
        raise RecipeError(f"the data ends before step {step}: nothing to amend there")
    return saved[0]
