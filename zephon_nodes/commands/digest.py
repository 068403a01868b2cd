"""``zephon digest``: print the SHA-256 of every global batch as JSON lines."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from zephon_nodes.commands.cache import add_token_cache_args, settings_from_args
from zephon_nodes.commands.options import add_workers_arg
from zephon_nodes.commands.progress import progress_bar
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import Settings, using
from zephon_nodes.engine.child import ChildRankNode
from zephon_nodes.engine.end_of_data import end_counts, format_unused
from zephon_nodes.engine.mixture_log import (
    read_updates,
    refuse_updates_after_stages,
    updates_after,
)
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.operator_pools import (
    OPERATOR_WORKERS_HELP,
    PoolSpec,
    operator_workers_arg,
)
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import RUNNERS, WorkerPool
from zephon_nodes.engine.relane import for_state
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.files import check_writable, load_state, save_state
from zephon_nodes.state.schema import STAGE_KEY, STEP_KEY, RankState
from zephon_nodes.verification.dump import write_sources, write_step
from zephon_nodes.verification.simulate import simulate

__all__ = ["ENGINES", "add_parser", "build_rank_node", "child_ranks", "run"]

#: Where each simulated rank's node runs: in this process, or in a child process of its own.
ENGINES = ("thread", "process")


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
    add_workers_arg(p)
    p.add_argument("--runner", choices=RUNNERS, default="thread", help="worker runner")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="thread",
        help="where each rank's node runs: in this process (thread, the default) or in a "
        "child process of its own whose batches come back through shared memory (process; "
        "each child has its own pool of --num-workers); never changes a digest",
    )
    p.add_argument(
        "--local-batch-size",
        type=int,
        default=None,
        help="micro-batch size per rank (default: the rank's whole share of a step, "
        "global batch / dp size: one micro-batch per step)",
    )
    p.add_argument(
        "--operator-workers",
        type=operator_workers_arg,
        default=None,
        metavar="OP=RUNNER:N,...",
        help=OPERATOR_WORKERS_HELP,
    )
    p.add_argument("--save-at", type=int, default=None, help="save the state after step K")
    p.add_argument("--checkpoint-dir", default=None, help="where --save-at writes the state")
    p.add_argument("--resume-from", default=None, help="checkpoint directory to resume from")
    p.add_argument(
        "--cache-limit",
        default=None,
        help="node cache size, e.g. 50G (default: $ZEPHON_CACHE_LIMIT, else min(50%% of "
        "free disk, 100G)); never changes a digest",
    )
    p.add_argument(
        "--dump-batches",
        default=None,
        metavar="DIR",
        help="also write each global batch as DIR/step-SSSSSSSS.npz, with each token's "
        "shard and record, and DIR/sources.json (see zephon digest-dump)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="show a live progress bar on stderr (stdout keeps only the JSON lines)",
    )
    p.add_argument(
        "--mixture-updates",
        default=None,
        metavar="FILE",
        help='JSON list of decisions [{"step": 5, "weights": {"web": 0.2, "code": 0.8}}, ...], '
        "each made after its step (dynamic mixture)",
    )
    add_token_cache_args(p)
    p.set_defaults(run=__name__)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon digest`` (inside the settings its flags give, see core/settings)."""
    with using(settings_from_args(args)):
        return _run(args)


def _check_save_args(args: argparse.Namespace) -> None:
    if (args.save_at is None) != (args.checkpoint_dir is None):
        raise RecipeError("--save-at and --checkpoint-dir must be given together")
    if args.checkpoint_dir is not None:
        check_writable(args.checkpoint_dir)  # now, not when the save step is reached
    if args.dump_batches is not None:
        try:
            os.makedirs(args.dump_batches, exist_ok=True)
        except OSError as e:
            raise RecipeError(
                f"--dump-batches {args.dump_batches}: cannot make the dump folder: "
                f"{e.strerror or e}"
            ) from None


def _check_save_at(args: argparse.Namespace, first: int, resumed: bool) -> None:
    if args.save_at is not None and not first < args.save_at <= first + args.steps:
        raise RecipeError(
            f"--save-at={args.save_at} must be a step this run produces, in "
            f"[{first + 1}, {first + args.steps}] (--steps={args.steps}"
            + (f" after the resumed step {first})" if resumed else ")")
        )


