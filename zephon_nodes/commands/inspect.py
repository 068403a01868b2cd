"""``zephon inspect``: show what a checkpoint holds and whether a recipe can resume from it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.files import STATE_FILE, load_state
from zephon_nodes.state.identity import summary_diff
from zephon_nodes.state.layout import load_checkpoint
from zephon_nodes.state.lineage import LINEAGE_KEY, check_lineage, describe_lineage
from zephon_nodes.state.mixture import LOG_KEY, check_effects, parse_mixture_state
from zephon_nodes.state.schema import (
    FINGERPRINT_KEY,
    FORMAT_KEY,
    LANES_KEY,
    MICRO_KEY,
    MIXTURE_KEY,
    NUM_LANES_KEY,
    PASS_KEY,
    RECIPE_KEY,
    STAGE_KEY,
    STEP_KEY,
)
from zephon_nodes.state.stage import summarize_changes
from zephon_nodes.state.validate import validate_state

__all__ = ["CHECKPOINT_HELP", "add_checkpoint_arg", "add_parser", "load_any", "resume_check", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "inspect",
        help="print a checkpoint's format, fingerprint, step and lane positions",
        description=(
            "Print a zephon-nodes checkpoint: format version, recipe fingerprint, step, lane "
            "count and each lane's position [window, consumed]. With --recipe, say whether "
            "that recipe can resume from it and, if not, which fields differ (exit status 1)."
        ),
    )
    add_checkpoint_arg(p)
    p.add_argument("--recipe", default=None, help="recipe TOML to check the checkpoint against")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=run)


CHECKPOINT_HELP = (
    "a state JSON file, a directory holding zephon_state.json, or a multi-rank checkpoint "
    "directory (a committed step directory or its root)"
)


def add_checkpoint_arg(parser: Any) -> None:
    """Add the ``checkpoint`` argument every command reading a checkpoint takes."""
    parser.add_argument("checkpoint", help=CHECKPOINT_HELP)


def load_any(path: str | Path) -> dict[str, Any]:
    """Load a single state file, a ``zephon_state.json`` directory or a multi-rank checkpoint.

    Raises:
        CheckpointError: If nothing loadable is there.
    """
    p = Path(path)
    if p.is_file() or (p / STATE_FILE).is_file():
        return load_state(p)
    if not p.exists():
        raise CheckpointError(f"no checkpoint at {p}")
    return load_checkpoint(p)


def resume_check(state: dict[str, Any], recipe: Recipe) -> tuple[bool, str, list[str]]:
    """Check whether ``recipe`` can resume from ``state``, as a resume would check it.

    The recipe is compiled (:class:`~zephon_nodes.engine.pipeline.Pipeline`, the same
    fingerprint and summary a resume compares, the mixture's token estimate included), and
    the state is held to it by the state package's checks.

    Returns:
        ``(ok, message, differing fields)``; the fields are lines such as
        ``seq_len: checkpoint has 128, recipe has 256``.
    """
    # Compiling a recipe needs the engine (and torch); only --recipe does.
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.engine.relane import for_state
    from zephon_nodes.engine.stages import segment_for_state

    pipeline = Pipeline(recipe)
    diffs = summary_diff(state.get(RECIPE_KEY), pipeline.summary, hashes=True)
    lanes = state.get(LANES_KEY)
    owned = [int(k) for k in lanes if str(k).isdigit()] if isinstance(lanes, dict) else []
    try:
        # A checkpoint after a recipe change is held to the stage it is in (its batch size,
        # its positions counted from the change), as a resume holds it.
        resuming = for_state(segment_for_state(pipeline, state), state)
        in_force = resuming.recipe
        positions = validate_state(
            state,
            fingerprint=resuming.fingerprint,
            summary=resuming.summary,
            num_lanes=recipe.num_lanes,
            lanes=owned,
            samples_per_lane=in_force.samples_per_lane,
            base_step=resuming.base_step,
        )
        if resuming.stage is not None:
            resuming.stage.require_lanes(owned)
        check_lineage(state.get(LINEAGE_KEY), resuming.lineage)
        names = [d.name for d in in_force.datasets]
        log = parse_mixture_state(state.get(MIXTURE_KEY), names, owned, state[STEP_KEY])
        if state.get(LINEAGE_KEY) is None:
            check_effects(log, positions, state[STEP_KEY], in_force.samples_per_lane)
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


def run(args: argparse.Namespace) -> int:
    """Run ``zephon inspect``; exit status 1 if ``--recipe`` cannot resume."""
    state = load_any(args.checkpoint)
    lanes = state.get(LANES_KEY) if isinstance(state.get(LANES_KEY), dict) else {}
    assert isinstance(lanes, dict)
    positions = {str(k): v for k, v in sorted(lanes.items(), key=lambda kv: _lane_key(kv[0]))}
    out: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "format": state.get(FORMAT_KEY),
        "fingerprint": state.get(FINGERPRINT_KEY),
        "step": state.get(STEP_KEY),
        "micro": state.get(MICRO_KEY),
        "pass": state.get(PASS_KEY, 0),
        "num_lanes": state.get(NUM_LANES_KEY),
        "lanes": positions,
    }
    mixture = state.get(MIXTURE_KEY)
    if isinstance(mixture, dict) and isinstance(mixture.get(LOG_KEY), list):
        out["mixture_log"] = mixture[LOG_KEY]  # decisions of a dynamic mixture
    if state.get(LINEAGE_KEY) is not None:
        out["lineage"] = state[LINEAGE_KEY]  # a re-laned checkpoint (zephon relane)
    change = summarize_changes([state.get(STAGE_KEY)])
    if change is not None:  # the recipe changed mid-run (a stage, zephon amend)
        out["recipe_change"] = change
    status = 0
    if args.recipe is not None:
        ok, message, diffs = resume_check(state, Recipe.from_toml(args.recipe))
        out["resume"] = {"recipe": str(args.recipe), "ok": ok, "message": message, "diffs": diffs}
        status = 0 if ok else 1
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return status
    print(f"checkpoint:   {out['checkpoint']}")
    print(f"format:       {out['format']}")
    print(f"fingerprint:  {out['fingerprint']}")
    micro = f" (+{out['micro']} micro-batches of step {out['step'] + 1})" if out["micro"] else ""
    print(f"step:         {out['step']}{micro}")
    if out["pass"]:
        print(f"pass:         {out['pass']} (a later pass of the recipe's stream)")
    print(f"num_lanes:    {out['num_lanes']} ({len(positions)} in this state)")
    print("lane positions [window, consumed]:")
    for k, v in positions.items():
        print(f"  lane {k:>4}: {v}")
    if "lineage" in out:
        for line in describe_lineage(out["lineage"]):
            print(f"lineage:      {line}")
    if "recipe_change" in out:
        c = out["recipe_change"]
        print(
            f"recipe change: stage {c['stage']} in force since step {c['after_step']}"
            f" ({c['amendments']} amendment(s)); dropped by the changes, as recorded in the "
            f"checkpoint (not verified): {c['dropped_samples']} samples, "
            f"{c['dropped_tokens']} tokens"
        )
    for entry in out.get("mixture_log", []):
        print(f"mixture decision after step {entry.get('step')}: {entry.get('weights')}")
    if "resume" in out:
        r = out["resume"]
        verdict = r["message"] if r["ok"] else f"no: {r['message']}"
        print(f"resume with {r['recipe']}: {verdict}")
        for line in r["diffs"]:
            print(f"  {line}")
    return status


def _lane_key(key: Any) -> tuple[int, str]:
    s = str(key)
    return (int(s), s) if s.isdigit() else (1 << 62, s)
