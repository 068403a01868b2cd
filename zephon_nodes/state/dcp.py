"""The DCP form of a rank's loader state: small int64 / uint8 tensors, one key per lane.

Both TorchTitan adapters (0.3.0 and main) store their state through this codec, so a
checkpoint written by one resumes under the other when the recipe is the same. Keys (under
``dataloader.`` in TorchTitan's checkpoint):

* one key per lane, unique to that lane: ``lane_00003 -> int64[window, consumed, step,
  check]`` (DCP keeps one value per key, so lanes must never share a key); ``check`` is 62
  bits of a SHA-256 over the lane, its position and the replicated fingerprint, lane count,
  step, micro, dp size and micro-batch size, so a flipped bit in any of them is refused;
* replicated keys, identical on every rank: ``zephon_format``, ``num_lanes``, ``step``,
  ``micro``, ``dp_world_size``, ``local_batch_size`` (int64[1]), ``fingerprint``
  (uint8[32]) and one ``recipe_<field>`` per top-level recipe field (int64[kind, value]),
  so a refused resume names the field that changed;
* the decision log of a dynamic mixture, with room for ``max_decisions`` entries:
  ``mixture_count`` (int64[1]) and ``mixture_log`` (float64[max_decisions, 1 + D]: the step,
  then the weights in recipe order; replicated) and one ``mixture_lane_00003 ->
  int64[max_decisions]`` per lane (its effect windows, -1 unused); once a decision is made,
  each lane's check value also covers the decisions it reads (:mod:`.dcp_mixture`);
* after a re-lane (``zephon_format`` 3): ``lineage_len`` and ``lineage`` (replicated;
  :mod:`.dcp_lineage`);
* after a recipe change, a stage or an amendment (``zephon_format`` 4): ``stage_len`` and
  ``stage`` (replicated) and one ``stage_lane_00003`` per lane (:mod:`.dcp_stage`); a loader
  that reserves them (a recipe with stages, or ``dataloader.amended``) writes them empty
  before the first change, with ``zephon_format`` 2 (a state with both a lineage and a
  stage section is refused: the engine changes no re-laned run's recipe).

Nothing here knows the engine: :func:`decode_dcp_state` takes the running recipe's identity
(anything with ``fingerprint``, ``summary`` and ``recipe``, such as a ``Pipeline``) and
returns the JSON-safe state without its ``format`` key, which the caller adds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.dcp_lineage import (
    lineage_from_dcp,
    lineage_to_dcp,
)
from zephon_nodes.state.dcp_mixture import (
    MIXTURE_COUNT_KEY,
    MIXTURE_LANE_PREFIX,
    MIXTURE_LOG_KEY,
    mixture_digest,
    mixture_from_dcp,
    mixture_lane_key,
    mixture_to_dcp,
    stored_mixture_digest,
)
from zephon_nodes.state.dcp_stage import STAGE_LANE_PREFIX, stage_from_dcp, stage_to_dcp
from zephon_nodes.state.dcp_tensors import read_ints, scalar
from zephon_nodes.state.identity import fingerprint_pair
from zephon_nodes.state.schema import MIXTURE_KEY, STAGE_KEY

__all__ = [
    "DCP_FORMAT",
    "DCP_FORMAT_RELANED",
    "DCP_FORMAT_STAGED",
    "LANE_PREFIX",
    "MIXTURE_LANE_PREFIX",
    "RECIPE_PREFIX",
    "STAGE_LANE_PREFIX",
    "RecipeIdentity",
    "decode_dcp_state",
    "lane_check",
    "lane_key",
    "mixture_digest",
    "mixture_lane_key",
    "to_dcp_state",
]

MIXTURE_STATE_KEY = MIXTURE_KEY  # where the JSON state keeps the decision log (state.schema)


class _RecipeShape(Protocol):
    @property
    def num_lanes(self) -> int: ...

    @property
    def global_batch_size(self) -> int: ...

    @property
    def datasets(self) -> Sequence[Any]: ...


class RecipeIdentity(Protocol):
    """What the codec needs of the running recipe (a ``Pipeline`` has all of it)."""

    @property
    def fingerprint(self) -> str:
        """The recipe fingerprint (hex)."""
        ...

    @property
    def summary(self) -> Mapping[str, Any]:
        """The top-level recipe fields, as stored in ``recipe_<field>``."""
        ...

    @property
    def recipe(self) -> _RecipeShape:
        """The recipe (``num_lanes``, ``global_batch_size``, ``datasets``)."""
        ...


DCP_FORMAT = 2
"""Version of the DCP key layout (``zephon_format``); the JSON state inside is ``FORMAT``.

