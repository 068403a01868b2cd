"""Simulate ``R`` data-parallel ranks in one process and digest every global batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.operator_pools import PoolSpec
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.state.merge import merge_states
from zephon_nodes.verification.digest import digest_microbatches

__all__ = ["StepResult", "simulate"]


@dataclass(frozen=True)
class StepResult:
    """One global batch: its step number (from 1), digest, and the batch rows' count."""

    step: int
    digest: str
    rows: int
    tokens: int


def simulate(
    pipeline: Pipeline,
    dp_world_size: int,
    steps: int,
    *,
    num_workers: int = 2,
    runner: str = "thread",
    local_batch_size: int | None = None,
    lane_assignment: Sequence[Sequence[int]] | None = None,
    resume_state: Mapping[str, Any] | None = None,
    save_at: int | None = None,
    on_save: Callable[[dict[str, Any]], None] | None = None,
    pool: WorkerPool | None = None,
    keep_batches: bool = False,
    operator_pools: Mapping[str, WorkerPool | PoolSpec | str] | None = None,
    mixture_updates: Sequence[tuple[int, Mapping[str, float]]] = (),
    on_end: Callable[[dict[str, Any]], None] | None = None,
    nodes: Sequence[Any] | None = None,
) -> Iterator[tuple[StepResult, list[dict[str, torch.Tensor]] | None]]:
    """Run ``dp_world_size`` rank multiplexers and yield each global batch's digest.

    Args:
        pipeline: The compiled recipe.
        dp_world_size: Number of simulated ranks.
        steps: Steps to produce (after the resumed step, if any).
        num_workers: Workers of the (shared) pool.
        runner: ``"thread"`` or ``"process"``.
        local_batch_size: Micro-batch size per rank (default: one micro-batch per step).
        lane_assignment: Lanes of each rank (default: contiguous blocks).
        resume_state: A merged global state to resume from.
        save_at: Call ``on_save`` with the merged state after this step.
        on_save: Receives the merged state.
        pool: A pool to use instead of creating one.
        keep_batches: Also yield the step's micro-batches.
        operator_pools: Per-operator pools (see :meth:`Pipeline.rank_node`); pools made from
            specs are shared by the simulated ranks and closed at the end.
        mixture_updates: Decisions ``(step, weights)``: each is made on every rank right
            after ``step`` (before a save at that step); entries before the first step run
            here must already be in ``resume_state``.
        on_end: When the data ends, receives the merged state after the last full global
            batch (see :func:`~zephon_nodes.engine.end_of_data.unused_samples`).
        nodes: The ranks' nodes, built by the caller (e.g. each a
            :class:`~zephon_nodes.engine.child.ChildRankNode`); then the pool arguments
            are not used.

    Yields:
        ``(StepResult, micro-batches or None)`` per step; ends early when the data ends.
    """
    check_setting("dp_world_size", dp_world_size)
    check_setting("steps", steps)
    if save_at is not None:
        check_setting("save_at", save_at)
    if nodes is not None:  # the nodes' own pools do the work: an inline one, never used
        pool, num_workers, runner, operator_pools = None, 0, "thread", None
    own_pool = pool is None
    pool = pool if pool is not None else WorkerPool(num_workers, runner)
    created: list[WorkerPool] = []
    per_op: dict[str, WorkerPool] = {}
    for key, value in (operator_pools or {}).items():
        if isinstance(value, WorkerPool):
            per_op[key] = value
        else:
            spec = PoolSpec.parse(value) if isinstance(value, str) else value
            per_op[key] = spec.build(pool.timeout_s)
            created.append(per_op[key])
    if resume_state is not None and nodes is None:
        from zephon_nodes.engine.relane import for_state

        pipeline = for_state(pipeline, resume_state)  # a re-laned checkpoint's streams
    try:
        ranks: list[Multiplexer] = list(nodes or [])
        for r in range(dp_world_size if nodes is None else 0):
            lanes = lane_assignment[r] if lane_assignment is not None else None
            ranks.append(
                pipeline.rank_node(
                    dp_world_size,
                    r,
                    local_batch_size=local_batch_size,
                    pool=pool,
                    lanes=lanes,
                    operator_pools=per_op,
                )
            )
        for node in ranks:
            node.reset(dict(resume_state) if resume_state is not None else None)
        first = ranks[0].step

        def decide(step: int) -> None:
            for at, weights in mixture_updates:
                if at == step:
                    for node in ranks:
                        node.set_mixture(weights)

        decide(first)
        for t in range(first + 1, first + steps + 1):
            mbs: list[dict[str, torch.Tensor]] = []
            before = [node.state_dict() for node in ranks] if on_end is not None else []
            try:
                for node in ranks:
                    for _ in range(node.micro_per_step):
                        mbs.append(next(node))
            except StopIteration:
                if on_end is not None:
                    on_end(merge_states(before))
                return
            tokens = sum(int((mb["labels"] != -100).sum()) for mb in mbs)
            rows = sum(int(mb["input"].shape[0]) for mb in mbs)
            result = StepResult(t, digest_microbatches(mbs), rows, tokens)
            decide(t)
            if save_at is not None and t == save_at and on_save is not None:
                on_save(merge_states([node.state_dict() for node in ranks]))
            yield result, (mbs if keep_batches else None)
    finally:
        for p in created:
            p.close()
        if own_pool:
            pool.close()
