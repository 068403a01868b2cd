"""The DCP keys of a dynamic mixture's decision log, with room for ``max_decisions`` entries.

``mixture_count`` (int64[1]) and ``mixture_log`` (float64[max_decisions, 1 + D]: the step,
then the weights in recipe order; -1 rows unused) are replicated; each lane's effect windows
are under a key of its own, ``mixture_lane_00003`` (int64[max_decisions], -1 unused). Once a
decision is made, each lane's check value (``lane_00003``) also covers the decisions it reads
(:func:`mixture_digest`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.dcp_tensors import read_ints, scalar

__all__ = [
    "MIXTURE_COUNT_KEY",
    "MIXTURE_LANE_PREFIX",
    "MIXTURE_LOG_KEY",
    "mixture_digest",
    "mixture_from_dcp",
    "mixture_lane_key",
    "mixture_to_dcp",
    "stored_mixture_digest",
]

MIXTURE_COUNT_KEY = "mixture_count"
MIXTURE_LOG_KEY = "mixture_log"
MIXTURE_LANE_PREFIX = "mixture_lane_"


def mixture_lane_key(lane: int) -> str:
    """Return the DCP key of lane ``lane``'s decision effect windows."""
    return f"{MIXTURE_LANE_PREFIX}{lane:05d}"


def mixture_digest(count: int, table: torch.Tensor, windows: torch.Tensor) -> str:
    """SHA-256 (hex) of the ``count`` decisions a lane reads: log rows and effect windows.

    Covers ``mixture_count``, the first ``count`` rows of ``mixture_log`` (their float64
    bytes) and the first ``count`` entries of the lane's ``mixture_lane_NNNNN``; the unused
    rows are never read. Empty (``""``) when ``count`` is 0, so a checkpoint without
    decisions keeps the check value it had before decisions existed.
    """
    if count <= 0:
        return ""
    h = hashlib.sha256(count.to_bytes(8, "little", signed=True))
    h.update(table[:count].to(torch.float64).contiguous().numpy().tobytes())
    h.update(windows[:count].to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def mixture_to_dcp(
    mixture: Mapping[str, Any], names: list[str], lanes: list[int], max_decisions: int
) -> tuple[dict[str, torch.Tensor], dict[int, str]]:
    """The mixture keys of ``lanes`` and, per lane, the :func:`mixture_digest` it reads.

    Args:
        mixture: The state's decision log (``{"log": [...], "effects": {...}}``).
        names: The recipe's datasets (order of the stored weights).
        lanes: The lanes of the state.
        max_decisions: Room for decisions (``dataloader.max_decisions``).

    Raises:
        CheckpointError: If the log holds more than ``max_decisions`` entries.
    """
    log = mixture["log"]
    if len(log) > max_decisions:
        raise CheckpointError(
            f"the mixture log holds {len(log)} decisions, more than "
            f"dataloader.max_decisions={max_decisions}"
        )
    table = torch.full((max_decisions, 1 + len(names)), -1.0, dtype=torch.float64)
    for k, entry in enumerate(log):
        table[k, 0] = float(entry["step"])
        weights = [float(entry["weights"][n]) for n in names]
        table[k, 1:] = torch.tensor(weights, dtype=torch.float64)
    out = {MIXTURE_COUNT_KEY: scalar(len(log)), MIXTURE_LOG_KEY: table}
    digests: dict[int, str] = {}
    for lane in lanes:
        windows = torch.full((max_decisions,), -1, dtype=torch.int64)
        eff = mixture["effects"].get(str(lane), [])
        windows[: len(eff)] = torch.tensor(eff, dtype=torch.int64)
        out[mixture_lane_key(lane)] = windows
        digests[lane] = mixture_digest(len(log), table, windows)
    return out, digests


def mixture_from_dcp(
    sd: Mapping[str, Any], names: list[str], lanes: list[int], max_decisions: int
) -> dict[str, Any] | None:
    """Read the decision log back from DCP tensors (None when there is none)."""
    if MIXTURE_COUNT_KEY not in sd:
        return None
    (count,) = read_ints(sd, MIXTURE_COUNT_KEY, 1)
    table = sd.get(MIXTURE_LOG_KEY)
    shape = (max_decisions, 1 + len(names))
    if not isinstance(table, torch.Tensor) or tuple(table.shape) != shape:
        raise CheckpointError(
            f"dataloader.{MIXTURE_LOG_KEY}: expected a float64 tensor of shape {shape}, got "
            f"{table!r:.80}"
        )
    if not 0 <= count <= max_decisions:
        raise CheckpointError(f"dataloader.{MIXTURE_COUNT_KEY}={count} is out of range")
    if count == 0:
        return None
    rows = table.to(torch.float64).tolist()
    log = [
        {"step": int(row[0]), "weights": dict(zip(names, row[1:], strict=True))}
        for row in rows[:count]
    ]
    effects = {}
    for lane in lanes:
        effects[str(lane)] = read_ints(sd, mixture_lane_key(lane), max_decisions)[:count]
    return {"log": log, "effects": effects}


def stored_mixture_digest(sd: Mapping[str, Any], lane: int, max_decisions: int) -> str:
    """:func:`mixture_digest` of the loaded ``mixture_*`` tensors, for ``lane``'s check."""
    (count,) = read_ints(sd, MIXTURE_COUNT_KEY, 1)
    if not 0 <= count <= max_decisions:
        raise CheckpointError(f"dataloader.{MIXTURE_COUNT_KEY}={count} is out of range")
    table = sd.get(MIXTURE_LOG_KEY)
    if not isinstance(table, torch.Tensor) or table.dtype != torch.float64:
        raise CheckpointError(
            f"dataloader.{MIXTURE_LOG_KEY}: expected a float64 tensor, got {table!r:.80}"
        )
    windows = torch.tensor(read_ints(sd, mixture_lane_key(lane), max_decisions), dtype=torch.int64)
    return mixture_digest(count, table, windows)
