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
    per_op, created = _operator_pools(operator_pools or {}, pool.timeout_s)
    try:
        ranks: list[Multiplexer] = list(nodes or [])
        if nodes is None:
            ranks = [
                pipeline.rank_node(
                    dp_world_size,
                    r,
                    local_batch_size=local_batch_size,
                    pool=pool,
                    lanes=lane_assignment[r] if lane_assignment is not None else None,
                    operator_pools=per_op,
                )
                for r in range(dp_world_size)
            ]
        for node in ranks:
            node.reset(dict(resume_state) if resume_state is not None else None)
        first = ranks[0].step
        _decide(ranks, mixture_updates, first)
        for t in range(first + 1, first + steps + 1):
            before = [node.state_dict() for node in ranks] if on_end is not None else []
            mbs = _global_batch(ranks)
            if mbs is None:
                if on_end is not None:
                    on_end(merge_states(before))
                return
            tokens = sum(int((mb["labels"] != -100).sum()) for mb in mbs)
            rows = sum(int(mb["input"].shape[0]) for mb in mbs)
            result = StepResult(t, digest_microbatches(mbs), rows, tokens)
            _decide(ranks, mixture_updates, t)
            if save_at is not None and t == save_at and on_save is not None:
                on_save(merge_states([node.state_dict() for node in ranks]))
            yield result, (mbs if keep_batches else None)
    finally:
        for p in created:
            p.close()
        if own_pool:
            pool.close()


def _operator_pools(
    specs: Mapping[str, WorkerPool | PoolSpec | str], timeout_s: float
) -> tuple[dict[str, WorkerPool], list[WorkerPool]]:
    """The per-operator pools by operator, and those built here (the caller closes them)."""
    per_op: dict[str, WorkerPool] = {}
    created: list[WorkerPool] = []
    for key, value in specs.items():
        if isinstance(value, WorkerPool):
            per_op[key] = value
        else:
            spec = PoolSpec.parse(value) if isinstance(value, str) else value
            per_op[key] = spec.build(timeout_s)
            created.append(per_op[key])
    return per_op, created


def _global_batch(ranks: Sequence[Multiplexer]) -> list[dict[str, torch.Tensor]] | None:
    """Every rank's micro-batches of one step, in rank order; None when the data ended."""
    mbs: list[dict[str, torch.Tensor]] = []
    try:
        for node in ranks:
            for _ in range(node.micro_per_step):
                mbs.append(next(node))
    except StopIteration:
        return None
    return mbs


def _decide(
    ranks: Sequence[Multiplexer],
    mixture_updates: Sequence[tuple[int, Mapping[str, float]]],
    step: int,
) -> None:
    """Make, on every rank, the mixture decisions taken right after ``step``."""
    for at, weights in mixture_updates:
        if at == step:
            for node in ranks:
                node.set_mixture(weights)
