"""Batch: collate samples into ``torch.LongTensor`` dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

__all__ = ["collate"]


def collate(samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Stack samples into a batch: one ``[batch, ...]`` tensor per key.

    Args:
        samples: Samples with the same keys and shapes (e.g. ``input``, ``labels``,
            ``positions`` of length ``seq_len``).
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    return {key: torch.from_numpy(np.stack([s[key] for s in samples])) for key in samples[0]}
