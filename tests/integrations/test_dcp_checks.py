"""The TorchTitan (DCP) form of the state: every single-bit flip of a checked value is refused.

Each lane tensor carries a check value over the lane's position and the replicated fields
(fingerprint, lane count, step, micro, dp size, micro-batch size) and, once set_mixture
decisions exist, over the decisions the lane reads (``mixture_count``, the used rows of
``mixture_log``, the used entries of its ``mixture_lane_NNNNN``). The ``recipe_<field>``
keys only serve the error message (the fingerprint decides) and are not flipped here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.fault.common import INLINE, memory_pipeline, texts
from zephon_nodes import CheckpointError, simulate
from zephon_nodes.integrations.torchtitan import (
    DCP_FORMAT,
    RECIPE_PREFIX,
    from_dcp_state,
    lane_check,
    lane_key,
    mixture_digest,
    mixture_lane_key,
    to_dcp_state,
)
from zephon_nodes.recipe import DatasetSpec
from zephon_nodes.state import validate_state
from zephon_nodes.state.mixture import MIXTURE_KEY

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


# A two-dataset recipe with two decisions before the checkpoint (after steps 1 and 2).
MIX_PIPE = memory_pipeline(
    datasets=(
        DatasetSpec("a", records=tuple({"text": t} for t in texts(80, seed=1))),
        DatasetSpec("b", records=tuple({"text": t} for t in texts(80, seed=2))),
    )
)
UPDATES = [(1, {"a": 0.25, "b": 0.75}), (2, {"a": 1.0, "b": 0.0})]
MAX_DECISIONS = 4


def _mix_state() -> dict[str, Any]:
    saved: dict[str, Any] = {}
    run = simulate(
        MIX_PIPE, 1, 3, save_at=3, on_save=saved.update, pool=INLINE, mixture_updates=UPDATES
    )
    for _ in run:
        pass
    return saved


MIX_STATE = _mix_state()


def _mix_sd() -> dict[str, torch.Tensor]:
    return to_dcp_state(
        MIX_STATE,
        dp_world_size=1,
        local_batch_size=8,
        dataset_names=["a", "b"],
        max_decisions=MAX_DECISIONS,
    )


def _mix_load(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    return from_dcp_state(
        sd, MIX_PIPE, LANES, dp_world_size=1, local_batch_size=8, max_decisions=MAX_DECISIONS
    )


def _flip(tensor: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    """``tensor`` with bit ``bit`` of element ``index`` flipped (int64 or float64)."""
    t = tensor.clone().reshape(-1)
    raw = t.view(torch.int64)
    raw[index] = int(raw[index]) ^ (1 << bit) if bit < 63 else int(raw[index]) ^ -(2**63)
    return t.reshape(tensor.shape)


def test_mixture_round_trip_and_check() -> None:
    """Control: the decisions load back; the lane check covers them (computed here)."""
    sd = _mix_sd()
    assert int(sd["mixture_count"]) == 2
    loaded = _mix_load(sd)
    assert loaded[MIXTURE_KEY] == MIX_STATE[MIXTURE_KEY]
    assert [e["step"] for e in loaded[MIXTURE_KEY]["log"]] == [1, 2]
    window, consumed = MIX_STATE["lanes"]["0"]
    mix = mixture_digest(2, sd["mixture_log"], sd[mixture_lane_key(0)])
    plain = lane_check(MIX_PIPE.fingerprint, 0, (window, consumed), (4, 3, 0, 1, 8))
    check = lane_check(MIX_PIPE.fingerprint, 0, (window, consumed), (4, 3, 0, 1, 8), mixture=mix)
    assert int(sd[lane_key(0)][3]) == check != plain
    assert mixture_digest(0, sd["mixture_log"], sd[mixture_lane_key(0)]) == ""


def test_every_single_bit_flip_of_the_decisions_is_refused() -> None:
    """All bits of mixture_count, of the used mixture_log rows and of the used effect
    windows of every lane; the message names the mixture keys."""
    sd = _mix_sd()
    used = {"mixture_count": 1, "mixture_log": 2 * 3}  # 2 decisions x (step + 2 weights)
    used.update({mixture_lane_key(lane): 2 for lane in LANES})
    total = refused = named = 0
    for key, n in used.items():
        for index in range(n):
            for bit in range(64):
                flipped = dict(sd)
                flipped[key] = _flip(sd[key], index, bit)
                total += 1
                try:
                    _mix_load(flipped)
                except CheckpointError as e:
                    refused += 1
                    named += key in str(e)  # the flipped key is named
    print(f"decisions: {total} single-bit flips, {refused} refused")
    assert refused == total == 64 * (1 + 6 + 2 * len(LANES))
    assert named == total


def test_unused_decision_rows_are_not_read() -> None:
    """Rows past mixture_count are room for later decisions: never read, so not checked."""
    sd = _mix_sd()
    sd["mixture_log"] = _flip(sd["mixture_log"], 3 * 3 + 1, 5)  # row 3 (unused)
    sd[mixture_lane_key(1)] = _flip(sd[mixture_lane_key(1)], 2, 0)  # entry 2 (unused)
    assert _mix_load(sd)[MIXTURE_KEY] == MIX_STATE[MIXTURE_KEY]


def test_decisions_dropped_by_a_loader_without_room_are_named() -> None:
    """A loader with max_decisions=0 reads no mixture keys: the message says so."""
    sd = {k: v for k, v in _mix_sd().items() if not k.startswith("mixture_")}
    with pytest.raises(CheckpointError, match="max_decisions=0"):
        from_dcp_state(sd, MIX_PIPE, LANES, dp_world_size=1, local_batch_size=8)
