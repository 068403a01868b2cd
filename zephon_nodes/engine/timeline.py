"""A run as a timeline: segments joined by transitions, each change checked where it is made.

A *segment* is a compiled recipe read by a lane count from a work source, each lane starting at
a known position; a *transition* (a planned stage, an amendment, a re-lane, a new pass, a
mixture update) turns the state at the end of one segment into the state the next one resumes.
A rank node is handed the run's :class:`Timeline` and asks it which segment a state is in
(:meth:`Timeline.segment`: the re-lane's streams and the stage resolved in one place) and to
enter a planned stage when its step comes: the node itself knows nothing of stages or re-lanes,
and a state of any segment resumes on a node built from the run's pipeline. A transition made
offline (``zephon amend``, ``zephon relane``, the TorchTitan adapters) must never write a state
that the next resume refuses: :func:`~zephon_nodes.engine.stages.check_resumes` resumes the
produced state on every lane, as a run would, and refuses the change at once;
:func:`unreachable` reports, for every change the same way, what a finite run can no longer
reach after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from zephon_nodes.engine.relane import for_state
from zephon_nodes.engine.stages import enter_next_stage, segment_for_state
from zephon_nodes.state.schema import LANES_KEY

__all__ = ["Timeline", "Unreachable", "segment_for", "unreachable"]

#: A transition warns when at least this share of the remaining work items is unreachable.
WARN_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class Unreachable:
    """Work items of a finite run left past the end of its shortest lane, after a change.

    A step takes samples from every lane: the data ends when the first lane runs out, and
    what the other lanes still hold then is never used. Counted in work items, this is an
    estimate: the lanes run out in step with each other in samples, so it is exact (to within
    a flush window per lane) when every work item makes the same number of samples; a lane
    whose items hold fewer tokens ends sooner than its count says
    (``tests/stages/test_unreachable_accounting.py``).

    Attributes:
        items: Work items past the shortest lane's end (summed over lanes).
        remaining: Work items the lanes hold in all.
    """

    items: int
    remaining: int

    @property
    def share(self) -> float:
        """``items / remaining`` (0 when nothing remains)."""
        return self.items / self.remaining if self.remaining else 0.0

    def warning(self, change: str) -> str | None:
        """One line for stderr when the share is at least :data:`WARN_SHARE` (else None)."""
        if self.share < WARN_SHARE:
            return None
        return (
            f"warning: after {change}, {self.items} of the {self.remaining} remaining work "
            f"items ({self.share:.0%}) lie past the end of the shortest lane and go unused "
            f"when the finite data ends (counted in work items, an estimate: a lane whose "
            f"items hold fewer tokens runs out sooner); fewer lanes or an earlier checkpoint "
            f"keeps more of the data"
        )


def segment_for(run: Any, state: Mapping[str, Any] | None) -> Any:
    """The segment of ``run``'s timeline that resumes ``state`` (a ``Pipeline``).

    A re-laned state's streams (:func:`~zephon_nodes.engine.relane.for_state`), then the
    stage it is in (:func:`~zephon_nodes.engine.stages.segment_for_state`); ``run`` itself
    for a state of its base recipe. ``None``: the segment a run starts in.

    Raises:
        CheckpointError: If the state's lineage or stage section is malformed or does not fit
            the recipe.
    """
    if state is not None and not isinstance(state, Mapping):
        return run  # not a state at all: the resume's validation says so
    return segment_for_state(for_state(run, state), state)


class Timeline:
    """The timeline of one run, as a rank node reads it.

    Args:
        run: The run's compiled recipe (a ``Pipeline``, re-laned or not).
    """

    def __init__(self, run: Any) -> None:
        self.run = run

    def segment(self, state: Mapping[str, Any] | None) -> Any:
        """The segment that resumes ``state`` (None: the one the run starts in).

        Raises:
            CheckpointError: As :func:`segment_for`.
        """
        return segment_for(self.run, state)

    def enter_planned_stage(self, node: Any) -> None:
        """Move ``node`` (a rank node at the step a planned stage starts after) into it."""
        enter_next_stage(node)

    def __repr__(self) -> str:
        return f"Timeline({self.run!r})"


def unreachable(pipeline: Any, state: Mapping[str, Any]) -> Unreachable | None:
    """What a state leaves unreachable before the end of finite data (None: endless data).

    Counted in work items: per lane, the items from the start of its current flush window
    to its end; what exceeds the shortest lane's count is unreachable. An estimate when work
    items differ in size (:class:`Unreachable`).
    """
    segment = segment_for(pipeline, state)
    source = segment.work_source
    K = segment.recipe.flush_every
    left = []
    for key, position in state[LANES_KEY].items():
        lane = int(key)
        n = source.lane_length(lane)
        if n is None:
            return None
        left.append(max(0, n - source.window_start(lane, int(position[0]), K)))
    if not left:
        return None
    return Unreachable(sum(left) - min(left) * len(left), sum(left))
