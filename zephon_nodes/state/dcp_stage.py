"""The DCP keys of a stage section (a recipe changed mid-run): ``stage_len``, ``stage``, rows.

The section's replicated part (``index``, ``step``, ``names``, ``streams``, ``amended``; see
:mod:`zephon_nodes.state.stage`) is JSON, zero-padded to a fixed room (``max_stage_bytes``,
so DCP knows the shape before it loads) in ``stage`` (uint8), with ``stage_len`` (int64
``[length, check]``); both are identical on every rank. Each lane's row of integers is under
a key of its own, ``stage_lane_00003`` (DCP keeps one value per key, so lanes never share
one): int64 ``[max_stage_datasets + 6]``, the row (one count per dataset name, the head's
three values, the dropped samples and tokens), ``-1`` padding, then a check value over the
lane, its row, the checkpoint's fingerprint and step and the replicated part's check.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.dcp_tensors import read_ints

__all__ = [
    "STAGE_DCP_KEY",
    "STAGE_LANE_PREFIX",
    "STAGE_LEN_KEY",
    "stage_from_dcp",
    "stage_lane_key",
    "stage_row_check",
    "stage_to_dcp",
]

STAGE_LEN_KEY = "stage_len"
STAGE_DCP_KEY = "stage"
STAGE_LANE_PREFIX = "stage_lane_"
_LANES = "lanes"
_ROW_EXTRA = 5  # after the per-name counts: head (dataset, count, record), dropped samples, tokens
_PAD = -1


def stage_lane_key(lane: int) -> str:
    """Return the DCP key of lane ``lane``'s stage row (``stage_lane_00003``)."""
    return f"{STAGE_LANE_PREFIX}{lane:05d}"


def _check(blob: bytes) -> int:
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 2


def stage_row_check(fingerprint: str, step: int, lane: int, shared: int, row: list[int]) -> int:
    """The check value of a lane's stage row (62 bits of a SHA-256, a non-negative int64).

    Args:
        fingerprint: The recipe fingerprint (hex).
        step: The checkpoint's step.
        lane: The lane.
        shared: The check value of the replicated part (``stage_len[1]``).
        row: The lane's row (empty when the checkpoint holds no stage section).
    """
    text = f"{fingerprint}:{step}:{lane}:{shared}:" + ",".join(map(str, row))
    return _check(text.encode("ascii"))


def _blob(section: Mapping[str, Any] | None) -> bytes:
    if section is None:
        return b""
    shared = {k: v for k, v in section.items() if k != _LANES}
    return json.dumps(shared, sort_keys=True, separators=(",", ":")).encode("utf-8")


