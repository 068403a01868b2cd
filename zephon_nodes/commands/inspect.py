"""``zephon inspect``: show what a checkpoint holds and whether a recipe can resume from it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.files import STATE_FILE, check_writable, load_state
from zephon_nodes.state.layout import load_checkpoint
from zephon_nodes.state.lineage import LINEAGE_KEY, Lineage, describe_lineage, kept_stage
from zephon_nodes.state.mixture import LOG_KEY, WEIGHTS_KEY, parse_mixture_state
from zephon_nodes.state.schema import (
    FINGERPRINT_KEY,
    FORMAT_KEY,
    LANES_KEY,
    MICRO_KEY,
    MIXTURE_KEY,
    NUM_LANES_KEY,
    PASS_KEY,
    STAGE_KEY,
    STEP_KEY,
    RankState,
)
from zephon_nodes.state.stage import StageState, summarize_changes

__all__ = [
    "CHECKPOINT_HELP",
    "add_checkpoint_arg",
    "add_parser",
    "check_shape",
    "load_any",
    "load_checkpoint_for_output",
    "report",
    "route_recipe",
    "run",
]


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
    p.set_defaults(run=__name__, prepare=route_recipe)


def route_recipe(args: argparse.Namespace) -> None:
    """With ``--recipe``, run the command in :mod:`zephon_nodes.commands.resume_check`.

    Checking a recipe compiles it, which needs the engine (and torch); without ``--recipe``
    the command runs here, on the state package alone.
    """
    if args.recipe is not None:
        args.run = "zephon_nodes.commands.resume_check"


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


def check_shape(state: dict[str, Any], where: str | Path) -> dict[str, Any]:
    """Hold a loaded state to the shape every loader of it checks, and return it.

    The checks a resume makes before it compares the state with a recipe: the keys, types and
    ranges (:meth:`RankState.from_dict`), the lineage of a re-laned checkpoint, the stage
    section of a changed recipe and the decision log of a dynamic mixture (its dataset names
    taken from the log, since no recipe is at hand). A state that passes is printed safely.

    Raises:
        CheckpointError: ``<where>: <the problem>``.
    """
    try:
        parsed = RankState.from_dict(state)
        raw = state.get(LINEAGE_KEY)
        lineage = Lineage.from_state(raw) if raw is not None else None
        while lineage is not None:  # the stage sections the re-lanes keep are reported too
            if lineage.stage is not None:
                StageState.from_state(lineage.stage, lineage.num_lanes)
            lineage = lineage.parent
        if state.get(STAGE_KEY) is not None:
            StageState.from_state(state[STAGE_KEY], parsed.num_lanes)
        if state.get(MIXTURE_KEY) is not None:
            log = state[MIXTURE_KEY].get(LOG_KEY)
            first = log[0] if isinstance(log, list) and log else None
            weights = first.get(WEIGHTS_KEY) if isinstance(first, dict) else None
            names = [str(n) for n in weights] if isinstance(weights, dict) else []
            parse_mixture_state(state[MIXTURE_KEY], names, list(parsed.lanes), parsed.step)
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    return state


def load_checkpoint_for_output(args: argparse.Namespace) -> None:
    """Refuse an unwritable ``args.output``, then load ``args.checkpoint`` into ``args.state``.

    The ``prepare`` step of the commands that write a changed checkpoint (``relane``,
    ``amend``): run before their engine is imported, so that a wrong path is refused at once.

    Raises:
        CheckpointError: If no checkpoint is there, the output would replace the checkpoint
            read, or the output directory is not writable.
    """
    args.state = load_any(args.checkpoint)  # first: a wrong path creates no output folder
    source = Path(args.checkpoint)
    source = source if source.is_file() else source / STATE_FILE
    target = Path(args.output) / STATE_FILE
    if source.exists() and target.exists() and os.path.samefile(source, target):
        raise CheckpointError(
            f"--output {args.output} would replace the checkpoint read ({source}); write the "
            "changed checkpoint to another folder and keep this one"
        )
    check_writable(args.output, create=False)  # made when the changed state is saved


def run(args: argparse.Namespace) -> int:
    """Run ``zephon inspect`` without ``--recipe`` (see :func:`route_recipe`)."""
    return report(args, check_shape(load_any(args.checkpoint), args.checkpoint))


def report(
    args: argparse.Namespace,
    state: dict[str, Any],
    resume: tuple[bool, str, list[str]] | None = None,
) -> int:
    """Print what ``state`` holds, and ``resume`` (the check of ``--recipe``) if given.

    Returns:
        The exit status: 1 if ``resume`` says the recipe cannot resume, else 0.
    """
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
    # The recipe changed mid-run (a stage, zephon amend); a re-laned checkpoint keeps the
    # section of its last change in its lineage until the next change.
    change = summarize_changes([state.get(STAGE_KEY) or kept_stage(state.get(LINEAGE_KEY))])
    if change is not None:
        out["recipe_change"] = change
    status = 0
    if resume is not None:
        ok, message, diffs = resume
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
