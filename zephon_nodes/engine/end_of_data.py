"""The end of finite data: count, per lane, the samples no global batch delivered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.errors import CheckpointError

__all__ = ["format_unused", "unused_samples"]


def unused_samples(
    pipeline: Pipeline, state: Mapping[str, Any], pool: WorkerPool | None = None
) -> dict[int, int]:
    """Count the samples every lane holds after the last full global batch.

    ``state`` is the merged state after the last step the data could fill (any dp size's,
    merged with :func:`~zephon_nodes.engine.checkpoint.merge_states`). One rank node over
    every lane resumes there and drains the lanes, so the count does not depend on the dp
    size, the workers or the runner.

    Returns:
        ``{lane: samples never delivered}``, every lane included.

    Raises:
        CheckpointError: If the data does not end at ``state`` (a full step still fits).
    """
    from zephon_nodes.engine.relane import for_state

    pipeline = for_state(pipeline, state)  # a re-laned checkpoint's streams
    own = pool is None
    pool = pool if pool is not None else WorkerPool(0, "thread")
    try:
        node = pipeline.rank_node(lanes=list(range(pipeline.num_lanes)), pool=pool)
        node.reset(dict(state))
        try:
            next(node)
        except StopIteration:
            return node.unused_samples()
        raise CheckpointError(
            f"the data does not end after step {state.get('step')}: another global batch fits"
        )
    finally:
        if own:
            pool.close()


def format_unused(unused: Mapping[int, int], delivered: int) -> str:
    """One line: total unused samples, their share, and the count per lane."""
    total = sum(unused.values())
    share = total / (total + delivered) if total + delivered else 0.0
    per_lane = ", ".join(f"{lane}: {n}" for lane, n in sorted(unused.items()))
    return f"{total} of {total + delivered} samples unused ({share:.2%}); per lane: {{{per_lane}}}"
