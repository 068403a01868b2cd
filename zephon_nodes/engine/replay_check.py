"""A restore's check by replay: a saved position must be the one the lane's stream reaches.

A checksum only proves who wrote a state; replaying a lane from the start of its pass (or of
the change its positions count from) to the saved step proves the position is reachable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.lane import Lane
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
) -> None:
    """Replay each lane ``node`` owns from the start of its pass to the saved step, if short.

    A legitimate state holds exactly the position each lane reaches after
    ``step x G/L`` samples of its pass (counted from the re-lane point for a re-laned
    pass 0), so an edited step, a moved position or swapped lanes are refused, naming
    the lane (:func:`~zephon_nodes.state.validate.check_replayed`). Done only while that
    is at most :data:`REPLAY_CHECK_SAMPLES` samples per lane.
    """
    base = node.pipeline.base_step  # positions count from the recipe's last change
    if lineage is not None and not pass_index and isinstance(lineage, Mapping):
        base = int(lineage.get(STEP_KEY, 0))
    samples = (step - base) * node.samples_per_lane
    if not 0 < samples <= REPLAY_CHECK_SAMPLES:
        return
    start = {Lane.WINDOW_KEY: 0, Lane.CONSUMED_KEY: 0, Lane.PASS_KEY: pass_index}
    for i, lane in node.lanes.items():
        lane.reset(dict(start))
        for k in range(samples):
            try:
                next(lane)
            except StopIteration:
                raise CheckpointError(
                    f"checkpoint lanes[{str(i)!r}]: position {list(positions[i])} is not "
                    f"reachable at step={step}: the lane's stream ends after {k} of the "
                    f"{samples} samples the steps took"
                ) from None
        st = lane.get_state()
        check_replayed(i, positions[i], (st[Lane.WINDOW_KEY], st[Lane.CONSUMED_KEY]), step, samples)
