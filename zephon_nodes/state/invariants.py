"""Invariants of a state that cost no replay: fields that must agree with each other.

A state's checksum (:mod:`zephon_nodes.state.codec`) proves that its bytes are the ones
written, not that the values are right: anyone who edits a state can reseal it with
:func:`~zephon_nodes.state.codec.encode_checked`. Beyond the seal and the checks against the
recipe (:mod:`zephon_nodes.state.validate`), the ``stage`` section carries values that
depend on each other, checked here without reading any data:

- a lane's *head* (the work item a change cut, whose unused records the lane reads first)
  is the last item the lane read of its dataset before the stage: when it names its dataset
  by position in the lane's stream (``1 <= head <= n``), its count ``head_t`` is that
  dataset's count ``t - 1`` (so ``t >= 1``);
- a lane without a head (``head = 0``) has ``head_t = head_r = 0``;
- the amendments are in step order and none is after the step the stage started after.

What these do not cover is named in ``docs/checkpoint.md`` ("What the seal protects
against"): among others a count ``t`` of a dataset that is not the lane's head, the head's
first record and the dropped-sample and dropped-token counters (reported as recorded, not
verified).
"""

from __future__ import annotations

import itertools
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.schema import STEP_KEY
from zephon_nodes.state.stage import StageState

__all__ = ["check_stage_invariants"]

_WHERE = "checkpoint 'stage'"


def check_stage_invariants(raw: Any, num_lanes: int) -> None:
    """Refuse a ``stage`` section whose values cannot have been written together.

    Args:
        raw: The state's ``stage`` section (untrusted; its structure is checked first by
            :meth:`~zephon_nodes.state.stage.StageState.from_state`).
        num_lanes: The state's lane count.

    Raises:
        CheckpointError: Naming the lane, the field and both values.
    """
    stage = StageState.from_state(raw, num_lanes)
    for lane, row in stage.lanes.items():
        _check_head(stage, lane, row)
    _check_amended(stage)


def _check_head(stage: StageState, lane: int, row: tuple[int, ...]) -> None:
    n = len(stage.names)
    head, head_t, head_r = row[n], row[n + 1], row[n + 2]
    field = f"{_WHERE} lanes[{str(lane)!r}]"
    if head == 0:
        if head_t or head_r:
            raise CheckpointError(
                f"{field}: no head (head=0) but head count={head_t} and first record="
                f"{head_r} (both are 0 without a head: the row was edited)"
            )
        return
    if head > n:  # named by its global index in the dataset's stream (after a re-lane)
        return
    name = stage.names[head - 1]
    t = row[head - 1]
    if head_t != t - 1:
        raise CheckpointError(
            f"{field}: the head is work item {head_t} of dataset {name!r}, but the lane read "
            f"{t} item(s) of {name!r} before the stage (t[{name!r}]={t}): the head is the "
            f"last of them, item {t - 1} (the count or the head was edited)"
        )


def _check_amended(stage: StageState) -> None:
    steps = [int(a[STEP_KEY]) for a in stage.amended]
    if any(a > b for a, b in itertools.pairwise(steps)):
        raise CheckpointError(f"{_WHERE}: the amendments' steps {steps} are not in order")
    if steps and steps[-1] > stage.step:
        raise CheckpointError(
            f"{_WHERE}: amended after step {steps[-1]}, later than the step the stage started "
            f"after (step={stage.step})"
        )
