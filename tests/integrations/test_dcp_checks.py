"""The TorchTitan (DCP) form of the state: every single-bit flip of a checked value is refused.

Each lane tensor carries a check value over the lane's position and the replicated fields
(fingerprint, lane count, step, micro, dp size, micro-batch size). The ``recipe_<field>``
keys only serve the error message (the fingerprint decides) and are not flipped here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.fault.common import INLINE, memory_pipeline
from zephon_nodes import CheckpointError, simulate
from zephon_nodes.engine.checkpoint import validate_state
from zephon_nodes.integrations.torchtitan import (
    DCP_FORMAT,
    RECIPE_PREFIX,
    from_dcp_state,
    lane_check,
    lane_key,
    to_dcp_state,
)

PIPE = memory_pipeline()


def _state(steps: int) -> dict[str, Any]:
    saved: dict[str, Any] = {}
    for _ in simulate(PIPE, 1, steps, save_at=steps, on_save=saved.update, pool=INLINE):
        pass
    return saved


STATE = _state(3)
LANES = list(range(PIPE.num_lanes))


def _load(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    state = from_dcp_state(sd, PIPE, LANES, dp_world_size=1, local_batch_size=8)
    validate_state(
        state,
        fingerprint=PIPE.fingerprint,
        summary=PIPE.summary,
        num_lanes=PIPE.num_lanes,
        lanes=LANES,
        samples_per_lane=PIPE.recipe.samples_per_lane,
    )
    return state


def test_round_trip() -> None:
    """Control: the converted state loads back equal, lane tensors hold four values."""
    sd = to_dcp_state(STATE, dp_world_size=1, local_batch_size=8)
    assert sd[lane_key(0)].shape == (4,) and int(sd["zephon_format"]) == DCP_FORMAT
    window, consumed = STATE["lanes"]["0"]
    check = lane_check(PIPE.fingerprint, 0, (window, consumed), (4, 3, 0, 1, 8))
    assert sd[lane_key(0)].tolist() == [window, consumed, 3, check]
    assert 0 <= check < 2**62
    loaded = _load(sd)
    assert loaded["lanes"] == STATE["lanes"] and loaded["step"] == 3


def test_every_single_bit_flip_is_refused() -> None:
    """All bits of every lane tensor, replicated integer and fingerprint byte."""
    sd = to_dcp_state(STATE, dp_world_size=1, local_batch_size=8)
    total = refused = 0
    for key, tensor in sorted(sd.items()):
        if key.startswith(RECIPE_PREFIX):
            continue
        bits = 64 if tensor.dtype == torch.int64 else 8
        for index in range(tensor.numel()):
            for bit in range(bits):
                flipped = dict(sd)
                t = tensor.clone().reshape(-1)
                if bits == 64:
                    t[index] = int(t[index]) ^ (1 << bit) if bit < 63 else int(t[index]) ^ -(2**63)
                else:
                    t[index] = int(t[index]) ^ (1 << bit)
                flipped[key] = t.reshape(tensor.shape)
                total += 1
                try:
                    _load(flipped)
                except CheckpointError:
                    refused += 1
    print(f"DCP state: {total} single-bit flips, {refused} refused")
    assert refused == total > 1000


@pytest.mark.parametrize(
    ("key", "index", "value", "match"),
    [
        ("lane_00000", 0, 1, "check value mismatch"),
        ("lane_00001", 1, 0, "check value mismatch"),
        ("micro", 0, 1, "check value mismatch"),
        ("dp_world_size", 0, 2, "check value mismatch"),
        ("step", 0, 1000, "saved at step 3, the checkpoint is at step 1000"),
    ],
)
def test_hand_edits_are_refused(key: str, index: int, value: int, match: str) -> None:
    """Edited positions and replicated values are refused naming the key."""
    sd = to_dcp_state(STATE, dp_world_size=1, local_batch_size=8)
    t = sd[key].clone()
    t[index] = value
    sd[key] = t
    with pytest.raises(CheckpointError, match=match):
        _load(sd)
