"""Small tensors of the DCP state: an int64 scalar, and checked reads of int64 values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from zephon_nodes.core.errors import CheckpointError

__all__ = ["read_ints", "scalar"]


def scalar(value: int) -> torch.Tensor:
    """An int64 tensor of one value."""
    return torch.tensor([value], dtype=torch.int64)


def read_ints(sd: Mapping[str, Any], key: str, n: int, room: str = "") -> list[int]:
    """The ``n`` values of the int64 tensor ``sd[key]``.

    Raises:
        CheckpointError: Naming ``dataloader.<key>`` (and ``room``, the setting that sets
            its size, if given) when it is absent or not ``n`` int64 values.
    """
    value = sd.get(key)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.numel() != n:
        raise CheckpointError(
            f"dataloader.{key}: expected an int64 tensor of {n} value(s){room}, got {value!r:.80}"
        )
    return [int(v) for v in value.reshape(-1).tolist()]
