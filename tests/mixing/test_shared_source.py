"""A rank's lanes share one work source and restore on a thread each: its caches hold.

The source's bounded caches (a mixture's blocks, a wrapped stream's passes) are looked up
and evicted by every lane; a lookup switched out between its hit and its move to the
recent end found the entry evicted by another lane: ``KeyError`` out of the restore.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.engine.mixing import MixingWorkSource
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.engine.wrap import WrappedWorkSource
from zephon_nodes.recipe.schedule import WeightSchedule


class _SlowMove(OrderedDict):  # type: ignore[type-arg]
    """An OrderedDict whose ``move_to_end`` is switched out first (a thread switch there)."""

    def move_to_end(self, key: Any, last: bool = True) -> None:
        time.sleep(0.05)
        super().move_to_end(key, last)


class _Dataset:
    def __init__(self, n: int) -> None:
        self.num_work_items = n
        self.name = f"d{n}"


def _together(*calls: Any) -> dict[int, str]:
    """Run ``calls`` on a thread each (the second 10 ms later); each one's outcome."""
    out: dict[int, str] = {}

    def run(k: int) -> None:
        time.sleep(0.01 * k)
        try:
            out[k] = f"ok {calls[k]()}"
        except Exception as e:  # reported below, by the assertion
            out[k] = f"{type(e).__name__}: {e!r}"

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_mixture_blocks_looked_up_while_another_lane_evicts() -> None:
    schedule = WeightSchedule(((0.0, (0.5, 0.3, 0.2)),))
    ws = MixingWorkSource(
        [_Dataset(10_000) for _ in range(3)],
        0,
        8,
        None,
        ["repeat"] * 3,
        schedule,
        [100.0, 200.0, 300.0],
        1024,
    )
    expected = ws.locate(1, 0), ws.locate(40 * ws.block, 1)
    ws._blocks = _SlowMove()
    ws.locate(0, 0)  # lane 0's block: the least recently used once the cache is full
    for k in range(2 * 8 + 16 - 1):  # other lanes' blocks fill it to its bound
        ws.locate((k // 7) * ws.block, 1 + k % 7)
    out = _together(lambda: ws.locate(1, 0), lambda: ws.locate(40 * ws.block, 1))
    assert out == {0: f"ok {expected[0]}", 1: f"ok {expected[1]}"}


_NO_SHARD: Any = None  # never read: the test asks where items are, not their records


class _Passes(WorkSource):
    """A base stream of 3 items per lane and pass (item numbers name lane and pass)."""

    def __init__(self, p: int = 0) -> None:
        super().__init__(2)
        self.p = p

    def make_pass(self, p: int) -> _Passes:
        return _Passes(p)

    def work(self, lane: int, i: int) -> WorkItem | None:
        if i >= 3:
            return None
        return WorkItem(0, "d", "text", i, self.p, _NO_SHARD, 0, 0, lane, i)

    def lane_length(self, lane: int) -> int:
        return 3


def _where(item: WorkItem | None) -> tuple[int, int, int] | None:
    return None if item is None else (item.epoch, item.lane, item.item)


def test_wrapped_passes_looked_up_while_another_lane_evicts() -> None:
    ws = WrappedWorkSource(_Passes(), flush_every=1)
    far = 20 * 3  # lane 1, twenty passes on: its pass evicts the oldest
    expected = _where(ws.work(0, 1)), _where(ws.work(1, far))
    assert expected == ((0, 0, 1), (20, 1, 0))
    ws = WrappedWorkSource(_Passes(), flush_every=1)
    ws._passes = _SlowMove()
    ws.work(0, 0)
    for q in range(1, 4):  # passes 1-3 of lane 1: the cache holds 4, pass 0 the oldest
        ws.work(1, 3 * q)
    out = _together(lambda: _where(ws.work(0, 1)), lambda: _where(ws.work(1, far)))
    assert out == {0: f"ok {expected[0]}", 1: f"ok {expected[1]}"}