def _mixture_updates(
    args: argparse.Namespace, pipeline: Pipeline, resume: dict[str, Any] | None
) -> list[tuple[int, dict[str, float]]]:
    if not args.mixture_updates:
        return []
    names = [d.name for d in pipeline.recipe.datasets]
    updates = updates_after(
        read_updates(args.mixture_updates, names), resume, names, "--mixture-updates"
    )
    stage_steps = [s.start_step for s in pipeline.recipe.stages]
    refuse_updates_after_stages(updates, stage_steps, "--mixture-updates")
    if resume is not None and resume.get(STAGE_KEY) is not None and updates:
        raise RecipeError(
            f"--mixture-updates: decision after step {updates[0][0]}: set_mixture is not "
            f"supported after a recipe change (the checkpoint was written after one); give "
            f"the weights as a stage's `weights` or amend the recipe"
        )
    return updates


def _check_produced(
    args: argparse.Namespace, produced: int, last: int, saved: list[int], resumed: bool
) -> None:
    if produced == 0 and args.steps > 0 and not resumed:
        raise RecipeError(
            f"{args.recipe}: the recipe produced no global batch (its data ends before step 1)"
        )
    if args.save_at is not None and not saved:
        raise RecipeError(
            f"the data ended after step {last}, before --save-at={args.save_at}: no state "
            f"was saved to {args.checkpoint_dir}"
        )


