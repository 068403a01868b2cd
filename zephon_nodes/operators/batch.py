"""Batch: collate samples into ``torch.LongTensor`` dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["collate"]


def _stack(arrays: list[Any]) -> np.ndarray:
    """``np.stack(arrays)``: one ``np.concatenate`` when every array has the first one's shape.

    ``np.stack`` is a concatenate of the arrays with a new axis each (its dtype promotion is
    concatenate's); without the per-array views it is faster on a batch of short rows.
    Anything else (other shapes, 0-d arrays, lists) goes to ``np.stack``, which raises or
    stacks as before.
    """
    first = arrays[0]
    if type(first) is not np.ndarray or not first.ndim:  # 0-d arrays do not concatenate
        return np.stack(arrays)
    shape = first.shape
    for a in arrays:
        if type(a) is not np.ndarray or a.shape != shape:
            return np.stack(arrays)
    return np.concatenate(arrays).reshape(len(arrays), *shape)


def collate(samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack samples into a batch: one ``[batch, ...]`` tensor per key.

    Args:
        samples: Samples with the same keys and shapes (e.g. ``input``, ``labels``,
            ``positions`` of length ``seq_len``).
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    return {key: torch.from_numpy(_stack([s[key] for s in samples])) for key in samples[0]}
