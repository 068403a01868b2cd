"""Check a state against the recipe that resumes it, beyond its checksum.

A checksum only proves that the bytes were written by someone. Restoring also checks that
the state is one the running recipe can produce: the same recipe (fingerprint, naming the
fields that differ), the same lane count, every lane the rank owns present, positions
reachable at the saved step and decisions consistent with the positions
(:func:`zephon_nodes.state.mixture.check_effects`). What needs the data (a window beyond the
end of a lane, more samples consumed than a window holds) is checked by the engine with the
numbers it computes (lane lengths, replayed windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.identity import fingerprint_pair, summary_diff
from zephon_nodes.state.invariants import check_stage_invariants
from zephon_nodes.state.schema import FINGERPRINT_KEY, RankState

__all__ = ["check_positions", "check_rank", "check_recipe", "check_replayed", "validate_state"]


def check_recipe(rank: RankState, fingerprint: str, summary: Mapping[str, Any]) -> None:
    """Refuse a state written with another recipe, naming the fields that differ.

    Raises:
        CheckpointError: If the fingerprints differ.
    """
    if rank.fingerprint == fingerprint:
        return
    saved = rank.recipe or None
    diffs = summary_diff(saved, summary)
    if diffs:
        detail = "; ".join(diffs)
    elif saved is not None:
        detail = (
            "every recipe field recorded in the checkpoint matches, so the fingerprint "
            "itself was altered (a damaged or edited state)"
        )
    else:
        detail = "the checkpoint records no readable recipe summary to compare"
    stage = rank.stage if isinstance(rank.stage, Mapping) else {}
    amended = stage.get("amended")
    if isinstance(amended, list) and any(
        isinstance(a, Mapping) and a.get(FINGERPRINT_KEY) == fingerprint for a in amended
    ):
        detail += (
            "; the checkpoint was amended from this recipe (zephon amend): resume it with the "
            "recipe it was amended to"
        )
    raise CheckpointError(
        f"the checkpoint was written with a different recipe (fingerprint "
        f"{fingerprint_pair(rank.fingerprint, fingerprint)}): {detail}"
    )


def validate_state(
    state: Any,
    *,
    fingerprint: str,
    summary: Mapping[str, Any],
    num_lanes: int,
    lanes: Iterable[int],
    samples_per_lane: int | None = None,
    base_step: int = 0,
) -> dict[int, tuple[int, int]]:
    """Check a state against the running recipe and return ``{lane: (window, consumed)}``.

    :func:`check_rank` with the same arguments, keeping only the positions.

    Raises:
        CheckpointError: Naming what is wrong (format, recipe fields, lanes, values).
    """
    rank = check_rank(
        state,
        fingerprint=fingerprint,
        summary=summary,
        num_lanes=num_lanes,
        lanes=lanes,
        samples_per_lane=samples_per_lane,
        base_step=base_step,
    )
    return dict(rank.lanes)


def check_rank(
    state: Any,
    *,
    fingerprint: str,
    summary: Mapping[str, Any],
    num_lanes: int,
    lanes: Iterable[int],
    samples_per_lane: int | None = None,
    base_step: int = 0,
) -> RankState:
    """Check a state against the running recipe and return it parsed.

    Besides structure, types and ranges (:meth:`RankState.from_dict`), the positions are
    checked against the step (:func:`check_positions`) when ``samples_per_lane`` is given
    and the stream was never re-laned (a re-laned lane's position also counts the samples
    its leftovers drop).

    Args:
        state: The loaded state (untrusted).
        fingerprint: Fingerprint of the running recipe.
        summary: Recipe summary of the running recipe
            (:func:`~zephon_nodes.state.identity.recipe_identity`).
        num_lanes: Lane count of the running recipe.
        lanes: Lanes this rank owns; each must be present.
        samples_per_lane: The recipe's ``G / L``; enables the step/position checks.
        base_step: The step the recipe in force started after (a recipe changed mid-run:
            lane positions count from there).

    Raises:
        CheckpointError: Naming what is wrong (format, recipe fields, lanes, values).
    """
    rank = RankState.from_dict(state)
    check_recipe(rank, fingerprint, summary)
    if rank.num_lanes != num_lanes:
        raise CheckpointError(
            f"checkpoint has num_lanes={rank.num_lanes!r}, recipe has {num_lanes=}"
        )
    absent = sorted(set(lanes) - set(rank.lanes))
    if absent:
        raise CheckpointError(f"checkpoint has no state for lane(s) {absent} owned by this rank")
    if rank.stage is not None:
        check_stage_invariants(rank.stage, rank.num_lanes)
    if samples_per_lane is not None and rank.lineage is None:
        if rank.step < base_step:
            raise CheckpointError(
                f"checkpoint step={rank.step} is before the recipe change after step "
                f"{base_step} its positions count from"
            )
        check_positions(rank.lanes, rank.step - base_step, samples_per_lane)
    return rank


def check_positions(
    positions: Mapping[int, tuple[int, int]], step: int, samples_per_lane: int
) -> None:
    """Refuse lane positions that no run reaches after ``step`` steps.

    A lane hands out ``samples_per_lane`` samples per step and its position counts the
    samples taken from its current flush window, so at step 0 every lane is at ``[0, 0]``;
    after it, every lane has taken at least one sample of its window (``consumed >= 1``)
    and at most ``step * samples_per_lane``, exactly that many while it is in window 0.

    Raises:
        CheckpointError: Naming the lane, its position and the step.
    """
    taken = step * samples_per_lane
    for lane, (window, consumed) in sorted(positions.items()):
        if step == 0 and (window, consumed) != (0, 0):
            raise CheckpointError(
                f"checkpoint lane {lane}: position [{window}, {consumed}] at step 0 (before "
                f"any step every lane is at [0, 0])"
            )
        if step == 0:
            continue
        if consumed < 1 or consumed > taken or (window == 0 and consumed != taken):
            expected = f"exactly {taken}" if window == 0 else f"between 1 and {taken}"
            raise CheckpointError(
                f"checkpoint lane {lane}: position [{window}, {consumed}] is inconsistent with "
                f"step={step} (the lane handed out {step} x {samples_per_lane} = {taken} "
                f"samples, so the samples consumed in window {window} must be {expected})"
            )


def check_replayed(
    lane: int,
    saved: tuple[int, int],
    reached: tuple[int, int],
    step: int,
    samples: int,
) -> None:
    """Refuse a lane position that is not where the lane's replayed stream is after ``step``.

    The engine replays the lane from the start of its pass (or of its re-lane) for
    ``samples`` samples (``step x G/L``, less the steps before a re-lane) and passes the
    position it reached: a legitimate state holds exactly that position.

    Raises:
        CheckpointError: Naming the lane, both positions and the step.
    """
    if tuple(saved) == tuple(reached):
        return
    raise CheckpointError(
        f"checkpoint lanes[{str(lane)!r}]: position [{saved[0]}, {saved[1]}] is not reachable "
        f"at step={step}: replaying the lane for those {samples} samples ends at "
        f"[{reached[0]}, {reached[1]}] (the step, the lane positions or the lanes' order were "
        f"edited)"
    )
