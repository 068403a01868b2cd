"""The re-laned work source: each new lane's leftover windows, then its untouched items.

See :mod:`zephon_nodes.engine.relane` for the deal; this module is its geometry.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.seeding import derive_seed
from zephon_nodes.engine.balance import deal
from zephon_nodes.engine.lane import LaneNodes, WorkItemNode
from zephon_nodes.engine.relane.nodes import RelanedLane, RelanedWorkItemNode
from zephon_nodes.engine.work import WorkItem, WorkSource
from zephon_nodes.state.stage import UnreadState

if TYPE_CHECKING:
    from zephon_nodes.state.lineage import Lineage

__all__ = ["RelanedWorkSource"]

_RELANE_TAG = 0x52454C4E  # "RELN"
_ENDLESS = 1 << 62


@dataclasses.dataclass(frozen=True)
class _Leftover:
    """An old lane's flush window a new lane replays: positions ``[start, stop)``, ``drop``."""

    lane: int
    window: int
    start: int
    stop: int
    drop: int


class _Untouched:
    """The untouched items of the old lanes in old global order, renumbered 0, 1, 2, ...

    Old lane ``l`` holds untouched rows ``[stop_l, end_l)`` (old positions). Rows are taken in
    order, and within a row the lanes in order (``g = i * L + l``). The count of untouched
    items before row ``i`` is piecewise linear in ``i`` between the breakpoints (every
    ``stop_l`` and ``end_l``); inverting it is a bisection over them plus one division.
    """

    def __init__(self, stops: Sequence[int], ends: Sequence[int | None]) -> None:
        self.stop = np.asarray(stops, dtype=np.int64)
        self.end = np.asarray([_ENDLESS if e is None else e for e in ends], dtype=np.int64)
        self.end = np.maximum(self.end, self.stop)
        points = sorted({0, *self.stop.tolist(), *[e for e in self.end.tolist() if e < _ENDLESS]})
        self.points = points
        counts = [int(np.clip(p - self.stop, 0, self.end - self.stop).sum()) for p in points]
        self.counts = counts
        last = points[-1]
        tail = int(((self.stop <= last) & (self.end > last)).sum())
        self.total: int | None = None if tail else counts[-1]
        self._active: OrderedDict[int, np.ndarray] = OrderedDict()

    def active(self, k: int) -> np.ndarray:
        got = self._active.get(k)
        if got is None:
            row = self.points[k]
            got = np.flatnonzero((self.stop <= row) & (self.end > row))
            self._active[k] = got
            while len(self._active) > 8:
                self._active.popitem(last=False)
        return got

    def locate(self, r: int) -> tuple[int, int] | None:
        """Return ``(old lane, old position)`` of untouched item ``r``, or None past the end."""
        if self.total is not None and r >= self.total:
            return None
        k = bisect.bisect_right(self.counts, r) - 1
        lanes = self.active(k)
        d = r - self.counts[k]
        row = self.points[k] + d // len(lanes)
        return int(lanes[d % len(lanes)]), int(row)