def _report(
    args: argparse.Namespace,
    pipeline: Pipeline,
    produced: int,
    last: int,
    ended: dict[str, Any],
) -> None:
    skipped = {name: files for name, files in pipeline.skipped_files.items() if files}
    if skipped:
        print(f"zephon digest: files left out, by dataset and reason: {skipped}", file=sys.stderr)
    cache = pipeline.cache_stats()
    # The counters are printed when a limit was asked for (--cache-limit, ZEPHON_CACHE_LIMIT):
    # the default-bounded cache of every .zst read would add a line to every run.
    if cache is not None and pipeline.settings.cache_limit is not None:
        print(f"zephon digest: node cache {json.dumps(cache, sort_keys=True)}", file=sys.stderr)
    tokens_cached = pipeline.token_cache_stats()
    if tokens_cached is not None:
        line = json.dumps(tokens_cached, sort_keys=True)
        print(f"zephon digest: token cache {line}", file=sys.stderr)
    if produced < args.steps:
        print(
            f"zephon digest: the data ended after step {last} ({produced} of {args.steps} "
            f"steps produced; a finite recipe stops after its last full global batch)",
            file=sys.stderr,
        )
    if ended:
        unused, endless = end_counts(pipeline, ended)
        delivered = int(ended[STEP_KEY]) * pipeline.recipe.global_batch_size
        line = format_unused(unused, delivered, endless)
        print(f"zephon digest: end of data: {line}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    _check_save_args(args)
    # A dump says where each token came from (source_shard, source_record; not digested).
    pipeline = Pipeline(Recipe.from_toml(args.recipe), trace=args.dump_batches is not None)
    pipeline.check_produces()
    resume = load_state(args.resume_from) if args.resume_from else None
    first = RankState.from_dict(resume).step if resume else 0
    _check_save_at(args, first, bool(resume))
    saved: list[int] = []
    updates = _mixture_updates(args, pipeline, resume)

    def on_save(state: dict[str, Any]) -> None:
        path = save_state(args.checkpoint_dir, state)
        saved.append(state[STEP_KEY])
        print(f"saved state after step {state[STEP_KEY]} to {path}", file=sys.stderr)

    produced = 0
    last = first
    bar = progress_bar(args.steps, pipeline.recipe.seq_len) if args.progress else None
    ended: dict[str, Any] = {}
    with _engine_nodes(args, pipeline, resume) as nodes:
        for result, mbs in simulate(
            pipeline,
            args.dp_world_size,
            args.steps,
            num_workers=args.num_workers,
            runner=args.runner,
            local_batch_size=args.local_batch_size,
            resume_state=resume,
            save_at=args.save_at,
            on_save=on_save,
            operator_pools=args.operator_workers,
            on_end=ended.update,
            keep_batches=args.dump_batches is not None,
            mixture_updates=updates,
            nodes=nodes,
        ):
            if mbs is not None:
                write_step(args.dump_batches, result.step, mbs)
            print(json.dumps({"step": result.step, "digest": result.digest}), flush=True)
            produced += 1
            last = result.step
            if bar is not None:
                bar.update(result)
    if bar is not None:
        bar.close()
    if args.dump_batches is not None and produced:
        write_sources(args.dump_batches, pipeline)
    _check_produced(args, produced, last, saved, bool(resume))
    _report(args, pipeline, produced, last, ended)
    return 0


@contextlib.contextmanager
def _engine_nodes(
    args: argparse.Namespace, pipeline: Pipeline, resume: Mapping[str, Any] | None
) -> Iterator[list[ChildRankNode] | None]:
    """The ranks' nodes of ``--engine process`` (closed at the end); None for thread."""
    if args.engine != "process":
        yield None
        return
    nodes = child_ranks(
        pipeline,
        args.dp_world_size,
        num_workers=args.num_workers,
        runner=args.runner,
        local_batch_size=args.local_batch_size,
        resume_state=resume,
        operator_pools=args.operator_workers,
    )
    try:
        yield nodes
    finally:
        for node in nodes:
            node.close()


def child_ranks(
    pipeline: Pipeline,
    dp_world_size: int,
    *,
    num_workers: int = 2,
    runner: str = "thread",
    local_batch_size: int | None = None,
    resume_state: Mapping[str, Any] | None = None,
    operator_pools: Mapping[str, PoolSpec | str] | None = None,
) -> list[ChildRankNode]:
    """One :class:`ChildRankNode` per rank, each building ``pipeline``'s recipe in its child.

    Raises:
        RecipeError: If the pipeline has torchdata stages (not picklable: built here).
    """
    if pipeline.stages:
        raise RecipeError("--engine process does not take torchdata stages (Pipeline(stages=))")
    return [
        ChildRankNode(
            functools.partial(
                build_rank_node,
                pipeline.recipe,
                pipeline.settings,
                dp_world_size,
                r,
                provenance=pipeline.provenance,
                trace=pipeline.trace,
                relane_state=dict(resume_state) if resume_state is not None else None,
                num_workers=num_workers,
                runner=runner,
                local_batch_size=local_batch_size,
                operator_pools=dict(operator_pools or {}),
            ),
            label=f"rank {r}",
        )
        for r in range(dp_world_size)
    ]


def build_rank_node(
    recipe: Recipe,
    settings: Settings,
    dp_world_size: int,
    dp_rank: int,
    *,
    provenance: bool = True,
    trace: bool = False,
    relane_state: Mapping[str, Any] | None = None,
    num_workers: int = 2,
    runner: str = "thread",
    local_batch_size: int | None = None,
    lanes: Sequence[int] | None = None,
    operator_pools: Mapping[str, PoolSpec | str] | None = None,
) -> Multiplexer:
    """Build one rank's node with a pool of its own (the factory of a :class:`ChildRankNode`).

    Args:
        recipe: The recipe.
        settings: The physical settings the pipeline runs under.
        dp_world_size: Number of data-parallel ranks.
        dp_rank: This rank.
        provenance: See :class:`~zephon_nodes.engine.pipeline.Pipeline`.
        trace: See :class:`~zephon_nodes.engine.pipeline.Pipeline`.
        relane_state: A state to resume from: a re-laned checkpoint reads its own streams.
        num_workers: Workers of the rank's pool.
        runner: The pool's runner.
        local_batch_size: Micro-batch size (default one micro-batch per step).
        lanes: Explicit lanes (default: the rank's share).
        operator_pools: Per-operator pool specs (see ``--operator-workers``).
    """
    with using(settings):
        pipeline = Pipeline(recipe, provenance=provenance, settings=settings, trace=trace)
        if relane_state is not None:
            pipeline = for_state(pipeline, relane_state)
        pool = WorkerPool(num_workers, runner, settings=settings)
        try:
            node = pipeline.rank_node(
                dp_world_size,
                dp_rank,
                local_batch_size=local_batch_size,
                pool=pool,
                lanes=lanes,
                operator_pools=operator_pools,
            )
        except BaseException:
            pool.close()
            raise
        node.own([pool])
        return node
