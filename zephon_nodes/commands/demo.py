"""``zephon demo``: show the promise on the bundled default recipe, offline."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from zephon_nodes.commands.demo_corpus import build_corpus, train_tokenizer
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.baselines import naive_digests
from zephon_nodes.verification.simulate import simulate

__all__ = ["add_parser", "default_recipe_path", "prepare_default", "run"]


def default_recipe_path() -> Path:
    """The bundled default recipe (``examples/default/recipe.toml`` in a source checkout)."""
    return Path(__file__).resolve().parents[2] / "examples" / "default" / "recipe.toml"


def prepare_default(recipe_path: Path) -> None:
    """Build the default recipe's corpus and tokenizer next to it if they are missing."""
    root = recipe_path.parent
    if not list((root / "data").glob("*.jsonl.zst")):
        print(f"building the corpus from Python's docs and sources into {root / 'data'}")
        build_corpus(root / "data")
    if not (root / "tok.model").exists():
        print(f"training a sentencepiece BPE (vocab 2000) into {root / 'tok.model'}")
        train_tokenizer(root / "tok.model")


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "demo",
        help="run the bundled default recipe at dp 1/2/4, 1/2 workers, and across a resume",
    )
    p.add_argument("--recipe", default=None, help="recipe TOML (default: the bundled one)")
    p.add_argument("--steps", type=int, default=24, help="global batches per setting")
    p.add_argument("--save-at", type=int, default=10, help="step of the checkpoint")
    p.set_defaults(run=__name__)


def _row(name: str, got: list[str], ref: list[str], first: int, secs: float) -> bool:
    same = got == ref[first - 1 : first - 1 + len(got)] and len(got) > 0
    verdict = "identical" if same else _first_diff(got, ref, first)
    steps = f"{first}-{first + len(got) - 1}"
    print(f"| {name:<38} | {steps:<7} | {verdict:<22} | {secs:5.2f} s |")
    return same


def _first_diff(got: list[str], ref: list[str], first: int) -> str:
    for i, d in enumerate(got):
        j = first - 1 + i
        if j >= len(ref) or ref[j] != d:
            return f"differs from step {first + i}"
    return "too short"


def run(args: argparse.Namespace) -> int:
    """Run ``zephon demo``."""
    if args.steps < 2:
        raise RecipeError(f"--steps={args.steps} must be >= 2 (a checkpoint is taken in between)")
    if not 1 <= args.save_at < args.steps:
        raise RecipeError(
            f"--save-at={args.save_at} must be in [1, {args.steps - 1}]: a step before "
            f"--steps={args.steps}, so that the resumed runs have steps to compare"
        )
    recipe_path = Path(args.recipe) if args.recipe else default_recipe_path()
    if args.recipe is None:
        prepare_default(recipe_path)
    pipeline = Pipeline(Recipe.from_toml(recipe_path))
    r = pipeline.recipe
    if r.num_lanes % 4:
        raise RecipeError(
            f"{recipe_path}: the demo runs at dp 1, 2 and 4, so num_lanes={r.num_lanes} must "
            "be a multiple of 4 (zephon verify --dp takes the dp sizes your recipe allows)"
        )
    print(
        f"recipe {recipe_path} (fingerprint {pipeline.fingerprint[:16]}...): "
        f"{r.num_lanes} lanes, global batch {r.global_batch_size}, seq_len {r.seq_len}, "
        f"{pipeline.datasets[0].num_records} documents in {len(pipeline.datasets[0].shards)} shards"
    )

    def run_digests(dp: int, workers: int, **kw: Any) -> tuple[list[str], float]:
        t0 = time.perf_counter()
        out = [
            res.digest for res, _ in simulate(pipeline, dp, args.steps, num_workers=workers, **kw)
        ]
        return out, time.perf_counter() - t0

    print(
        "\n| setting                                | steps   | global batch digests   | time    |"
    )
    print("|----------------------------------------|---------|------------------------|---------|")
    ref, secs = run_digests(1, 1)
    if len(ref) <= args.save_at:
        raise RecipeError(
            f"{recipe_path}: the data ends after step {len(ref)}, before --save-at="
            f"{args.save_at}; give a smaller --save-at"
        )
    if len(ref) < args.steps:  # a finite recipe: compare the steps it has
        print(f"(the data ends after step {len(ref)}: every setting is compared over them)")
        args.steps = len(ref)
    label, head = "reference: dp 1, 1 worker", (ref[0][:16] + "...") if ref else "(no data)"
    steps = f"1-{len(ref)}"
    print(f"| {label:<38} | {steps:<7} | {head:<22} | {secs:5.2f} s |")
    ok = len(ref) == args.steps
    for dp in (1, 2, 4):
        for workers in (1, 2):
            if (dp, workers) == (1, 1):
                continue
            got, secs = run_digests(dp, workers)
            plural = "s" if workers > 1 else ""
            ok &= _row(f"zephon: dp {dp}, {workers} worker{plural}", got, ref, 1, secs)
    saved: dict[str, Any] = {}
    run_digests(2, 2, save_at=args.save_at, on_save=saved.update)
    for dp in (1, 4):
        t0 = time.perf_counter()
        got = [
            res.digest
            for res, _ in simulate(
                pipeline, dp, args.steps - args.save_at, num_workers=2, resume_state=saved
            )
        ]
        name = f"zephon: saved at {args.save_at} on dp 2 -> dp {dp}"
        ok &= _row(name, got, ref, args.save_at + 1, time.perf_counter() - t0)
    naive_ref = naive_digests(pipeline, 1, args.steps)
    naive_same = True
    for dp in (1, 2, 4):
        t0 = time.perf_counter()
        got = naive_digests(pipeline, dp, args.steps)
        same = _row(f"naive rank-sharded: dp {dp}", got, naive_ref, 1, time.perf_counter() - t0)
        naive_same &= same
    print()
    if ok:
        print(
            f"zephon-nodes: all {args.steps} global batches identical across dp 1/2/4, "
            f"1/2 workers and a dp 2 -> 1/4 resume."
        )
    else:
        print("zephon-nodes: MISMATCH (this is a bug; please report it)", file=sys.stderr)
    if not naive_same:
        print("naive rank-sharded loader: its global batches change with the number of ranks.")
    return 0 if ok else 1