class RelanedWorkSource(WorkSource, LaneNodes):
    """The work of a re-laned pass: leftover windows first, then the untouched items.

    Positions of a new lane are contiguous: leftover window ``j`` holds the whole old window
    (``[P_j, P_{j+1})``), then windows of ``K`` untouched items follow. Pass ``q > 0`` is the
    recipe's own pass ``base_pass + q`` at the new lane count.

    Args:
        old: The old work source (``L`` lanes) of the pass the checkpoint was in.
        base: The recipe's work source at the new lane count (for later passes).
        lineage: The re-lane's lineage.
        flush_every: Work items per window ``K``.
        seed: The recipe's seed.
        base_pass: The recipe pass the old pass is.
        sample_tokens: Tokens of one sample (``seq_len``): estimates what a leftover window
            still holds (its items' tokens less ``consumed * sample_tokens``) when the
            untouched items are dealt by size.
    """

    def __init__(
        self,
        old: WorkSource,
        base: WorkSource,
        lineage: Lineage,
        flush_every: int,
        seed: int,
        base_pass: int,
        sample_tokens: int = 0,
    ) -> None:
        super().__init__(base.num_lanes)
        L, Ln, K = old.num_lanes, base.num_lanes, flush_every
        if lineage.num_lanes != L:
            raise CheckpointError(f"lineage has num_lanes={lineage.num_lanes}, source has {L}")
        self.old, self.base, self.lineage = old, base, lineage
        self.flush_every, self.seed, self.base_pass = K, seed, base_pass
        # Per old lane, the windows still to replay: its current window ``w`` (``c`` samples
        # dropped), then, when the old stream is itself re-laned, its leftover windows past
        # ``w`` (each with the drop of the re-lane before: some of their samples were
        # delivered before it). Only what follows them is untouched.
        held: list[list[_Leftover]] = []
        starts, stops, ends = [], [], []
        for lane, (w, c) in enumerate(lineage.lanes):
            if w > 0 and not old.has_window(lane, w, K):
                raise CheckpointError(
                    f"lineage lane {lane}: window {w} is beyond the end of the old lane's stream"
                )
            windows = [_Leftover(lane, w, *old.window_bounds(lane, w, K), c)]
            for v in range(w + 1, old.leftovers(lane)):
                windows.append(
                    _Leftover(lane, v, *old.window_bounds(lane, v, K), old.leftover_drop(lane, v))
                )
            held.append(windows)
            starts.append(windows[0].start)
            stops.append(windows[-1].stop)
            ends.append(old.lane_length(lane))
        self._old_starts = starts
        self.untouched = _Untouched(stops, ends)
        # Per new lane: the old lanes' windows it replays, and the prefix positions.
        self._windows: list[list[_Leftover]] = []
        self._prefix: list[list[int]] = []
        for nl in range(Ln):
            windows = [x for ol in range(nl, L, Ln) for x in held[ol]]
            prefix = [0]
            for x in windows:
                prefix.append(prefix[-1] + x.stop - x.start)
            self._windows.append(windows)
            self._prefix.append(prefix)
        # Catch-up: lane l' first takes a block of ``M - A_l'`` untouched items (``A_l'``: its
        # leftover items, ``M`` their maximum), so every new lane holds as many items.
        held_items = [prefix[-1] for prefix in self._prefix]
        top = max(held_items, default=0)
        self._catch = [top - a for a in held_items]
        self._catch_at = [0]
        for d in self._catch:
            self._catch_at.append(self._catch_at[-1] + d)
        # A stream dealt by size: deal the untouched items by the same sizes instead.
        self._dealt: list[np.ndarray] | None = None
        self._sizes: list[np.ndarray] | None = None
        old_sizes = [old.lane_item_sizes(lane) for lane in range(L)]
        if self.untouched.total is not None and all(x is not None for x in old_sizes):
            self._deal_by_size(
                [np.asarray(x, dtype=np.int64) for x in old_sizes if x is not None], sample_tokens
            )
        depth = lineage.depth
        salt_fp = int(lineage.fingerprint[:15], 16)
        self.salt = derive_seed(seed, _RELANE_TAG, salt_fp, lineage.step, L, Ln, depth)

    def _deal_by_size(self, old_sizes: list[np.ndarray], sample_tokens: int) -> None:
        """Deal the untouched items balanced by size (the old stream was dealt so).

        Each new lane starts with the estimated size of its leftovers (their items' sizes
        less ``consumed * sample_tokens`` each); the untouched items go largest first to the
        lane holding the least, then swaps (:func:`~zephon_nodes.engine.balance.deal`). Each
        lane reads its items in old global order.
        """
        L = self.old.num_lanes
        keys, sizes = [], []
        for lane, (stop, end) in enumerate(
            zip(self.untouched.stop.tolist(), self.untouched.end.tolist(), strict=True)
        ):
            pos = np.arange(stop, end, dtype=np.int64)
            keys.append(pos * L + lane)
            sizes.append(old_sizes[lane][stop:end])
        key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        order = np.argsort(key, kind="stable")  # rank r: the r-th untouched item in g order
        ranked = (np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64))[order]
        assert len(ranked) == self.untouched.total
        start = np.zeros(self.num_lanes, dtype=np.int64)
        for nl, windows in enumerate(self._windows):
            for x in windows:
                size = int(old_sizes[x.lane][x.start : x.stop].sum())
                start[nl] += max(0, size - x.drop * sample_tokens)
        lane_of = deal(ranked, self.num_lanes, start=start)
        self._dealt = [np.flatnonzero(lane_of == nl) for nl in range(self.num_lanes)]
        self._sizes = [
            np.concatenate([old_sizes[x.lane][x.start : x.stop] for x in windows] + [ranked[dealt]])
            for windows, dealt in zip(self._windows, self._dealt, strict=True)
        ]

    # -- geometry ----------------------------------------------------------------------------

    def lane_item_sizes(self, lane: int) -> np.ndarray | None:
        """Size of each item of new lane ``lane`` (None: the old stream was not dealt by size)."""
        return None if self._sizes is None else self._sizes[lane]

    def leftovers(self, lane: int) -> int:
        """Number of leftover windows of new lane ``lane`` (``a``)."""
        return len(self._windows[lane])

    def untouched_length(self, lane: int) -> int | None:
        """Untouched items of new lane ``lane`` (None: endless)."""
        if self._dealt is not None:
            return len(self._dealt[lane])
        T = self.untouched.total
        if T is None:
            return None
        C, at = self._catch_at[-1], self._catch_at[lane]
        catch = min(self._catch[lane], max(0, T - at))
        return catch + max(0, -(-(T - C - lane) // self.num_lanes))

    def untouched_rank(self, lane: int, u: int) -> int:
        """Rank ``g'`` (in the old global order) of new lane ``lane``'s untouched item ``u``.

        Lane ``l'`` first takes its catch-up block (ranks ``[C_l', C_l' + d_l')``), then
        rank ``C + k * L' + l'`` for its ``k``-th item after it (``C``: all catch-up blocks).
        Dealt by size: the lane's ``u``-th rank in ascending order.
        """
        if self._dealt is not None:
            dealt = self._dealt[lane]
            return int(dealt[u]) if u < len(dealt) else int(self.untouched.total or 0) + u
        d = self._catch[lane]
        if u < d:
            return self._catch_at[lane] + u
        return self._catch_at[-1] + (u - d) * self.num_lanes + lane

    def lane_length(self, lane: int) -> int | None:
        """Work items of new lane ``lane`` in this pass (None: endless)."""
        u = self.untouched_length(lane)
        return None if u is None else self._prefix[lane][-1] + u

    def window_bounds(
        self, lane: int, window: int, flush_every: int | None = None
    ) -> tuple[int, int]:
        """Positions ``[start, stop)`` of new lane ``lane``'s flush window ``window``.

        The re-laned pass has its own windows (``flush_every`` is the recipe's ``K``, known).
        """
        prefix = self._prefix[lane]
        a = len(prefix) - 1
        if window < a:
            return prefix[window], prefix[window + 1]
        start = prefix[a] + (window - a) * self.flush_every
        stop = start + self.flush_every
        n = self.lane_length(lane)
        if n is not None:
            start, stop = min(start, n), min(stop, n)
        return start, stop

    def window_start(self, lane: int, window: int, flush_every: int | None = None) -> int:
        """Position of the first work item of new lane ``lane``'s window ``window``."""
        return self.window_bounds(lane, window)[0]

    def has_window(self, lane: int, window: int, flush_every: int | None = None) -> bool:
        """Whether window ``window`` of ``lane`` exists (a leftover, or holds an item)."""
        if window < self.leftovers(lane):
            return True
        start, stop = self.window_bounds(lane, window)
        return stop > start

    def leftover_drop(self, lane: int, window: int) -> int:
        """Samples dropped at the start of window ``window`` (the old lane's consumed)."""
        windows = self._windows[lane]
        return windows[window].drop if window < len(windows) else 0

    def shuffle_parts(self, seed: int, lane: int, window: int) -> tuple[int, int, int]:
        """Seed parts of ``window``: the old lane's for a leftover, salted ones after.

        ``seed`` is the recipe's (the one this source was built with).
        """
        windows = self._windows[lane]
        if window < len(windows):
            x = windows[window]
            return self.old.shuffle_parts(self.seed, x.lane, x.window)
        return self.salt, lane, window - len(windows)

    # -- the WorkSource ----------------------------------------------------------------------

    @property
    def old_starts(self) -> list[int]:
        """Per old lane, the position its leftover window starts at (what it had not read)."""
        return list(self._old_starts)

    def old_position(self, lane: int, i: int) -> tuple[int, int] | None:
        """``(old lane, old position)`` of item ``i`` of new lane ``lane`` (None: past its end)."""
        prefix = self._prefix[lane]
        if i < prefix[-1]:
            j = bisect.bisect_right(prefix, i) - 1
            x = self._windows[lane][j]
            return x.lane, x.start + i - prefix[j]
        return self.untouched.locate(self.untouched_rank(lane, i - prefix[-1]))

    def partly_delivered(self, lane: int, resume: int) -> list[int]:
        """Positions of ``lane``'s leftover windows not entered at ``resume`` that were cut.

        Such a window's first samples were delivered before the re-lane (its drop): its items
        can be neither read again from their start nor skipped without losing the rest.
        """
        prefix = self._prefix[lane]
        out: list[int] = []
        for j, x in enumerate(self._windows[lane]):
            if x.drop and prefix[j] >= resume:
                out.extend(range(prefix[j], prefix[j + 1]))
        return out

    relaned = True

    def global_index(self, lane: int, i: int) -> tuple[int, int]:
        """``(stream key, global item)`` of item ``i`` of new lane ``lane`` (its old item's)."""
        old = self.old_position(lane, i)
        if old is None:
            raise RecipeError(f"re-laned lane {lane} has no work item {i}")
        return self.old.global_index(*old)

    def unread_sets(self, resume: Mapping[int, int]) -> UnreadState:
        """What the old lanes had not read, less what the new lanes read before ``resume``.

        The items of leftover windows not entered yet whose first samples were delivered
        before the re-lane are *pending* (:meth:`partly_delivered`).
        """
        inner = self.old.unread_sets(dict(enumerate(self.old_starts)))
        read: dict[int, set[int]] = {}
        for lane, stop in resume.items():
            for i in range(stop):
                key, g = self.global_index(lane, i)
                read.setdefault(key, set()).add(g)
                inner.pending.discard((key, g))
        sets = {k: u.without(read.get(k, ())) for k, u in inner.sets.items()}
        for lane, stop in resume.items():
            inner.pending.update(
                self.global_index(lane, i) for i in self.partly_delivered(lane, stop)
            )
        return UnreadState(sets, inner.pending)

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return item ``i`` of new lane ``lane``, or None past its end."""
        got = self.old_position(lane, i)
        if got is None:
            return None
        item = self.old.work(*got)
        if item is None:  # pragma: no cover - the geometry says it exists
            raise CheckpointError(
                f"re-laned lane {lane}: work item {i} maps to a missing old work item"
            )
        return dataclasses.replace(item, lane=lane, position=i)

    def make_pass(self, p: int) -> WorkSource | None:
        """Pass ``p > 0``: the recipe's own pass ``base_pass + p`` at the new lane count."""
        return self.base.for_pass(self.base_pass + p)

    def refuse_decisions(self) -> None:
        """Refuse a dynamic-mixture decision: the re-laned streams have no per-lane plan.

        Raises:
            RecipeError: Always.
        """
        raise RecipeError(
            f"set_mixture is not supported after a re-lane (this stream was re-laned after "
            f"step {self.lineage.step} from {self.lineage.num_lanes} lanes): the untouched "
            f"work items keep the old lanes' mixture plan, so a new decision has no lane plan "
            f"to take effect in; change the mixture before re-laning"
        )

    # -- lane nodes --------------------------------------------------------------------------

    def item_node(self, lane: int, flush_every: int) -> RelanedWorkItemNode:
        """The source node of new lane ``lane``."""
        return RelanedWorkItemNode(self, lane, flush_every)

    def lane_node(self, source: BaseNode[Any], lane: int) -> RelanedLane:
        """The lane node of new lane ``lane`` (drops the consumed part of leftovers)."""
        return RelanedLane(source, lane, self)

    def lane_seed(self, lane: int, items: WorkItemNode, window: int) -> tuple[int, int, int]:
        """Shuffle seed parts of ``window`` of ``lane`` in the pass ``items`` is reading."""
        if items.pass_index == 0:
            return self.shuffle_parts(self.seed, lane, window)
        return self.base.shuffle_parts(self.seed, lane, window)
