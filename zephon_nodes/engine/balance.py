"""Balanced dealing: a finite stream's work items dealt so lanes hold about equal tokens.

Round-robin dealing (item ``g`` to lane ``g % L``) gives every lane the same number of work
items, but items differ in size, so at the end of finite data some lanes still hold many
samples when the shortest runs dry (see ``docs/torchdata.md``). Balanced dealing gives every
work item of the dataset a size, deals the stream's items largest first, each to the lane
holding the least so far (LPT), then swaps items between the fullest and the emptiest lane
while that narrows their gap; each lane reads its items in stream order.

The size of an item is what makes samples: its **tokens** (the ``n - 1`` input/label pairs of
each document after the recipe's parse, filters, maps and tokenizer, exactly what the packer
receives), measured by running the lane's stateless chain over every item once when the
pipeline is built. That reads every record, so it is done only for datasets of at most
:data:`EXACT_RECORDS` records; a larger dataset's items are sized by their **record count**
(from the shard index: no content is read), and its lanes rely on holding many items each.
Both sizes depend on the records alone, never on the storage format (JSON lines, Parquet,
Arrow or in-memory records deal identically). A pure function of the recipe and the data,
computed once per pipeline; passes reuse the sizes.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource
from zephon_nodes.io.dataset import Dataset

__all__ = ["EXACT_RECORDS", "BalancedWorkSource", "item_sizes"]

# Datasets of at most this many records are sized by exact tokens (read and tokenized once
# when the pipeline is built); larger ones by record counts.
EXACT_RECORDS = 1 << 16


def item_sizes(
    dataset: Dataset, dataset_index: int, chain: Callable[[WorkItem], Any]
) -> tuple[np.ndarray, str]:
    """Size of every work item of ``dataset`` and the measure used (``"tokens"``/``"records"``).

    Tokens: the input/label pairs ``chain`` (the lane's stateless operators) makes of the
    item's documents, for a dataset of at most :data:`EXACT_RECORDS` records; otherwise the
    item's record count.
    """
    n = dataset.num_work_items
    if dataset.num_records > EXACT_RECORDS:
        return _record_counts(dataset), "records"
    sizes = np.zeros(n, dtype=np.int64)
    for k in range(n):
        shard, start, stop = dataset.locate(k)
        work = WorkItem(
            dataset_index,
            dataset.name,
            dataset.text_field,
            k,
            0,
            dataset.shards[shard],
            start,
            stop,
            0,
            0,
        )
        lengths = np.asarray(chain(work).lengths, dtype=np.int64)
        sizes[k] = int(np.maximum(lengths - 1, 0).sum())
    return sizes, "tokens"


def _record_counts(dataset: Dataset) -> np.ndarray:
    """Records of every work item (``chunk_size``, less for a shard's last), from the index."""
    c = dataset.chunk_size
    parts = []
    for shard in dataset.shards:
        m = shard.num_records
        items = -(-m // c)
        counts = np.full(items, c, dtype=np.int64)
        if items:
            counts[-1] = m - (items - 1) * c
        parts.append(counts)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _refine(lane_of: np.ndarray, sizes: np.ndarray, lanes: int, rounds: int = 200) -> None:
    """Improve an LPT deal in place.

    Swap (or move) items between the fullest and the emptiest lane while that narrows their
    gap; at most ``rounds`` times. Deterministic (ties go to the first item).
    """
    for _ in range(rounds):
        held = np.bincount(lane_of, weights=sizes, minlength=lanes).astype(np.int64)
        hi, lo = int(np.argmax(held)), int(np.argmin(held))
        gap = int(held[hi] - held[lo])
        if gap <= 0:
            return
        a_idx = np.flatnonzero(lane_of == hi)
        b_idx = np.concatenate([np.flatnonzero(lane_of == lo), [-1]])  # -1: move, no swap
        b_sizes = np.where(b_idx >= 0, sizes[np.maximum(b_idx, 0)], 0)
        order = np.argsort(b_sizes, kind="stable")
        b_sorted = b_sizes[order]
        # Moving a against b changes the gap to |gap - 2 (size a - size b)|: for each a, the
        # two b closest to size a - gap / 2; the best strict improvement, first a (then the
        # smaller b) on ties.
        sa = sizes[a_idx]
        k = np.searchsorted(b_sorted, sa - gap / 2)
        js = np.stack([k - 1, k], axis=1)
        ok = (js >= 0) & (js < len(b_sorted))
        delta = sa[:, None] - b_sorted[np.clip(js, 0, len(b_sorted) - 1)]
        new = np.abs(gap - 2 * delta)
        ok &= (delta > 0) & (new < gap)
        if not ok.any():
            return
        flat = int(np.argmin(np.where(ok, new, np.iinfo(np.int64).max).ravel()))
        a = int(a_idx[flat // 2])
        b = int(b_idx[order[int(js.ravel()[flat])]])
        lane_of[a] = lo
        if b >= 0:
            lane_of[b] = hi


def deal(sizes: np.ndarray, lanes: int) -> np.ndarray:
    """Lane of each item: largest first to the lane holding the least (LPT), then swaps."""
    total = len(sizes)
    order = np.lexsort((np.arange(total), -sizes))  # largest first, then stream order
    heap = [(0, lane) for lane in range(lanes)]
    lane_of = np.empty(total, dtype=np.int64)
    for g in order.tolist():
        held, lane = heapq.heappop(heap)
        lane_of[g] = lane
        heapq.heappush(heap, (held + int(sizes[g]), lane))
    _refine(lane_of, sizes, lanes)
    return lane_of


class BalancedWorkSource(WorkSource):
    """The items of a finite dataset stream, re-dealt to lanes by size (LPT, then swaps).

    Args:
        inner: The round-robin source (global item ``g`` is ``inner.work(g % L, g // L)``).
        sizes: Size of each work item of the dataset (see :func:`item_sizes`).
        measure: What ``sizes`` counts (``"tokens"`` or ``"records"``).
    """

    def __init__(self, inner: DatasetWorkSource, sizes: np.ndarray, measure: str) -> None:
        super().__init__(inner.num_lanes)
        total = inner.total_items
        if total is None:
            raise ValueError("balanced dealing needs a finite stream")
        self.inner = inner
        self.item_sizes = sizes
        self.measure = measure
        self.total = total
        n = inner.dataset.num_work_items
        epochs = -(-total // n) if n else 0
        stream = np.concatenate(
            [sizes[inner.permutation(e)] for e in range(epochs)] or [sizes[:0]]
        )[:total]
        lane_of = deal(stream, self.num_lanes)
        self.streams = [np.flatnonzero(lane_of == lane) for lane in range(self.num_lanes)]
        self.lane_sizes = [int(stream[s].sum()) for s in self.streams]

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return item ``i`` of ``lane`` (in stream order), or None past its last."""
        stream = self.streams[lane]
        if i >= len(stream):
            return None
        g = int(stream[i])
        item = self.inner.work(g % self.num_lanes, g // self.num_lanes)
        assert item is not None
        return dataclasses.replace(item, lane=lane, position=i)

    def make_pass(self, p: int) -> BalancedWorkSource | None:
        """Pass ``p``: the inner source's pass, dealt again (same item sizes)."""
        inner = self.inner.for_pass(p)
        if not isinstance(inner, DatasetWorkSource):
            return None
        return BalancedWorkSource(inner, self.item_sizes, self.measure)