def stage_to_dcp(
    section: Mapping[str, Any] | None,
    lanes: Iterable[int],
    *,
    fingerprint: str,
    step: int,
    room: int,
    datasets: int,
) -> dict[str, torch.Tensor]:
    """The stage keys of ``lanes``: the replicated part in ``room`` bytes, a row per lane.

    Args:
        section: The state's stage section (None: none yet; the keys hold nothing).
        lanes: The lanes of the state (every one needs a row when there is a section).
        fingerprint: The recipe fingerprint (hex), covered by each row's check.
        step: The state's step, covered by each row's check.
        room: ``dataloader.max_stage_bytes``.
        datasets: ``dataloader.max_stage_datasets`` (a row holds ``datasets + 5`` values).

    Raises:
        CheckpointError: If the section does not fit the room, naming the setting to raise.
    """
    blob = _blob(section)
    if len(blob) > room:
        raise CheckpointError(
            f"the stage section (a recipe change) takes {len(blob)} bytes, more than "
            f"dataloader.max_stage_bytes={room}; raise it (and keep it for every later resume)"
        )
    names = list(section["names"]) if section is not None else []
    if len(names) > datasets:
        raise CheckpointError(
            f"the stage section names {len(names)} datasets (every one the run has read), "
            f"more than dataloader.max_stage_datasets={datasets}; raise it (and keep it for "
            f"every later resume)"
        )
    data = torch.zeros(room, dtype=torch.uint8)
    if blob:
        data[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    shared = _check(blob)
    out = {
        STAGE_LEN_KEY: torch.tensor([len(blob), shared], dtype=torch.int64),
        STAGE_DCP_KEY: data,
    }
    rows: Mapping[str, Any] = section[_LANES] if section is not None else {}
    for lane in sorted(lanes):
        row: list[int] = []
        if section is not None:
            if str(lane) not in rows:
                raise CheckpointError(f"the stage section has no row for lane {lane}")
            row = [int(v) for v in rows[str(lane)]]
        value = torch.full((datasets + _ROW_EXTRA + 1,), _PAD, dtype=torch.int64)
        value[: len(row)] = torch.tensor(row, dtype=torch.int64)
        value[-1] = stage_row_check(fingerprint, step, lane, shared, row)
        out[stage_lane_key(lane)] = value
    return out


def stage_from_dcp(
    sd: Mapping[str, Any],
    lanes: Iterable[int],
    *,
    fingerprint: str,
    step: int,
    room: int,
    datasets: int,
) -> dict[str, Any] | None:
    """Read (and check) the stage keys of ``lanes``; None when they hold no section.

    Raises:
        CheckpointError: Naming the key that is missing, has another shape (another
            ``max_stage_bytes`` or ``max_stage_datasets``) or was damaged (check value).
    """
    n, shared = read_ints(sd, STAGE_LEN_KEY, 2)
    data = sd.get(STAGE_DCP_KEY)
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.numel() != room:
        raise CheckpointError(
            f"dataloader.{STAGE_DCP_KEY}: expected uint8[{room}] (dataloader.max_stage_bytes), "
            f"got {data!r:.80}"
        )
    if not 0 <= n <= room:
        raise CheckpointError(f"dataloader.{STAGE_LEN_KEY}: length {n} is out of range")
    blob = bytes(data[:n].tolist())
    if shared != _check(blob) or bool(data[n:].any()):
        raise CheckpointError(
            f"dataloader.{STAGE_DCP_KEY}: check value mismatch or non-zero padding (the stage "
            f"section or {STAGE_LEN_KEY} was damaged or edited after saving)"
        )
    section: dict[str, Any] | None = None
    names: list[Any] = []
    if n:
        try:
            section = json.loads(blob.decode("utf-8"))
        except ValueError as e:
            raise CheckpointError(f"dataloader.{STAGE_DCP_KEY}: not JSON ({e})") from None
        if not isinstance(section, dict) or not isinstance(section.get("names"), list):
            raise CheckpointError(f"dataloader.{STAGE_DCP_KEY}: not a stage section")
        names = section["names"]
        if len(names) > datasets:
            raise CheckpointError(
                f"dataloader.{STAGE_DCP_KEY}: {len(names)} dataset names, more than "
                f"dataloader.max_stage_datasets={datasets}"
            )
    width = len(names) + _ROW_EXTRA if section is not None else 0
    rows: dict[str, list[int]] = {}
    for lane in sorted(lanes):
        key = stage_lane_key(lane)
        if key not in sd:
            raise CheckpointError(f"the checkpoint has no stage row for lane {lane} ({key})")
        value = read_ints(
            sd, key, datasets + _ROW_EXTRA + 1, " (dataloader.max_stage_datasets + 6)"
        )
        row, pad, check = value[:width], value[width:-1], value[-1]
        if any(v != _PAD for v in pad) or check != stage_row_check(
            fingerprint, step, lane, shared, row
        ):
            raise CheckpointError(
                f"dataloader.{key}: check value mismatch or damaged padding: the lane's stage "
                f"row {row!r:.120}, the step or the stage section were damaged or edited after "
                f"saving"
            )
        rows[str(lane)] = row
    if section is None:
        return None
    section[_LANES] = rows
    return section
