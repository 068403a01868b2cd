"""Balanced dealing's fast paths give exactly the assignment of the original algorithm.

The reference below is the deal as first written (a heap pop per item, the loads recounted
every refining round, one ``flatnonzero`` per lane): the digests of every balanced recipe
depend on this assignment, so the fast one must match it item for item.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from zephon_nodes.engine import balance


def _reference_refine(
    lane_of: np.ndarray, sizes: np.ndarray, lanes: int, start: np.ndarray | None
) -> None:
    for _ in range(200):
        held = np.bincount(lane_of, weights=sizes, minlength=lanes).astype(np.int64)
        if start is not None:
            held = held + start
        hi, lo = int(np.argmax(held)), int(np.argmin(held))
        gap = int(held[hi] - held[lo])
        if gap <= 0:
            return
        got = balance._best_move(lane_of, sizes, hi, lo, gap)
        if got is None:
            return
        a, b = got
        lane_of[a] = lo
        if b >= 0:
            lane_of[b] = hi


def reference_deal(sizes: np.ndarray, lanes: int, start: np.ndarray | None = None) -> np.ndarray:
    total = len(sizes)
    order = np.lexsort((np.arange(total), -sizes))
    if start is not None:
        start = np.asarray(start, dtype=np.int64)
    heap = [(0 if start is None else int(start[lane]), lane) for lane in range(lanes)]
    lane_of = np.empty(total, dtype=np.int64)
    for g in order.tolist():
        held, lane = heapq.heappop(heap)
        lane_of[g] = lane
        heapq.heappush(heap, (held + int(sizes[g]), lane))
    _reference_refine(lane_of, sizes, lanes, start)
    if start is not None:
        balance._settle(lane_of, sizes, lanes, start)
    return lane_of


def _cases() -> list[tuple[str, np.ndarray, int, np.ndarray | None]]:
    rng = np.random.default_rng(34)
    cases: list[tuple[str, np.ndarray, int, np.ndarray | None]] = []
    for trial in range(12):
        lanes = int(rng.choice([1, 2, 3, 7, 16, 64, 256]))
        n = int(rng.integers(1, 3000))
        kind = trial % 4
        if kind == 0:  # token sizes: mostly distinct
            sizes = rng.integers(0, 5000, n)
        elif kind == 1:  # record counts: chunk_size, a shard's last item shorter
            sizes = np.where(rng.random(n) < 0.1, rng.integers(1, 4, n), 4)
        elif kind == 2:  # few distinct values, long runs, zeros among them
            sizes = rng.choice([0, 1, 5, 9], n)
        else:  # one size only
            sizes = np.full(n, int(rng.integers(0, 3)))
        start = rng.integers(0, 50, lanes) if trial % 3 == 0 else None
        cases.append((f"{trial}-kind{kind}-{lanes}lanes-{n}", sizes.astype(np.int64), lanes, start))
    # More lanes than items, and a run far longer than the lanes with uneven start loads.
    cases.append(("lanes>items", np.array([3, 3, 3, 1], dtype=np.int64), 8, None))
    cases.append(
        ("long-run-start", np.full(5000, 4, dtype=np.int64), 96, np.arange(96, dtype=np.int64) % 7)
    )
    return cases


@pytest.mark.parametrize(
    ("sizes", "lanes", "start"), [c[1:] for c in _cases()], ids=[c[0] for c in _cases()]
)
def test_deal_matches_the_reference(
    sizes: np.ndarray, lanes: int, start: np.ndarray | None
) -> None:
    want = reference_deal(sizes, lanes, None if start is None else start.copy())
    got = balance.deal(sizes, lanes, None if start is None else start.copy())
    assert got.tolist() == want.tolist()


def test_equal_size_runs_deal_as_the_heap() -> None:
    """The batched run (at least as many equal sizes as lanes) pops as the heap, key by key."""
    rng = np.random.default_rng(5)
    for lanes in (1, 3, 10, 33):
        held = rng.integers(0, 40, lanes).astype(np.int64)
        for size in (0, 1, 4, 13):
            k = int(rng.integers(lanes, 6 * lanes + 1))
            heap = [(int(h), lane) for lane, h in enumerate(held.tolist())]
            heapq.heapify(heap)
            want = []
            for _ in range(k):
                load, lane = heapq.heappop(heap)
                want.append(lane)
                heapq.heappush(heap, (load + size, lane))
            after = held.copy()
            assert balance._deal_run(size, k, after).tolist() == want
            assert sorted(zip(after.tolist(), range(lanes), strict=True)) == sorted(heap)


def test_lane_streams_are_each_lanes_items_in_stream_order() -> None:
    rng = np.random.default_rng(7)
    for lanes in (1, 5, 64):
        lane_of = rng.integers(0, lanes, 2000)
        sizes = rng.integers(0, 100, 2000)
        streams, loads = balance.lane_streams(lane_of, sizes, lanes)
        assert len(streams) == lanes
        for lane in range(lanes):
            want = np.flatnonzero(lane_of == lane)
            assert streams[lane].tolist() == want.tolist()
            assert loads[lane] == int(sizes[want].sum())
