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
computed once per pipeline; passes reuse the sizes. Token sizes are also kept in the node
cache under a key naming the data and the tokenizer (:func:`sizes_key`): the first build of
a node computes them, every later one (each rank, each restart) reads one small file.

Every rank deals all its stream's items (the deal is global), in O(items log items): equal
sizes at least as many as the lanes are dealt at once, exactly as the heap would
(:func:`_deal_run`), and the lanes' item lists come from one stable sort
(:func:`lane_streams`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon_nodes.core.errors import FILE_ERROR_KINDS
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.engine.work import DatasetWorkSource, WorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.formats.lines import is_text_lines
from zephon_nodes.io.index.lazyshards import LazyShards
from zephon_nodes.io.nodecache.itemsizes import node_sizes
from zephon_nodes.operators.bestfit import LongDocuments
from zephon_nodes.operators.parse import ParseJsonl
from zephon_nodes.operators.tokencache import (
    CachedParse,
    CachedTokenize,
    cached_item_pairs,
    tokenizer_identity,
)
from zephon_nodes.operators.tokenize import Tokenize

__all__ = [
    "EXACT_RECORDS",
    "MAX_BALANCED_ITEMS",
    "BalancedWorkSource",
    "deal",
    "item_sizes",
    "lane_streams",
    "sizes_key",
]

# Datasets of at most this many records are sized by exact tokens (read and tokenized once
# when the pipeline is built); larger ones by record counts.
EXACT_RECORDS = 1 << 16
# A finite stream of more work items (over all its epochs) than this is dealt round-robin
# under work.deal = "auto" and refused under "balanced": the deal holds one entry per item of
# the stream and costs about 1.7 s per million items at start-up. With that many items each
# lane holds so many that round-robin already ends the lanes close together.
MAX_BALANCED_ITEMS = 1 << 20
# Bump when what a token size counts changes (sizes kept in node caches are then not used).
SIZES_VERSION = 1


def item_sizes(
    dataset: Dataset, dataset_index: int, chain: Callable[[WorkItem], Any]
) -> tuple[np.ndarray, str]:
    """Size of every work item of ``dataset`` and the measure used (``"tokens"``/``"records"``).

    Tokens: the input/label pairs ``chain`` (the lane's stateless operators) makes of the
    item's documents, for a dataset of at most :data:`EXACT_RECORDS` records; otherwise the
    item's record count. Token sizes are kept in the node cache
    (:mod:`zephon_nodes.io.nodecache.itemsizes`, see :func:`sizes_key`): one process of a
    node computes them, every later build reads them.
    """
    if dataset.num_records > EXACT_RECORDS:
        return _record_counts(dataset), "records"
    key = sizes_key(dataset, dataset_index, chain)
    sizes, _ = node_sizes(key, lambda: _token_sizes(dataset, dataset_index, chain))
    return sizes, "tokens"


def _token_sizes(
    dataset: Dataset, dataset_index: int, chain: Callable[[WorkItem], Any]
) -> tuple[np.ndarray, bool]:
    """Every item's input/label pairs, and whether they may be kept (no file unreadable)."""
    n = dataset.num_work_items
    sizes = np.zeros(n, dtype=np.int64)
    keep = True
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
        docs = chain(work)
        # A file skipped as unreadable may read next time: such sizes are not kept.
        keep = keep and not any(reason in FILE_ERROR_KINDS for reason, _ in docs.skipped)
        lengths = np.asarray(docs.lengths, dtype=np.int64)
        sizes[k] = int(np.maximum(lengths - 1, 0).sum())
    return sizes, keep


def sizes_key(dataset: Dataset, dataset_index: int, chain: Callable[[WorkItem], Any]) -> str | None:
    """The node-cache key of a dataset's token sizes; None if they cannot be keyed.

    Made of everything a size depends on: the shards' content identities (from the dataset
    index's columns, else each opened shard's checksum) and record counts, the chunk size,
    the text field, the dataset's error policy, the parse's vocabulary check, the tokenizer's
    identity (:func:`~zephon_nodes.operators.tokencache.tokenizer_identity`: its file, options,
    library and the parse/tokenize code version), the long-document rule and which shards are
    plain-text lines. Only a chain of
    parse, tokenize (not a custom tokenizer) and the long-document rule is keyed: filters and
    maps run registered code no key can see. A shard without a checksum: None.
    """
    ops = tuple(getattr(chain, "operators", ()))
    if len(ops) < 2:
        return None
    parse = ops[0].parse if isinstance(ops[0], CachedParse) else ops[0]
    tokenize = ops[1].tokenize if isinstance(ops[1], CachedTokenize) else ops[1]
    if type(parse) is not ParseJsonl or type(tokenize) is not Tokenize:
        return None
    rest = [[op.seq_len, op.mode] for op in ops[2:] if type(op) is LongDocuments]
    identity = (
        tokenizer_identity(tokenize.spec, tokenize.sha256) if tokenize.tokenizer is None else None
    )
    contents = _contents_digest(dataset)
    if identity is None or contents is None or len(rest) != len(ops) - 2:
        return None
    text = json.dumps(
        [
            SIZES_VERSION,
            identity,
            contents,
            dataset.chunk_size,
            dataset.text_field,
            dataset_index in parse.skip,
            parse.vocab_size,
            rest,
            # plain-text shards are parsed otherwise than JSON ones of the same bytes
            *([["text-lines", lines]] if (lines := _text_lines(dataset)) else []),
        ]
    )
    return "s-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def _text_lines(dataset: Dataset) -> list[int]:
    """Indexes of the dataset's plain-text shards (``.txt``: each line is a text)."""
    shards = dataset.shards
    if isinstance(shards, LazyShards):  # their paths from the index: no shard is opened
        table, rows = shards.files.table, shards.files.rows
        paths: Any = (table.uri(int(row)) for row in rows)
    else:
        paths = (getattr(shard, "path", "") for shard in shards)
    return [k for k, path in enumerate(paths) if is_text_lines(path)]


def _contents_digest(dataset: Dataset) -> str | None:
    """A digest of every shard's content identity and record count, in order (None: unkeyed)."""
    h = hashlib.sha256(dataset.shard_records.astype("<i8").tobytes())
    shards = dataset.shards
    if isinstance(shards, LazyShards):  # the index's columns: no shard is opened
        for chunk in shards.files.table.identities_json(shards.files.rows):
            h.update(chunk)
        return h.hexdigest()
    for shard in shards:
        checksum = getattr(shard, "checksum", "") or getattr(
            getattr(shard, "shard", None), "checksum", ""
        )
        if not checksum:
            return None
        h.update(f"{checksum}\n".encode())
    return h.hexdigest()


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
    held = np.bincount(lane_of, weights=sizes, minlength=lanes).astype(np.int64)
    if start is not None:
        held = held + start
    for _ in range(rounds):
        hi, lo = int(np.argmax(held)), int(np.argmin(held))
        gap = int(held[hi] - held[lo])
        if gap <= 0:
            return
        got = _best_move(lane_of, sizes, hi, lo, gap)
        if got is None:
            return
        a, b = got
        lane_of[a] = lo
        moved = int(sizes[a])
        if b >= 0:
            lane_of[b] = hi
            moved -= int(sizes[b])
        held[hi] -= moved  # the loads, kept as a recount would give them
        held[lo] += moved


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
        sizes: Size of each item (>= 0).
        lanes: Number of lanes.
        start: Load each lane already holds before its items (default: none).
    """
    total = len(sizes)
    order = np.lexsort((np.arange(total), -sizes))  # largest first, then stream order
    if start is None:
        lane_of = _lpt(np.asarray(sizes, dtype=np.int64), order, np.zeros(lanes, dtype=np.int64))
    else:
        start = np.asarray(start, dtype=np.int64)
        lane_of = _lpt_from(sizes, order, start)
    _refine(lane_of, sizes, lanes, start=start)
    if start is not None:
        _settle(lane_of, sizes, lanes, start)
    return lane_of


def _lpt_from(sizes: np.ndarray, order: np.ndarray, start: np.ndarray) -> np.ndarray:
    """LPT after start loads (a re-lane's leftovers: few items), exactly as first written.

    The list of ``(start load, lane)`` is popped as it is, never heapified: which lane each
    item goes to (and so the digests of every re-laned run) depends on that order.
    """
    heap = [(int(start[lane]), lane) for lane in range(len(start))]
    lane_of = np.empty(len(sizes), dtype=np.int64)
    for g in order.tolist():
        held, lane = heapq.heappop(heap)
        lane_of[g] = lane
        heapq.heappush(heap, (held + int(sizes[g]), lane))
    return lane_of


def _lpt(sizes: np.ndarray, order: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Items in ``order``, each to the lane holding the least (ties: the lower lane).

    ``held``: each lane's load before (updated in place). A heap per item, except over a run
    of at least as many equal sizes as lanes: that run is dealt at once
    (:func:`_deal_run`), exactly as the heap would deal it.
    """
    lanes = len(held)
    lane_of = np.empty(len(sizes), dtype=np.int64)
    ranked = sizes[order]
    cuts = np.flatnonzero(ranked[1:] != ranked[:-1]) + 1
    bounds = np.concatenate([[0], cuts, [len(ranked)]]).tolist()
    runs = [(a, b) for a, b in itertools.pairwise(bounds) if b - a >= lanes]
    pos = 0
    for a, b in [*runs, (len(ranked), len(ranked))]:
        if a > pos:
            _deal_heap(order[pos:a], sizes, held, lane_of)
        if b > a:
            lane_of[order[a:b]] = _deal_run(int(ranked[a]), b - a, held)
        pos = b
    return lane_of


def _deal_heap(items: np.ndarray, sizes: np.ndarray, held: np.ndarray, lane_of: np.ndarray) -> None:
    """LPT with a heap of ``(load, lane)``: each of ``items`` to the least loaded lane."""
    heap = list(zip(held.tolist(), range(len(held)), strict=True))
    heapq.heapify(heap)
    for g in items.tolist():
        load, lane = heapq.heappop(heap)
        lane_of[g] = lane
        heapq.heappush(heap, (load + int(sizes[g]), lane))
    for load, lane in heap:
        held[lane] = load


def _deal_run(size: int, k: int, held: np.ndarray) -> np.ndarray:
    """The lanes the heap gives ``k`` items of one ``size`` in turn; ``held`` updated in place.

    Lane ``l`` offers the keys ``(held[l] + j * size, l)`` for ``j = 0, 1, ...`` and the heap
    pops the smallest key each time, so the ``k`` items take the ``k`` smallest keys, in
    order. Found with a binary search on the largest load ``t`` below which at most ``k``
    keys lie (the rest: keys of load ``t``, lower lanes first); O(lanes log + k log k).
    """
    lanes = np.arange(len(held), dtype=np.int64)
    if size <= 0:  # the least loaded lane stays the least loaded: it takes them all
        lane = int(np.argmin(held))
        return np.full(k, lane, dtype=np.int64)

    def below(t: int) -> np.ndarray:  # keys of each lane with a load below t
        return np.maximum(-((held - t) // size), 0)

    lo, hi = int(held.min()), int(held.min()) + k * size  # below(lo) = 0, below(hi + 1) > k
    while lo < hi:  # the largest t with below(t).sum() <= k
        mid = (lo + hi + 1) // 2
        if int(below(mid).sum()) <= k:
            lo = mid
        else:
            hi = mid - 1
    counts = below(lo)
    at = (held <= lo) & ((lo - held) % size == 0)  # lanes with a key of load exactly lo
    counts[np.flatnonzero(at)[: k - int(counts.sum())]] += 1
    owner = np.repeat(lanes, counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    load = held[owner] + (np.arange(k, dtype=np.int64) - first) * size
    held += counts * size
    return owner[np.lexsort((owner, load))]


def lane_streams(
    lane_of: np.ndarray, sizes: np.ndarray, lanes: int
) -> tuple[list[np.ndarray], list[int]]:
    """Each lane's items in stream order, and the load of each lane, from a deal.

    One stable sort of the items by lane (O(items log items), not one scan of every item
    per lane): lane ``l`` gets exactly ``np.flatnonzero(lane_of == l)``.
    """
    order = np.argsort(lane_of, kind="stable").astype(np.int64)
    ends = np.cumsum(np.bincount(lane_of, minlength=lanes))
    streams = np.split(order, ends[:-1])
    loads = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes[order], dtype=np.int64)])
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
    return streams, (loads[ends] - loads[starts]).tolist()


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
        self.streams, self.lane_sizes = lane_streams(lane_of, stream, self.num_lanes)

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
