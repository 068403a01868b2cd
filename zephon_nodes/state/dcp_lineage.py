"""The DCP keys of a re-lane's lineage: ``lineage_len`` (int64[length, check]) and ``lineage``.

``lineage`` is the lineage's JSON, zero-padded to a fixed room (``max_lineage_bytes``, so DCP
knows the shape before it loads); both keys are replicated (identical on every rank).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from zephon_nodes.errors import CheckpointError

__all__ = ["LINEAGE_DCP_KEY", "LINEAGE_LEN_KEY", "lineage_from_dcp", "lineage_to_dcp"]

LINEAGE_LEN_KEY = "lineage_len"
LINEAGE_DCP_KEY = "lineage"


def _meta(sd: Mapping[str, Any]) -> list[int]:
    value = sd.get(LINEAGE_LEN_KEY)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.numel() != 2:
        raise CheckpointError(
            f"dataloader.{LINEAGE_LEN_KEY}: expected an int64 tensor of 2 value(s), got "
            f"{value!r:.80}"
        )
    return [int(v) for v in value.reshape(-1).tolist()]


def _lineage_check(blob: bytes) -> int:
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 2


def lineage_to_dcp(lineage: Any, room: int) -> dict[str, torch.Tensor]:
    """The lineage keys: its JSON bytes (zero-padded to ``room``) and [length, check]."""
    blob = b""
    if lineage is not None:
        blob = json.dumps(lineage, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(blob) > room:
        raise CheckpointError(
            f"the re-lane lineage takes {len(blob)} bytes, more than dataloader."
            f"max_lineage_bytes={room}; raise it (and keep it for every later resume)"
        )
    data = torch.zeros(room, dtype=torch.uint8)
    if blob:
        data[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    meta = torch.tensor([len(blob), _lineage_check(blob)], dtype=torch.int64)
    return {LINEAGE_LEN_KEY: meta, LINEAGE_DCP_KEY: data}


def lineage_from_dcp(sd: Mapping[str, Any], room: int) -> Any:
    """Read (and check) the lineage keys; None when they hold no lineage."""
    n, check = _meta(sd)
    data = sd.get(LINEAGE_DCP_KEY)
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.numel() != room:
        raise CheckpointError(
            f"dataloader.{LINEAGE_DCP_KEY}: expected uint8[{room}] (dataloader."
            f"max_lineage_bytes), got {data!r:.80}"
        )
    if not 0 <= n <= room:
        raise CheckpointError(f"dataloader.{LINEAGE_LEN_KEY}: length {n} is out of range")
    blob = bytes(data[:n].tolist())
    if check != _lineage_check(blob) or bool(data[n:].any()):
        raise CheckpointError(
            f"dataloader.{LINEAGE_DCP_KEY}: check value mismatch or non-zero padding (the "
            f"re-lane lineage or {LINEAGE_LEN_KEY} was damaged or edited after saving)"
        )
    if not n:
        return None
    try:
        return json.loads(blob.decode("ascii"))
    except ValueError as e:
        raise CheckpointError(f"dataloader.{LINEAGE_DCP_KEY}: not a lineage ({e})") from None
