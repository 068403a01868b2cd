"""``zephon digest``: print the SHA-256 of every global batch as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from zephon_nodes.engine.checkpoint import load_state, save_state
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import RUNNERS
from zephon_nodes.errors import RecipeError
from zephon_nodes.io.nodecache import set_cache_limit
from zephon_nodes.recipe.spec import Recipe
from zephon_nodes.verification.simulate import simulate

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "digest",
        help="simulate N ranks and print one JSON line per global batch",
        description=(
            "Simulate --dp-world-size ranks, reassemble each global batch in lane order and "
            'print {"step": t, "digest": "<sha256>"} per step (steps count from 1).'
        ),
    )
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--dp-world-size", type=int, default=1, help="simulated ranks (default 1)")
    p.add_argument("--steps", type=int, required=True, help="global batches to produce")
    p.add_argument("--num-workers", type=int, default=2, help="pool workers (default 2)")
    p.add_argument("--runner", choices=RUNNERS, default="thread", help="worker runner")
    p.add_argument("--local-batch-size", type=int, default=None, help="micro-batch size per rank")
    p.add_argument("--save-at", type=int, default=None, help="save the state after step K")
    p.add_argument("--checkpoint-dir", default=None, help="where --save-at writes the state")
    p.add_argument("--resume-from", default=None, help="checkpoint directory to resume from")
    p.add_argument(
        "--cache-limit",
        default=None,
        help="node cache size, e.g. 50G (default: $ZEPHON_CACHE_LIMIT); never changes a digest",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon digest``."""
    if args.steps < 0:
        raise RecipeError(f"--steps={args.steps} must be >= 0")
    if (args.save_at is None) != (args.checkpoint_dir is None):
        raise RecipeError("--save-at and --checkpoint-dir must be given together")
    if args.cache_limit is not None:
        set_cache_limit(args.cache_limit)
    pipeline = Pipeline(Recipe.from_toml(args.recipe))
    resume = load_state(args.resume_from) if args.resume_from else None

    def on_save(state: dict[str, Any]) -> None:
        path = save_state(args.checkpoint_dir, state)
        print(f"saved state after step {state['step']} to {path}", file=sys.stderr)

    produced = 0
    last = resume["step"] if resume else 0
    for result, _ in simulate(
        pipeline,
        args.dp_world_size,
        args.steps,
        num_workers=args.num_workers,
        runner=args.runner,
        local_batch_size=args.local_batch_size,
        resume_state=resume,
        save_at=args.save_at,
        on_save=on_save,
    ):
        print(json.dumps({"step": result.step, "digest": result.digest}), flush=True)
        produced += 1
        last = result.step
    cache = pipeline.cache_stats()
    if cache is not None:
        print(f"zephon digest: node cache {json.dumps(cache, sort_keys=True)}", file=sys.stderr)
    if produced < args.steps:
        print(
            f"zephon digest: the data ended after step {last} ({produced} of {args.steps} "
            f"steps produced; a finite recipe stops after its last full global batch)",
            file=sys.stderr,
        )
    return 0
