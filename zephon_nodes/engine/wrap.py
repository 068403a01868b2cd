"""The "wrap" end of data: a lane that runs dry continues into the next pass's data.

With ``work.end_of_data = "wrap"`` a finite stream never ends: lane ``l`` reads its items of
pass 0 (the recipe's ``epochs`` data epochs, dealt as usual), then its items of pass 1 (data
epochs ``epochs .. 2 epochs - 1``, in new seeded orders, dealt again), and so on. Each pass of
a lane is closed by a flush (its last window is padded with empty work items up to the
flush interval), so a lane's samples are exactly its samples of pass 0 read alone, followed
by those of pass 1 read alone, and so on: no sample is dropped or repeated; the run ends
where the trainer stops. A pure function of the recipe: positions are plain lane item
indices, so checkpoints and restores at any dp size work unchanged.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections import OrderedDict

from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.engine.work import WorkSource, lane_length
from zephon_nodes.io.formats.shards import MemoryShard

__all__ = ["WRAP_PASS_STRIDE", "WrappedWorkSource"]

# A new iter() after a break starts a new wrapped stream this many passes further.
WRAP_PASS_STRIDE = 1 << 20
_EMPTY = MemoryShard("<empty: pass boundary>", ())
_KEEP_PASSES = 4


class WrappedWorkSource(WorkSource):
    """Lane streams that run through passes ``first, first + 1, ...`` of ``base`` back to back.

    Args:
        base: The finite work source of one pass (its :meth:`~WorkSource.for_pass` gives the
            others).
        flush_every: Work items per flush window: each pass of a lane fills whole windows.
        first: The first pass of ``base`` read.
    """

    def __init__(self, base: WorkSource, flush_every: int, first: int = 0) -> None:
        super().__init__(base.num_lanes)
        self.base = base
        self.flush_every = flush_every
        self.first = first
        self._passes: OrderedDict[int, WorkSource | None] = OrderedDict()
        self._passes_lock = threading.Lock()  # lanes restored on threads of their own
        # Per lane: the end (lane item index) and the item count of each pass read so far.
        self._ends: dict[int, list[int]] = {}
        self._counts: dict[int, list[int]] = {}

    def _pass(self, q: int) -> WorkSource | None:
        with self._passes_lock:
            src = self._passes.get(q)
            if src is None and q not in self._passes:
                src = self.base if q == 0 else self.base.make_pass(q)
                self._passes[q] = src
                while len(self._passes) > _KEEP_PASSES:
                    self._passes.popitem(last=False)
            else:
                self._passes.move_to_end(q)
            return src

    def _count(self, lane: int, q: int) -> int:
        """Items of ``lane`` in base pass ``q``."""
        src = self._pass(q)
        if src is None:
            return 0
        n = lane_length(src, lane)
        assert n is not None  # a pass of a finite stream
        return n

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return item ``i`` of the lane's wrapped stream (an empty item fills a window)."""
        ends = self._ends.setdefault(lane, [])
        counts = self._counts.setdefault(lane, [])
        k = self.flush_every
        while not ends or i >= ends[-1]:
            n = self._count(lane, self.first + len(counts))
            if n == 0:
                return None  # a pass without items for this lane: the stream ends
            counts.append(n)
            ends.append((ends[-1] if ends else 0) + -(-n // k) * k)
        seg = bisect.bisect_right(ends, i)
        j = i - (ends[seg - 1] if seg else 0)
        if j < counts[seg]:
            src = self._pass(self.first + seg)
            item = src.work(lane, j) if src is not None else None
            assert item is not None
            return dataclasses.replace(item, position=i)
        return WorkItem(0, "", "", -1, -1, _EMPTY, 0, 0, lane, i)

    def lane_length(self, lane: int) -> int | None:
        """Items of ``lane``: None (endless) if it has any in the first pass, else 0."""
        return None if self.work(lane, 0) is not None else 0

    def make_pass(self, p: int) -> WrappedWorkSource:
        """Pass ``p`` (a new ``iter()``): a new wrapped stream from base pass ``p * 2**20``."""
        return WrappedWorkSource(self.base, self.flush_every, self.first + p * WRAP_PASS_STRIDE)
