"""Helpers shared by the TorchTitan tests and their torchrun scripts."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from zephon_nodes.verification.digest import global_batch_digest

Row = dict[str, np.ndarray]


def rows_of(batch: tuple[dict[str, torch.Tensor], torch.Tensor]) -> list[Row]:
    """Split a TorchTitan micro-batch ``({"input", "positions"}, labels)`` into rows."""
    inputs, labels = batch
    out = []
    for i in range(labels.shape[0]):
        row: Row = {"input": inputs["input"][i].numpy(), "labels": labels[i].numpy()}
        if "positions" in inputs:
            row["positions"] = inputs["positions"][i].numpy()
        out.append(row)
    return out


def step_digest(rank_rows: Sequence[Sequence[Row]], samples_per_lane: int) -> str:
    """Digest one global batch from each rank's rows of the step, ranks in order.

    Ranks own contiguous lane blocks and yield their rows in lane order, so the ranks'
    rows concatenated are the global batch in lane order; row ``j`` belongs to lane
    ``j // samples_per_lane``.
    """
    rows = [r for rr in rank_rows for r in rr]
    return global_batch_digest((j // samples_per_lane, r) for j, r in enumerate(rows))


def content_digest(rank_rows: Sequence[Sequence[Row]]) -> str:
    """Order-free digest of a global batch (the multiset of its rows)."""
    hashes = sorted(
        hashlib.sha256(
            b"".join(np.ascontiguousarray(r[k]).astype("<i8").tobytes() for k in sorted(r))
        ).hexdigest()
        for rr in rank_rows
        for r in rr
    )
    return hashlib.sha256("".join(hashes).encode()).hexdigest()


def take_steps(
    it: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]], steps: int, micro_per_step: int
) -> list[list[Row]]:
    """Consume ``steps`` steps of micro-batches; return each step's rows (in order)."""
    out = []
    for _ in range(steps):
        rows: list[Row] = []
        for _ in range(micro_per_step):
            rows.extend(rows_of(next(it)))
        out.append(rows)
    return out


def save_rows(path: Any, steps: dict[int, list[Row]]) -> None:
    """Save a rank's rows per step (npz: ``s{step}_{field}`` arrays)."""
    arrays = {}
    for step, rows in steps.items():
        for key in rows[0]:
            arrays[f"s{step}_{key}"] = np.stack([r[key] for r in rows])
    np.savez(path, **arrays)


def load_rows(path: Any) -> dict[int, list[Row]]:
    """Load what :func:`save_rows` wrote."""
    data = np.load(path)
    by_step: dict[int, dict[str, np.ndarray]] = {}
    for name in data.files:
        step_s, key = name[1:].split("_", 1)
        by_step.setdefault(int(step_s), {})[key] = data[name]
    out = {}
    for step, fields in sorted(by_step.items()):
        n = len(next(iter(fields.values())))
        out[step] = [{k: v[i] for k, v in fields.items()} for i in range(n)]
    return out