2: lane tensors carry a check value (``[window, consumed, step, check]``).
"""

DCP_FORMAT_RELANED = 3
"""``zephon_format`` of a checkpoint written after a re-lane: layout 2 plus the lineage keys
``lineage_len`` (int64[2]: bytes, check) and ``lineage`` (uint8[max_lineage_bytes], JSON)."""

DCP_FORMAT_STAGED = 4
"""``zephon_format`` of a checkpoint written after a recipe change (a stage or an amendment):
layout 2 plus the stage keys ``stage_len`` (int64[2]: bytes, check), ``stage``
(uint8[max_stage_bytes], JSON) and ``stage_lane_NNNNN`` (int64[max_stage_datasets + 6])."""

FORMAT_KEY = "zephon_format"
NUM_LANES_KEY = "num_lanes"
STEP_KEY = "step"
MICRO_KEY = "micro"
DP_KEY = "dp_world_size"
LBS_KEY = "local_batch_size"
FINGERPRINT_KEY = "fingerprint"
RECIPE_PREFIX = "recipe_"
LANE_PREFIX = "lane_"

_KIND_INT, _KIND_HASH, _KIND_OTHER = 0, 1, 2


def lane_key(lane: int) -> str:
    """Return the DCP key of lane ``lane`` (``lane_00003``)."""
    return f"{LANE_PREFIX}{lane:05d}"


def _encode_field(value: Any) -> tuple[int, int]:
    """Encode one recipe-summary value as ``(kind, int64)``.

    Integers are stored verbatim (so errors can show both values); the ``sha256:`` digests
    of nested fields keep their 8 bytes; anything else is reduced to 8 bytes of a SHA-256.
    """
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return _KIND_INT, value
    if isinstance(value, str) and value.startswith("sha256:") and len(value) == 23:
        try:
            raw = bytes.fromhex(value[7:])
        except ValueError:
            raw = b""
        if len(raw) == 8:
            return _KIND_HASH, int.from_bytes(raw, "little", signed=True)
    if isinstance(value, str) and value.startswith("sha256(json):") and len(value) == 29:
        # A value decoded by _decode_field from a checkpoint: encode it back unchanged.
        try:
            raw = bytes.fromhex(value[13:])
        except ValueError:
            raw = b""
        if len(raw) == 8:
            return _KIND_OTHER, int.from_bytes(raw, "little", signed=True)
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return _KIND_OTHER, int.from_bytes(hashlib.sha256(blob).digest()[:8], "little", signed=True)


def lane_check(
    fingerprint: str,
    lane: int,
    position: tuple[int, int],
    replicated: tuple[int, ...],
    *,
    mixture: str = "",
) -> int:
    """The check value stored with a lane: 62 bits of a SHA-256 (a non-negative int64).

    Args:
        fingerprint: The recipe fingerprint (hex).
        lane: The lane.
        position: The lane's ``(window, consumed)``.
        replicated: ``(num_lanes, step, micro, dp_world_size, local_batch_size)``.
        mixture: :func:`mixture_digest` of the decision log and the lane's effect windows
            ("" when the checkpoint holds no decision).
    """
    text = f"{fingerprint}:{lane}:{position[0]}:{position[1]}:" + ":".join(map(str, replicated))
    if mixture:
        text += f":mixture:{mixture}"
    return int.from_bytes(hashlib.sha256(text.encode("ascii")).digest()[:8], "little") >> 2


def _decode_field(kind: int, value: int) -> Any:
    if kind == _KIND_INT:
        return value
    raw = value.to_bytes(8, "little", signed=True).hex()
    return f"sha256:{raw}" if kind == _KIND_HASH else f"sha256(json):{raw}"


def to_dcp_state(
    state: Mapping[str, Any],
    *,
    dp_world_size: int,
    local_batch_size: int,
    dataset_names: list[str] | None = None,
    max_decisions: int = 0,
    lineage_bytes: int = 0,
    stage_room: tuple[int, int] = (0, 0),
) -> dict[str, torch.Tensor]:
    """Convert a :class:`~zephon_nodes.engine.multiplexer.Multiplexer` state to DCP tensors.

    Args:
        state: The rank's JSON-safe multiplexer state.
        dp_world_size: The job's data-parallel size (stored for mid-step states).
        local_batch_size: The rank's micro-batch size (stored for mid-step states).
        dataset_names: The recipe's datasets (order of the stored weights).
        max_decisions: Room for decisions (0: no mixture keys).
        lineage_bytes: Room for a re-lane's lineage (0: no lineage keys; a state with a
            lineage needs room, and is written as ``DCP_FORMAT_RELANED``).
        stage_room: ``(max_stage_bytes, max_stage_datasets)``: room for a stage section
            (``(0, 0)``: no stage keys; a state with a section needs room, and is written as
            ``DCP_FORMAT_STAGED``).

    Returns:
        ``{key: tensor}``: one ``lane_NNNNN`` per lane in ``state`` plus the replicated keys.

    Raises:
        CheckpointError: If the decision log holds more than ``max_decisions`` entries, the
            stage section does not fit ``stage_room``, or for a state of a later pass
            (``ZephonDataLoader`` never starts one; the DCP layout has no place for it, and
            dropping it would resume in pass 0).
    """
    if state.get("pass", 0):
        raise CheckpointError(
            f"the state is in pass {state['pass']} of the recipe's stream; the TorchTitan "
            f"checkpoint layout stores pass 0 only"
        )
    step = int(state["step"])
    lineage = state.get("lineage")
    stage = state.get(STAGE_KEY)
    if lineage is not None and stage is not None:
        raise CheckpointError(
            "the state carries both a re-lane's lineage and a stage section; a re-laned run "
            "whose recipe changed is not supported"
        )
    fmt = DCP_FORMAT_RELANED if lineage is not None else DCP_FORMAT
    out: dict[str, torch.Tensor] = {
        FORMAT_KEY: scalar(DCP_FORMAT_STAGED if stage is not None else fmt),
        NUM_LANES_KEY: scalar(int(state["num_lanes"])),
        STEP_KEY: scalar(step),
        MICRO_KEY: scalar(int(state["micro"])),
        DP_KEY: scalar(dp_world_size),
        LBS_KEY: scalar(local_batch_size),
        FINGERPRINT_KEY: torch.frombuffer(
            bytearray(bytes.fromhex(str(state["fingerprint"]))), dtype=torch.uint8
        ).clone(),
    }
    for name, value in sorted(dict(state.get("recipe") or {}).items()):
        out[RECIPE_PREFIX + name] = torch.tensor(_encode_field(value), dtype=torch.int64)
    fp = str(state["fingerprint"])
    replicated = (
        int(state["num_lanes"]),
        step,
        int(state["micro"]),
        dp_world_size,
        local_batch_size,
    )
    digests: dict[int, str] = {}
    if max_decisions > 0:
        mixture = state.get(MIXTURE_STATE_KEY) or {"log": [], "effects": {}}
        keys, digests = mixture_to_dcp(
            mixture, list(dataset_names or []), [int(k) for k in state["lanes"]], max_decisions
        )
        out.update(keys)
    for key, (window, consumed) in sorted(state["lanes"].items(), key=lambda kv: int(kv[0])):
        mix = digests.get(int(key), "")
        check = lane_check(fp, int(key), (window, consumed), replicated, mixture=mix)
        out[lane_key(int(key))] = torch.tensor([window, consumed, step, check], dtype=torch.int64)
    if lineage is not None or lineage_bytes > 0:
        out.update(lineage_to_dcp(lineage, lineage_bytes))
    if stage is not None or stage_room[0] > 0:
        lanes = [int(k) for k in state["lanes"]]
        room, datasets = stage_room
        out.update(
            stage_to_dcp(stage, lanes, fingerprint=fp, step=step, room=room, datasets=datasets)
        )
    return out


def _recipe_diff(sd: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    """Name the recipe fields whose stored encoding differs from the running recipe's."""
    saved = {k[len(RECIPE_PREFIX) :] for k in sd if k.startswith(RECIPE_PREFIX)}
    out = []
    for name in sorted(saved | set(summary)):
        if name not in saved:
            out.append(f"{name}: absent from the checkpoint")
            continue
        kind, value = read_ints(sd, RECIPE_PREFIX + name, 2)
        if name not in summary:
            out.append(f"{name}: in the checkpoint, absent from this recipe")
            continue
        now_kind, now_value = _encode_field(summary[name])
        if (kind, value) != (now_kind, now_value):
            if kind == now_kind == _KIND_INT:
                out.append(f"{name}: checkpoint has {value}, recipe has {now_value}")
            else:
                out.append(f"{name} differs")
    return out


