"""A restore's check by replay: a saved position must be the one the lane's stream reaches.

A checksum only proves who wrote a state; replaying a lane from the start of its pass (or of
the change its positions count from) to the saved step proves the position is reachable.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.lane import Lane
from zephon_nodes.engine.parallel_map import replaying, run_together
from zephon_nodes.state.schema import STEP_KEY
from zephon_nodes.state.validate import check_replayed

__all__ = ["REPLAY_CHECK_SAMPLES", "check_by_replay"]

REPLAY_CHECK_SAMPLES = 256
"""A restore replays each lane from the start of its pass to check its saved position
exactly while the lane has handed out at most this many samples of the pass (later, the
position is checked against the step's bounds and by the lane's ``last_sample`` check,
:mod:`zephon_nodes.state.last_sample`; see ``docs/checkpoint.md``)."""


def check_by_replay(
    node: Any,
    positions: Mapping[int, tuple[int, int]],
    step: int,
    pass_index: int,
    lineage: Any,
) -> bool:
    """Replay each lane ``node`` owns from the start of its pass to the saved step, if short.

    A legitimate state holds exactly the position each lane reaches after
    ``step x G/L`` samples of its pass (counted from the re-lane point for a re-laned
    pass 0), so an edited step, a moved position or swapped lanes are refused, naming
    the lane (:func:`~zephon_nodes.state.validate.check_replayed`). Done only while that
    is at most :data:`REPLAY_CHECK_SAMPLES` samples per lane. The lanes replay together
    (:func:`~zephon_nodes.engine.parallel_map.run_together`); the first lane refused, in
    lane order, is named.

    Returns:
        True if the lanes were replayed: each then stands at its saved position, exactly
        where restoring that position would put it, so the restore need not replay the
        lanes again. False if the check did not apply (the lanes were not touched).
    """
    base = node.pipeline.base_step  # positions count from the recipe's last change
    if lineage is not None and not pass_index and isinstance(lineage, Mapping):
        base = int(lineage.get(STEP_KEY, 0))
    samples = (step - base) * node.samples_per_lane
    if not 0 < samples <= REPLAY_CHECK_SAMPLES:
        return False
    with replaying(list(node.lanes.values())):
        run_together(
            [
                partial(_replay_lane, i, lane, positions[i], step, samples, pass_index)
                for i, lane in node.lanes.items()
            ]
        )
    return True


def _replay_lane(
    i: int, lane: Lane, saved: tuple[int, int], step: int, samples: int, pass_index: int
) -> None:
    """Replay lane ``i`` from the start of its pass for ``samples`` samples; check the position."""
    lane.reset({Lane.WINDOW_KEY: 0, Lane.CONSUMED_KEY: 0, Lane.PASS_KEY: pass_index})
    for k in range(samples):
        try:
            next(lane)
        except StopIteration:
            raise CheckpointError(
                f"checkpoint lanes[{str(i)!r}]: position {list(saved)} is not "
                f"reachable at step={step}: the lane's stream ends after {k} of the "
                f"{samples} samples the steps took"
            ) from None
    st = lane.get_state()
    check_replayed(i, saved, (st[Lane.WINDOW_KEY], st[Lane.CONSUMED_KEY]), step, samples)
