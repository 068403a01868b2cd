"""Global batch digests: SHA-256 over a fixed, documented byte layout.

For one step, rows are taken in lane order (lane 0's ``G/L`` samples in stream order, then
lane 1's, ...). For each row the hash is fed, in this order:

1. the lane id as 8 bytes, little-endian signed (int64);
2. each field in :data:`FIELD_ORDER` (``input``, ``labels``, ``positions``), then any other
   field in sorted name order (never ``lane``, nor a dump's ``source_shard`` and
   ``source_record``): the row's values as little-endian int64 for integer tensors,
   little-endian float32 for floating-point tensors, raw bytes for uint8.

The digest is the lower-case hex SHA-256. See ``docs/digest.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from zephon_nodes.engine.multiplexer import LANE_KEY
from zephon_nodes.operators.pack import SOURCE_FIELDS

__all__ = ["FIELD_ORDER", "digest_microbatches", "global_batch_digest"]

FIELD_ORDER = ("input", "labels", "positions")


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == np.uint8:
        return arr
    if np.issubdtype(arr.dtype, np.floating):
        return arr.astype("<f4", copy=False)
    return arr.astype("<i8", copy=False)


def _fields(row: Mapping[str, Any]) -> list[str]:
    # A traced batch's source fields say where tokens came from; they are not the data.
    skip = (*FIELD_ORDER, LANE_KEY, *SOURCE_FIELDS)
    rest = sorted(k for k in row if k not in skip)
    return [k for k in FIELD_ORDER if k in row] + rest


def global_batch_digest(rows: Iterable[tuple[int, Mapping[str, Any]]]) -> str:
    """Hash one global batch given as ``(lane, sample)`` rows already in lane order."""
    h = hashlib.sha256()
    for lane, sample in rows:
        h.update(np.int64(lane).astype("<i8").tobytes())
        for key in _fields(sample):
            h.update(np.ascontiguousarray(_as_numpy(sample[key])).tobytes())
    return h.hexdigest()


def digest_microbatches(microbatches: Sequence[Mapping[str, torch.Tensor | np.ndarray]]) -> str:
    """Hash one step's global batch from all ranks' micro-batches (any order of ranks).

    Rows are put in lane order with a stable sort on the ``lane`` field, which keeps each
    lane's samples in stream order.
    """
    if not microbatches:
        raise ValueError("no micro-batches to digest")
    keys = [k for k in microbatches[0] if k != LANE_KEY]
    lanes = np.concatenate([_as_numpy(mb[LANE_KEY]) for mb in microbatches])
    cols = {k: np.concatenate([_as_numpy(mb[k]) for mb in microbatches]) for k in keys}
    order = np.argsort(lanes, kind="stable")
    h = hashlib.sha256()
    fields = _fields(cols)
    for r in order.tolist():
        h.update(np.int64(lanes[r]).astype("<i8").tobytes())
        for key in fields:
            h.update(np.ascontiguousarray(cols[key][r]).tobytes())
    return h.hexdigest()