def decode_dcp_state(
    sd: Mapping[str, Any],
    pipeline: RecipeIdentity,
    lanes: list[int],
    *,
    dp_world_size: int,
    local_batch_size: int,
    max_decisions: int = 0,
    lineage_bytes: int = 0,
    stage_room: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """Convert loaded DCP tensors back to a JSON-safe state for ``lanes`` (no ``format`` key).

    Args:
        sd: The dataloader's part of the checkpoint (as filled in by DCP).
        pipeline: The running recipe (a ``Pipeline``).
        lanes: Lanes this rank owns now.
        dp_world_size: This job's data-parallel size.
        local_batch_size: This job's micro-batch size.
        max_decisions: Room for decisions in the mixture keys (0: none stored).
        lineage_bytes: Room of the lineage keys (0: the checkpoint must have none).
        stage_room: ``(max_stage_bytes, max_stage_datasets)`` of the stage keys (``(0, 0)``:
            the checkpoint must have no stage section).

    Raises:
        CheckpointError: If the checkpoint is not a zephon-nodes one, was written with
            another recipe (naming the fields that differ), holds inconsistent steps, or was
            taken in the middle of a step on another layout.
    """
    fmt = _check_format(sd, lineage_bytes, stage_room)
    fingerprint = _check_fingerprint(sd, pipeline)
    (num_lanes,) = read_ints(sd, NUM_LANES_KEY, 1)
    (step,) = read_ints(sd, STEP_KEY, 1)
    (micro,) = read_ints(sd, MICRO_KEY, 1)
    (saved_dp,) = read_ints(sd, DP_KEY, 1)
    (saved_lbs,) = read_ints(sd, LBS_KEY, 1)
    replicated = (num_lanes, step, micro, saved_dp, saved_lbs)
    positions: dict[str, list[int]] = {}
    for lane in lanes:
        positions[str(lane)] = _lane_position(sd, lane, fingerprint, replicated, max_decisions)
    state: dict[str, Any] = {
        "fingerprint": fingerprint,
        "recipe": {
            k[len(RECIPE_PREFIX) :]: _decode_field(*read_ints(sd, k, 2))
            for k in sorted(sd)
            if k.startswith(RECIPE_PREFIX)
        },
        "num_lanes": num_lanes,
        "step": step,
        "micro": micro,
        "lanes": positions,
    }
    if lineage_bytes > 0:
        lineage = lineage_from_dcp(sd, lineage_bytes)
        if lineage is not None:
            state["lineage"] = lineage
    if stage_room[0] > 0:
        stage = _stage_section(sd, lanes, fingerprint, step, fmt, stage_room)
        if stage is not None:
            state[STAGE_KEY] = stage
    if max_decisions > 0:
        names = [d.name for d in pipeline.recipe.datasets]
        mixture = mixture_from_dcp(sd, names, lanes, max_decisions)
        if mixture is not None:
            state[MIXTURE_STATE_KEY] = mixture
    if micro:
        if (saved_dp, saved_lbs) != (dp_world_size, local_batch_size):
            raise CheckpointError(
                f"the checkpoint was taken after micro-batch {micro} of step {step + 1} (the "
                f"trainer's global batch is not a multiple of the recipe's global_batch_size="
                f"{pipeline.recipe.global_batch_size}); it resumes only at dp_world_size="
                f"{saved_dp} and local_batch_size={saved_lbs}, this job has "
                f"{dp_world_size=} and {local_batch_size=}"
            )
        state["layout"] = {"lanes": list(lanes), "local_batch_size": saved_lbs}
    return state


def _check_format(sd: Mapping[str, Any], lineage_bytes: int, stage_room: tuple[int, int]) -> int:
    """The checkpoint's format number, checked against the sections this loader reads."""
    if FORMAT_KEY not in sd:
        raise CheckpointError(
            "the checkpoint's dataloader state has no 'zephon_format' key: it was not "
            "written by ZephonDataLoader (was it TorchTitan's default loader?)"
        )
    (fmt,) = read_ints(sd, FORMAT_KEY, 1)
    if fmt == DCP_FORMAT_RELANED and not lineage_bytes:
        raise CheckpointError(
            f"the checkpoint was written after a re-lane (zephon_format={fmt}: it carries the "
            f"lineage of its data stream); resume it with dataloader.relaned = true and the "
            f"job's dataloader.max_lineage_bytes"
        )
    if fmt == DCP_FORMAT_STAGED and not stage_room[0]:
        raise CheckpointError(
            f"the checkpoint was written after a recipe change (zephon_format={fmt}: a stage of "
            f"its recipe or a `zephon amend`; it carries the stage section); resume it with "
            f"dataloader.amended = true and the job's dataloader.max_stage_bytes and "
            f"dataloader.max_stage_datasets"
        )
    if fmt not in (DCP_FORMAT, DCP_FORMAT_RELANED, DCP_FORMAT_STAGED):
        raise CheckpointError(f"dataloader state has zephon_format={fmt}, expected {DCP_FORMAT}")
    return fmt


def _check_fingerprint(sd: Mapping[str, Any], pipeline: RecipeIdentity) -> str:
    """The checkpoint's recipe fingerprint (hex); it must be the running recipe's."""
    fp = sd.get(FINGERPRINT_KEY)
    if not isinstance(fp, torch.Tensor) or fp.dtype != torch.uint8 or fp.numel() != 32:
        raise CheckpointError(f"dataloader.fingerprint: expected uint8[32], got {fp!r:.80}")
    fingerprint = bytes(fp.tolist()).hex()
    if fingerprint != pipeline.fingerprint:
        diffs = _recipe_diff(sd, pipeline.summary)
        detail = (
            "; ".join(diffs)
            if diffs
            else (
                "every recipe field recorded in the checkpoint matches, so the fingerprint itself "
                "was altered (a damaged or edited checkpoint)"
            )
        )
        (saved_lanes,) = read_ints(sd, NUM_LANES_KEY, 1)
        if saved_lanes != pipeline.recipe.num_lanes:
            detail += (
                f" (to re-lane this checkpoint to num_lanes={pipeline.recipe.num_lanes}, "
                f"every document still used once: dataloader.relane_from = {saved_lanes})"
            )
        raise CheckpointError(
            f"the checkpoint was written with a different recipe (fingerprint "
            f"{fingerprint_pair(fingerprint, pipeline.fingerprint)}): {detail}"
        )
    return fingerprint


def _lane_position(
    sd: Mapping[str, Any],
    lane: int,
    fingerprint: str,
    replicated: tuple[int, int, int, int, int],
    max_decisions: int,
) -> list[int]:
    """Lane ``lane``'s ``[window, consumed]``, checked against its check value."""
    step = replicated[1]  # (num_lanes, step, micro, dp_world_size, local_batch_size)
    stored_mixture = max_decisions > 0 and MIXTURE_COUNT_KEY in sd
    key = lane_key(lane)
    if key not in sd:
        raise CheckpointError(f"the checkpoint has no state for lane {lane} ({key})")
    window, consumed, lane_step, check = read_ints(sd, key, 4)
    if lane_step != step:
        raise CheckpointError(
            f"lane {lane} was saved at step {lane_step}, the checkpoint is at step {step}"
        )
    mix = stored_mixture_digest(sd, lane, max_decisions) if stored_mixture else ""
    if check != lane_check(fingerprint, lane, (window, consumed), replicated, mixture=mix):
        if mix:
            what = (
                f", or the decision log ({MIXTURE_COUNT_KEY}, {MIXTURE_LOG_KEY}, "
                f"{mixture_lane_key(lane)})"
            )
        elif stored_mixture:
            what = f" (or {MIXTURE_COUNT_KEY}, now 0)"
        else:
            what = (
                " (if the checkpoint holds set_mixture decisions: this loader has "
                "dataloader.max_decisions=0 and does not read them)"
            )
        raise CheckpointError(
            f"dataloader.{key}: check value mismatch: the lane's position [{window}, "
            f"{consumed}] or the replicated num_lanes/step/micro/dp_world_size/"
            f"local_batch_size {list(replicated)}{what} were damaged or edited after saving"
        )
    return [window, consumed]


def _stage_section(
    sd: Mapping[str, Any],
    lanes: list[int],
    fingerprint: str,
    step: int,
    fmt: int,
    stage_room: tuple[int, int],
) -> dict[str, Any] | None:
    """The stage section the stage keys hold (``None``: none), checked against the format."""
    room, datasets = stage_room
    stage = stage_from_dcp(
        sd, lanes, fingerprint=fingerprint, step=step, room=room, datasets=datasets
    )
    if (stage is not None) != (fmt == DCP_FORMAT_STAGED):
        raise CheckpointError(
            f"dataloader.{FORMAT_KEY}={fmt} but the stage keys hold "
            f"{'a' if stage is not None else 'no'} stage section (a damaged or edited "
            f"checkpoint)"
        )
    return stage
