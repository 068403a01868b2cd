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
from zephon_nodes.operators.tokencache import cached_item_pairs

__all__ = ["EXACT_RECORDS", "MAX_BALANCED_ITEMS", "BalancedWorkSource", "item_sizes"]

# Datasets of at most this many records are sized by exact tokens (read and tokenized once
# when the pipeline is built); larger ones by record counts.
EXACT_RECORDS = 1 << 16
# A finite stream of more work items (over all its epochs) than this is dealt round-robin
# under work.deal = "auto" and refused under "balanced": the deal holds one entry per item of
# the stream and costs about 1.7 s per million items at start-up. With that many items each
# lane holds so many that round-robin already ends the lanes close together.
MAX_BALANCED_ITEMS = 1 << 20


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
        cached = cached_item_pairs(chain, work)  # the token cache: no record is read
        if cached is not None:
            sizes[k] = cached
            continue
        lengths = np.asarray(chain(work).lengths, dtype=np.int64)
        sizes[k] = int(np.maximum(lengths - 1, 0).sum())
    return sizes, "tokens"


def _record_counts(dataset: Dataset) -> np.ndarray:
    """Records of every work item (``chunk_size``, less for a shard's last), from the index."""
    c = dataset.chunk_size
    # Vectorized over the shards' record counts (no shard is opened: with a dataset index
    # they come from its columns).
    records = dataset.shard_records
    items = -(-records // c)
    counts = np.full(int(items.sum()), c, dtype=np.int64)
    has = items > 0
    last = np.cumsum(items)[has] - 1
    counts[last] = records[has] - (items[has] - 1) * c
    return counts


def _refine(
    lane_of: np.ndarray,
    sizes: np.ndarray,
    lanes: int,
    rounds: int = 200,
    start: np.ndarray | None = None,
) -> None:
    """Improve an LPT deal in place.

    Swap (or move) items between the fullest and the emptiest lane while that narrows their
    gap; at most ``rounds`` times. Deterministic (ties go to the first item). ``start``: the
    load each lane holds before its items (zeros by default).
    """
    for _ in range(rounds):
        held = np.bincount(lane_of, weights=sizes, minlength=lanes).astype(np.int64)
        if start is not None:
            held = held + start
        hi, lo = int(np.argmax(held)), int(np.argmin(held))
        gap = int(held[hi] - held[lo])
        if gap <= 0:
            return
        got = _best_move(lane_of, sizes, hi, lo, gap)
        if got is None:
            return
        a, b = got
        lane_of[a] = lo
        if b >= 0:
            lane_of[b] = hi


def _closest_exchange(sa: np.ndarray, b_sorted: np.ndarray, gap: int) -> tuple[int, int] | None:
    """The exchange that narrows a gap between two lanes the most.

    Moving ``a`` (size ``sa[a]``) against ``b`` (size ``b_sorted[j]``) changes the gap to
    ``|gap - 2 (size a - size b)|``: for each ``a``, the two ``b`` closest to
    ``size a - gap / 2``. Returns ``(a, j)`` of the best strict improvement (the first ``a``,
    then the smaller ``b``, on ties), or None.
    """
    k = np.searchsorted(b_sorted, sa - gap / 2)
    js = np.stack([k - 1, k], axis=1)
    ok = (js >= 0) & (js < len(b_sorted))
    delta = sa[:, None] - b_sorted[np.clip(js, 0, len(b_sorted) - 1)]
    new = np.abs(gap - 2 * delta)
    ok &= (delta > 0) & (new < gap)
    if not ok.any():
        return None
    flat = int(np.argmin(np.where(ok, new, np.iinfo(np.int64).max).ravel()))
    return flat // 2, int(js.ravel()[flat])


def _best_move(
    lane_of: np.ndarray, sizes: np.ndarray, hi: int, lo: int, gap: int
) -> tuple[int, int] | None:
    """The swap that narrows the ``gap`` between lanes ``hi`` and ``lo`` most, or None.

    Returns ``(a, b)``: item ``a`` of ``hi`` goes to ``lo`` and item ``b`` of ``lo`` to ``hi``
    (``b = -1``: a move, no swap).
    """
    a_idx = np.flatnonzero(lane_of == hi)
    if not len(a_idx):  # the fuller lane holds only its start load
        return None
    b_idx = np.concatenate([np.flatnonzero(lane_of == lo), [-1]])  # -1: move, no swap
    b_sizes = np.where(b_idx >= 0, sizes[np.maximum(b_idx, 0)], 0)
    order = np.argsort(b_sizes, kind="stable")
    b_sorted = b_sizes[order]
    best = _closest_exchange(sizes[a_idx], b_sorted, gap)
    if best is None:
        return None
    return int(a_idx[best[0]]), int(b_idx[order[best[1]]])


def _settle(
    lane_of: np.ndarray, sizes: np.ndarray, lanes: int, start: np.ndarray, rounds: int = 200
) -> None:
    """Narrow a deal with start loads further, in place: pairs beyond fullest/emptiest.

    With start loads (a re-lane's leftovers) and few items, the fullest and the emptiest
    lane may have no narrowing swap while other pairs do. Each round takes the first pair,
    fullest lane against the others from the emptiest up, then the emptiest against the
    others from the fullest down, whose best swap narrows its gap; if none has one, the first
    such pair with an exchange of up to two items each way that does (lanes of at most 64
    items). The sum of squared loads falls every round, so it ends. Deterministic.
    """
    for _ in range(rounds):
        held = np.bincount(lane_of, weights=sizes, minlength=lanes).astype(np.int64) + start
        order = np.argsort(held, kind="stable").tolist()
        top, bottom = order[-1], order[0]
        pairs = [(top, lo) for lo in order[:-1]] + [(hi, bottom) for hi in order[-2:0:-1]]
        for hi, lo in pairs:
            gap = int(held[hi] - held[lo])
            got = _best_move(lane_of, sizes, hi, lo, gap) if gap > 0 else None
            if got is not None:
                a, b = got
                lane_of[a] = lo
                if b >= 0:
                    lane_of[b] = hi
                break
        else:
            for hi, lo in pairs:  # no single swap narrows a gap: try two items for one or two
                gap = int(held[hi] - held[lo])
                swap = _best_exchange(lane_of, sizes, hi, lo, gap) if gap > 0 else None
                if swap is not None:
                    lane_of[swap[0]] = lo
                    lane_of[swap[1]] = hi
                    break
            else:
                return


def _options(items: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every set of at most two of ``items`` (the empty set first): ``(first, second, sum)``.

    ``-1`` marks an absent member; sets in a fixed order (singles, then pairs ``i < j``).
    """
    n = len(items)
    i, j = np.triu_indices(n, k=1)
    first = np.concatenate([[-1], items, items[i]]).astype(np.int64)
    second = np.concatenate([[-1], np.full(n, -1), items[j]]).astype(np.int64)
    total = np.where(first >= 0, sizes[np.maximum(first, 0)], 0) + np.where(
        second >= 0, sizes[np.maximum(second, 0)], 0
    )
    return first, second, total


def _best_exchange(
    lane_of: np.ndarray, sizes: np.ndarray, hi: int, lo: int, gap: int, limit: int = 64
) -> tuple[list[int], list[int]] | None:
    """The exchange of up to two items each way that narrows the gap of ``hi`` and ``lo`` most.

    Only for lanes of at most ``limit`` items (a re-lane's few untouched items per lane, where
    single swaps get stuck); None if none narrows the gap. Returns ``(from hi, from lo)``.
    """
    a_items, b_items = np.flatnonzero(lane_of == hi), np.flatnonzero(lane_of == lo)
    if not len(a_items) or len(a_items) > limit or len(b_items) > limit:
        return None
    a1, a2, sa = _options(a_items, sizes)
    b1, b2, sb = _options(b_items, sizes)
    order = np.argsort(sb, kind="stable")
    b_sorted = sb[order]
    best = _closest_exchange(sa, b_sorted, gap)
    if best is None:
        return None
    a, b = best[0], int(order[best[1]])
    give = [int(x) for x in (a1[a], a2[a]) if x >= 0]
    take = [int(x) for x in (b1[b], b2[b]) if x >= 0]
    return give, take


def deal(sizes: np.ndarray, lanes: int, start: np.ndarray | None = None) -> np.ndarray:
    """Lane of each item: largest first to the lane holding the least (LPT), then swaps.

    Args:
        sizes: Size of each item.
        lanes: Number of lanes.
        start: Load each lane already holds before its items (default: none).
    """
    total = len(sizes)
    order = np.lexsort((np.arange(total), -sizes))  # largest first, then stream order
    if start is not None:
        start = np.asarray(start, dtype=np.int64)
    heap = [(0 if start is None else int(start[lane]), lane) for lane in range(lanes)]
    lane_of = np.empty(total, dtype=np.int64)
    for g in order.tolist():
        held, lane = heapq.heappop(heap)
        lane_of[g] = lane
        heapq.heappush(heap, (held + int(sizes[g]), lane))
    _refine(lane_of, sizes, lanes, start=start)
    if start is not None:
        _settle(lane_of, sizes, lanes, start)
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
        self.stream_sizes = stream
        self.streams = [np.flatnonzero(lane_of == lane) for lane in range(self.num_lanes)]
        self.lane_sizes = [int(stream[s].sum()) for s in self.streams]

    def lane_length(self, lane: int) -> int:
        """Number of work items of ``lane``."""
        return len(self.streams[lane])

    def lane_item_sizes(self, lane: int) -> np.ndarray:
        """Size of each of ``lane``'s items, in its order (re-laning deals by them too)."""
        return self.stream_sizes[self.streams[lane]]

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
