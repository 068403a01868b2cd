"""Balanced dealing: a finite stream's work items dealt so lanes hold about equal bytes.

Round-robin dealing (item ``g`` to lane ``g % L``) gives every lane the same number of work
items, but items differ in size, so at the end of finite data some lanes still hold many
samples when the shortest runs dry (see ``docs/torchdata.md``). Balanced dealing looks at
the size of every item of the stream (bytes, from the shard index) and deals them largest
first, each to the lane holding the fewest bytes so far (LPT), then swaps items between the
fullest and the emptiest lane while that narrows their gap; each lane reads its items in
stream order. A pure function of the recipe and the data, computed once per pass (one
``work()`` call per item: about a second per few hundred thousand items).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable

import numpy as np

from zephon_nodes.engine.work import WorkItem, WorkSource
from zephon_nodes.errors import RecipeError
from zephon_nodes.io.shards import FileShard, _load_index

__all__ = ["BalancedWorkSource", "item_bytes"]


def item_bytes(item: WorkItem) -> int:
    """Size of a work item: the bytes of its records in a JSON lines shard (from the index).

    Raises:
        RecipeError: For a shard without a byte index (Parquet, tar, in-memory records):
            a size read another way would make the batches depend on the storage format.
    """
    shard = item.shard
    if not isinstance(shard, FileShard):
        raise RecipeError(
            f"work.deal='balanced' needs JSON lines shards (their index holds record bytes); "
            f"dataset {item.dataset_name!r} has {shard.path} ({type(shard).__name__}): use "
            f"work.deal='round_robin'"
        )
    if item.stop <= item.start:
        return 0
    index = _load_index(shard.index_path)
    return int(index[item.stop - 1, 1] - index[item.start, 0])


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
        best: tuple[int, int, int] | None = None  # (new gap, a, b)
        for a in a_idx.tolist():
            # moving a against b changes the gap to |gap - 2 (size a - size b)|
            target = sizes[a] - gap / 2
            k = int(np.searchsorted(b_sorted, target))
            for j in (k - 1, k):
                if 0 <= j < len(b_sorted):
                    delta = int(sizes[a] - b_sorted[j])
                    new = abs(gap - 2 * delta)
                    if delta > 0 and new < gap and (best is None or new < best[0]):
                        best = (new, a, int(b_idx[order[j]]))
        if best is None:
            return
        _, a, b = best
        lane_of[a] = lo
        if b >= 0:
            lane_of[b] = hi


class BalancedWorkSource(WorkSource):
    """The items of a finite work source, re-dealt to lanes by size (largest first, LPT).

    Args:
        inner: The round-robin source (global item ``g`` is ``inner.work(g % L, g // L)``).
        total: Global items in the stream (the end of ``inner``).
        size: Size of one item (default :func:`item_bytes`).
    """

    def __init__(
        self,
        inner: WorkSource,
        total: int,
        size: Callable[[WorkItem], int] = item_bytes,
    ) -> None:
        super().__init__(inner.num_lanes)
        self.inner = inner
        self.total = total
        self.size = size
        L = inner.num_lanes
        sizes = np.zeros(total, dtype=np.int64)
        for g in range(total):
            item = inner.work(g % L, g // L)
            if item is None:
                raise ValueError(f"work item {g} of {total} is missing")
            sizes[g] = size(item)
        order = np.lexsort((np.arange(total), -sizes))  # largest first, then stream order
        heap = [(0, lane) for lane in range(L)]
        lane_of = np.empty(total, dtype=np.int64)
        for g in order.tolist():
            held, lane = heapq.heappop(heap)
            lane_of[g] = lane
            heapq.heappush(heap, (held + int(sizes[g]), lane))
        _refine(lane_of, sizes, L)
        self.streams = [np.flatnonzero(lane_of == lane) for lane in range(L)]
        self.lane_bytes = [int(sizes[s].sum()) for s in self.streams]

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
        """Pass ``p``: the inner source's pass, dealt again."""
        inner = self.inner.for_pass(p)
        return None if inner is None else BalancedWorkSource(inner, self.total, self.size)
