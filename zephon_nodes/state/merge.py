"""Merge the states of all ranks (disjoint lanes) into one global state for any dp size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.locate import unwrap_state
from zephon_nodes.state.mixture import merge_mixtures
from zephon_nodes.state.schema import (
    FINGERPRINT_KEY,
    FORMAT_KEY,
    LANES_KEY,
    LAST_SAMPLE_KEY,
    LAYOUT_KEY,
    LINEAGE_KEY,
    MICRO_KEY,
    MIXTURE_KEY,
    NUM_LANES_KEY,
    PASS_KEY,
    STAGE_KEY,
    STEP_KEY,
)
from zephon_nodes.state.stage import merge_stage_sections

__all__ = ["merge_last_samples", "merge_states"]


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the states of all ranks (each holding its own lanes) into one global state.

    Each state may also be a whole ``torchdata.nodes.Loader`` state (see
    :func:`unwrap_state`).

    Raises:
        CheckpointError: If the ranks disagree on recipe or step, are mid-step, or overlap.
    """
    if not states:
        raise CheckpointError("no states to merge")
    states = [unwrap_state(s) for s in states]
    first = states[0]
    lanes: dict[str, Any] = {}
    for s in states:
        if not isinstance(s, Mapping) or not isinstance(s.get(LANES_KEY), Mapping):
            raise CheckpointError(f"each rank state must be a dict with a {LANES_KEY!r} dict")
        bad = [k for k in s[LANES_KEY] if not (isinstance(k, str) and k.isascii() and k.isdigit())]
        if bad:
            raise CheckpointError(f"checkpoint lane key(s) {bad[:4]} are not lane numbers")
        for key in (FORMAT_KEY, FINGERPRINT_KEY, NUM_LANES_KEY, STEP_KEY, PASS_KEY, LINEAGE_KEY):
            if s.get(key) != first.get(key):
                raise CheckpointError(
                    f"ranks disagree on {key}: {first.get(key)!r} vs {s.get(key)!r}"
                )
        if s.get(MICRO_KEY, 0) != 0:
            raise CheckpointError("cannot merge states taken in the middle of a step")
        overlap = set(lanes) & set(s[LANES_KEY])
        if overlap:
            raise CheckpointError(f"lanes {sorted(overlap)} appear in more than one rank state")
        lanes.update(s[LANES_KEY])
    per_rank = (LANES_KEY, LAYOUT_KEY, STAGE_KEY, LAST_SAMPLE_KEY)
    merged = {k: v for k, v in first.items() if k not in per_rank}
    merged[LANES_KEY] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    last = merge_last_samples([s.get(LAST_SAMPLE_KEY) for s in states])
    if last is not None:
        merged[LAST_SAMPLE_KEY] = last
    mixtures = [s.get(MIXTURE_KEY) for s in states]
    if any(m is not None for m in mixtures):
        merged[MIXTURE_KEY] = merge_mixtures(mixtures)
    stage = merge_stage_sections([s.get(STAGE_KEY) for s in states])
    if stage is not None:
        merged[STAGE_KEY] = stage
    return merged


def merge_last_samples(sections: Sequence[Any]) -> dict[str, Any] | None:
    """The ranks' ``last_sample`` sections as one (None unless every rank has one).

    A rank state without the section was written before it existed; the merged state is
    then checked as such (:mod:`zephon_nodes.state.last_sample`).
    """
    if not sections or not all(isinstance(s, Mapping) for s in sections):
        return None
    out: dict[str, Any] = {}
    for section in sections:
        out.update(section)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1))
