"""The end of finite data: count, per lane, the samples no global batch delivered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool

__all__ = ["all_ranks_continue", "end_counts", "format_unused", "unused_samples"]


def unused_samples(
    pipeline: Pipeline, state: Mapping[str, Any], pool: WorkerPool | None = None
) -> dict[int, int]:
    """Count the samples every lane that ends holds after the last full global batch.

    ``state`` is the merged state after the last step the data could fill (any dp size's,
    merged with :func:`~zephon_nodes.state.merge_states`). One rank node over
    every lane resumes there and drains the lanes, so the count does not depend on the dp
    size, the workers or the runner.

    Returns:
        ``{lane: samples never delivered}``, every lane included but those that never end
        (see :func:`end_counts`).

    Raises:
        CheckpointError: If the data does not end at ``state`` (a full step still fits).
    """
    return end_counts(pipeline, state, pool)[0]


def end_counts(
    pipeline: Pipeline, state: Mapping[str, Any], pool: WorkerPool | None = None
) -> tuple[dict[int, int], list[int]]:
    """:func:`unused_samples`, and the lanes that never end (not drained: they have no end).

    A mixture's lane whose ``"end"`` datasets a decision paused while a ``"repeat"`` one
    goes on never ends (``Multiplexer.endless_lanes``); the data ended where another lane
    ran dry.

    Raises:
        CheckpointError: If the data does not end at ``state`` (a full step still fits).
    """
    own = pool is None
    pool = pool if pool is not None else WorkerPool(0, "thread")
    try:
        node = pipeline.rank_node(lanes=list(range(pipeline.num_lanes)), pool=pool)
        node.reset(dict(state))
        try:
            next(node)
        except StopIteration:
            return node.unused_samples(), node.endless_lanes()
        raise CheckpointError(
            f"the data does not end after step {state.get('step')}: another global batch fits"
        )
    finally:
        if own:
            pool.close()


def format_unused(unused: Mapping[int, int], delivered: int, endless: Sequence[int] = ()) -> str:
    """One line: total unused samples, their share, the count per lane, the endless lanes."""
    total = sum(unused.values())
    share = total / (total + delivered) if total + delivered else 0.0
    per_lane = ", ".join(f"{lane}: {n}" for lane, n in sorted(unused.items()))
    line = f"{total} of {total + delivered} samples unused ({share:.2%}); per lane: {{{per_lane}}}"
    if endless:
        line += (
            f"; lanes {list(endless)} never end (their 'end' datasets have weight 0), not counted"
        )
    return line


def all_ranks_continue(has_next: bool, group: Any = None) -> bool:
    """Agree across the ranks of ``group`` whether the next step exists on every rank.

    A finite stream ends, on each rank, when one of its own lanes cannot fill the next step;
    lanes end at different steps, so without agreement one rank could stop while another
    goes on into a collective and hangs. One ``all_reduce`` (MIN) of one integer: True only
    if every rank has the step. Returns ``has_next`` unchanged when ``torch.distributed`` is
    not initialized or the group has one rank. Call it once per step, on every rank.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return has_next
    flag = torch.tensor([1 if has_next else 0], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        flag = flag.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
