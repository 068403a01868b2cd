"""The checks of a rank state before a rank node restores it, shared by every caller.

:func:`check_rank_state` is what a rank node (``Multiplexer._restore``) checks before its
lanes replay: the state's recipe, lanes, step and positions, the stage the state is in, a
re-lane's lineage and the mixture log. A loader that validates a checkpoint when it is
loaded, before iteration starts (the TorchTitan adapters' ``load_state_dict``), calls the same
function, so both refuse the same states with the same messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.engine.timeline import segment_for
from zephon_nodes.state.lineage import check_lineage
from zephon_nodes.state.mixture import MIXTURE_KEY, check_effects, parse_mixture_state
from zephon_nodes.state.schema import LINEAGE_KEY, STEP_KEY
from zephon_nodes.state.validate import check_rank

__all__ = ["CheckedState", "check_rank_state"]


@dataclass(frozen=True)
class CheckedState:
    """What a checked rank state restores: its segment, each lane's position, its mixture log.

    Attributes:
        segment: The segment (a ``Pipeline``) the state is in.
        positions: ``{lane: (flush window, samples consumed in it)}`` for the rank's lanes.
        mixture: The state's mixture log (``state.mixture``), parsed.
        last_sample: ``{lane: check}`` of the state's ``last_sample`` section (None: a state
            written before it existed; see :mod:`zephon_nodes.state.last_sample`).
    """

    segment: Any
    positions: dict[int, tuple[int, int]]
    mixture: Any
    last_sample: dict[int, int] | None = None


def check_rank_state(pipeline: Any, state: Mapping[str, Any], lanes: Iterable[int]) -> CheckedState:
    """Check ``state`` for the rank that owns ``lanes`` of ``pipeline``'s run.

    Args:
        pipeline: The run's compiled recipe (a ``Pipeline``; a re-laned state, a recipe with
            stages or an amendment is checked against the segment the state is in:
            :func:`~zephon_nodes.engine.timeline.segment_for`).
        state: The rank state (plain data).
        lanes: The lanes the rank owns.

    Returns:
        The segment the state is in, the lanes' positions and the mixture log.

    Raises:
        CheckpointError: Naming what differs (recipe fields, lanes, step, positions,
            lineage, mixture log).
        RecipeError: A state whose stage cannot run on this rank's lanes.
    """
    own = list(lanes)
    segment = segment_for(pipeline, state)
    samples = segment.recipe.samples_per_lane
    rank = check_rank(
        dict(state) if isinstance(state, Mapping) else state,  # check_rank names a non-dict
        fingerprint=segment.fingerprint,
        summary=segment.summary,
        num_lanes=segment.num_lanes,
        lanes=own,
        samples_per_lane=samples,
        base_step=segment.base_step,
    )
    positions = dict(rank.lanes)
    if segment.stage is not None:
        segment.stage.require_lanes(own)
    check_lineage(state.get(LINEAGE_KEY), segment.lineage)
    step = state[STEP_KEY]
    mixture = parse_mixture_state(
        state.get(MIXTURE_KEY), [d.name for d in segment.recipe.datasets], own, step
    )
    if state.get(LINEAGE_KEY) is None:
        check_effects(mixture, positions, step, samples)
    last = None if rank.last_sample is None else dict(rank.last_sample)
    return CheckedState(segment, positions, mixture, last)
