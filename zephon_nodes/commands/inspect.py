"""``zephon inspect``: show what a checkpoint holds and whether a recipe can resume from it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zephon_nodes.engine.checkpoint import (
    STATE_FILE,
    contents_diff,
    load_state,
    validate_state,
)
from zephon_nodes.errors import CheckpointError
from zephon_nodes.recipe import Recipe

__all__ = ["add_parser", "load_any", "resume_check", "run"]


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
    p.add_argument(
        "checkpoint",
        help="a state JSON file, a directory holding zephon_state.json, or a multi-rank "
        "checkpoint directory (a committed step directory or its root)",
    )
    p.add_argument("--recipe", default=None, help="recipe TOML to check the checkpoint against")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=run)


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
    from zephon_nodes.engine import checkpoint

    load_checkpoint = getattr(checkpoint, "load_checkpoint", None)
    if load_checkpoint is None:
        raise CheckpointError(f"{p}: no {STATE_FILE} in this directory")
    state: dict[str, Any] = load_checkpoint(p)
    return state


def resume_check(state: dict[str, Any], recipe: Recipe) -> tuple[bool, str, list[str]]:
    """Check whether ``recipe`` can resume from ``state``.

    Returns:
        ``(ok, message, differing fields)``; the fields are lines such as
        ``seq_len: checkpoint has 128, recipe has 256``.
    """
    from zephon_nodes.engine.pipeline import Pipeline

    # The pipeline's canonical form, as the checkpoint's: with several datasets it holds the
    # token estimate the mixture was planned with, which Recipe.canonical() alone lacks.
    pipeline = Pipeline(recipe)
    summary = dict(pipeline.summary)
    fingerprint = pipeline.fingerprint
    lanes = state.get("lanes")
    owned = [int(k) for k in lanes if str(k).isdigit()] if isinstance(lanes, dict) else []
    diffs: list[str] = []
    saved = state.get("recipe")
    if isinstance(saved, dict):
        for key in sorted(set(saved) | set(summary)):
            a, b = saved.get(key, "<absent>"), summary.get(key, "<absent>")
            if a != b:
                if key == "contents" and isinstance(a, dict) and isinstance(b, dict):
                    diffs.extend(contents_diff(a, b))
                elif isinstance(a, str) and a.startswith("sha256:"):
                    diffs.append(f"{key}: differs (checkpoint {a}, recipe {b})")
                else:
                    diffs.append(f"{key}: checkpoint has {a!r}, recipe has {b!r}")
    try:
        validate_state(
            state,
            fingerprint=fingerprint,
            summary=summary,
            num_lanes=recipe.num_lanes,
            lanes=owned,
            samples_per_lane=recipe.samples_per_lane,
        )
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
    lanes = state.get("lanes") if isinstance(state.get("lanes"), dict) else {}
    assert isinstance(lanes, dict)
    positions = {str(k): v for k, v in sorted(lanes.items(), key=lambda kv: _lane_key(kv[0]))}
    out: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "format": state.get("format"),
        "fingerprint": state.get("fingerprint"),
        "step": state.get("step"),
        "micro": state.get("micro"),
        "pass": state.get("pass", 0),
        "num_lanes": state.get("num_lanes"),
        "lanes": positions,
    }
    mixture = state.get("mixture")
    if isinstance(mixture, dict) and isinstance(mixture.get("log"), list):
        out["mixture_log"] = mixture["log"]  # decisions of a dynamic mixture
    if state.get("lineage") is not None:
        out["lineage"] = state["lineage"]  # a re-laned checkpoint (zephon relane)
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
        from zephon_nodes.engine.relane import describe_lineage

        for line in describe_lineage(out["lineage"]):
            print(f"lineage:      {line}")
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
