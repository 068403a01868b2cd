"""A lane's check of its last sample: a value tied to the data, checked by a restore's replay.

A resealed state (its checksum recomputed, :mod:`zephon_nodes.state.codec`) can hold any
position the bounds of :func:`~zephon_nodes.state.validate.check_positions` allow. Each lane
entry of the state's ``last_sample`` section is 62 bits of an xxh3-64 over the pass, the
step, the lane, its position and the tokens of the last sample the lane handed out. A
restore replays each lane's flush window up to its position anyway; the last sample it
replays must give the same value. A moved position replays another sample, swapped lanes
another lane's sample (and lane number), a relabelled step or pass another step or pass.
After a recipe change the lane's row of the ``stage`` section (its dataset counts, head and
drops) and the section's shared values are hashed too: none of them can be edited alone.

The value is computed when the state is taken (:meth:`Multiplexer.get_state
<zephon_nodes.engine.multiplexer.Multiplexer.get_state>`), from the sample the lane handed
out last, never per sample. A lane that has handed out no sample of its current window
(position ``[w, 0]``: the start of a run, of a stage, of an amendment) has no entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from zephon_nodes.core.errors import CheckpointError

__all__ = ["LAST_SAMPLE_KEY", "check_last_samples", "parse_last_samples", "sample_check"]

LAST_SAMPLE_KEY = "last_sample"
"""The state's section: ``{"lane": check}`` (an integer in ``[0, 2**62)``)."""

_MASK = (1 << 62) - 1


def _feed(h: Any, value: Any) -> None:
    """Hash one field of a sample: an array's dtype, shape and bytes, else its ``repr``."""
    arr = np.asarray(value) if not isinstance(value, (str, bytes, Mapping)) else None
    if arr is None or arr.dtype == object:
        h.update(repr(value).encode("utf-8", "backslashreplace"))
        return
    h.update(f"{arr.dtype.str}{arr.shape}".encode("ascii"))
    h.update(np.ascontiguousarray(arr).tobytes())


def sample_check(
    pass_index: int,
    step: int,
    lane: int,
    position: tuple[int, int],
    sample: Any,
    *,
    stage: Any = None,
) -> int:
    """The check of a lane's last sample: 62 bits of an xxh3-64 (a non-negative int64).

    Args:
        pass_index: The pass of the recipe's stream.
        step: The state's step.
        lane: The lane.
        position: The lane's ``(window, consumed)``.
        sample: The last sample the lane handed out (a dict of arrays).
        stage: After a recipe change, the lane's row of the ``stage`` section and the
            section's shared values (JSON-safe; hashed as canonical JSON), else ``None``.
    """
    h = xxhash.xxh3_64()
    h.update(f"{pass_index}:{step}:{lane}:{position[0]}:{position[1]}".encode("ascii"))
    if stage is not None:
        h.update(b"|stage=")
        h.update(json.dumps(stage, sort_keys=True, separators=(",", ":")).encode("ascii"))
    if isinstance(sample, Mapping):
        for key in sorted(sample, key=str):
            h.update(f":{key}=".encode("utf-8", "backslashreplace"))
            _feed(h, sample[key])
    else:
        _feed(h, sample)
    return h.intdigest() & _MASK


def parse_last_samples(raw: Any, num_lanes: int) -> dict[int, int] | None:
    """Parse a state's ``last_sample`` section (``None`` when the state has none).

    Raises:
        CheckpointError: Naming the lane key or value that is wrong.
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise CheckpointError(
            f"checkpoint {LAST_SAMPLE_KEY!r} must be a dict, got {type(raw).__name__}"
        )
    out: dict[int, int] = {}
    for key, value in raw.items():
        lane = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else -1
        if not 0 <= lane < num_lanes or str(lane) != key:
            raise CheckpointError(
                f"checkpoint {LAST_SAMPLE_KEY}[{key!r}] is not a lane in [0, {num_lanes})"
            )
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MASK:
            raise CheckpointError(
                f"checkpoint {LAST_SAMPLE_KEY}[{key!r}]={value!r} must be an integer in [0, 2**62)"
            )
        out[lane] = value
    return dict(sorted(out.items()))


def check_last_samples(
    saved: Mapping[int, int] | None,
    reached: Mapping[int, int | None],
    positions: Mapping[int, tuple[int, int]],
    step: int,
) -> None:
    """Refuse a state whose lanes' last samples are not the ones the replay reached.

    Args:
        saved: The state's section, parsed (``None``: a state written before the section
            existed, checked as such: nothing to compare).
        reached: Per owned lane, :func:`sample_check` of the last sample the restore
            replayed (``None``: the lane replayed no sample, position ``[w, 0]``).
        positions: The owned lanes' saved positions.
        step: The state's step.

    Raises:
        CheckpointError: Naming ``lanes['i']`` and the field when a value differs, or when
            the section lacks a lane that has handed out a sample of its window.
    """
    if saved is None:
        return
    for lane, value in sorted(reached.items()):
        where = f"checkpoint lanes[{str(lane)!r}]"
        pos = list(positions[lane])
        stored = saved.get(lane)
        if value is None and stored is None:
            continue
        if stored is None:
            raise CheckpointError(
                f"{where}: position {pos} at step={step} has handed out a sample of its "
                f"window, but {LAST_SAMPLE_KEY}[{str(lane)!r}] is missing (the section was "
                f"edited)"
            )
        if value != stored:
            raise CheckpointError(
                f"{where}: position {pos} at step={step} does not match "
                f"{LAST_SAMPLE_KEY}[{str(lane)!r}]: the sample the lane replays there is not "
                f"the last one it handed out (the step, the lane positions, the lanes' order, "
                f"the lane's 'stage' row or {LAST_SAMPLE_KEY!r} were edited)"
            )
