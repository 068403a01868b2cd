"""Re-laning: change the lane count of a running job, every document still used exactly once.

A checkpoint at step ``s`` with ``L`` lanes splits the pass's work into what was consumed
(every work item before each lane's current flush window ``w_l``, and the first ``c_l``
samples of that window), the *leftover* of each lane's current window, and the *untouched*
work items (old lane ``l``'s positions past window ``w_l``). Re-laning to ``L'`` lanes keeps
the first, then gives new lane ``l'``:

1. the leftovers of the old lanes ``l = l', l' + L', l' + 2L', ...`` (in that order), one
   flush window each: old lane ``l``'s window ``w_l`` replayed exactly as the old lane ran
   it (same work items, same operator seeds ``(old lane, old window)``), its first ``c_l``
   samples dropped; a window may be short or, once dropped, empty;
2. then the untouched items in their old global order ``g = i * L + l``, renumbered
   ``g' = 0, 1, 2, ...``: first a *catch-up* block per new lane, so that every new lane
   holds as many items (lane ``l'`` with ``A_l'`` leftover items takes the next
   ``M - A_l'`` ranks, ``M = max A``, lanes in order; ``C`` ranks in all), then round-robin:
   rank ``C + k * L' + l'`` is lane ``l'``'s ``k``-th item after its block. If the old
   stream was dealt by size (``work.deal = "balanced"``: its items' sizes are known), the
   untouched items are dealt by those sizes instead, each new lane starting with the
   estimated size of its leftovers (their items' sizes less ``c_l * seq_len`` each),
   largest first to the lane holding the least, then swaps; each lane still reads its items
   in rank order. They form flush windows of ``K`` items seeded by ``(salt, l', window)``
   with a salt derived from the lineage (never one of the old seeds).

Everything after the change is a function of the recipe, the checkpoint and ``L'``: the
same global batches at every dp size dividing ``L'``, any worker count, runner or restart.

The new checkpoint keeps two integers per lane and records a *lineage* (plain JSON)::

    {"fingerprint": "<the checkpoint's fingerprint>", "num_lanes": L, "step": s,
     "lanes": [[w_0, c_0], [w_1, c_1], ...],
     "pass": p,           # only when the old lanes were past the first pass
     "mixture": {...},    # only when the old checkpoint had dynamic-mixture decisions
     "parent": {...}}     # only when the old checkpoint was itself re-laned

A second re-lane nests the first lineage under ``parent``. Positions of a re-laned lane count
the dropped samples of a leftover window as consumed (so ``[w, c]`` keeps its meaning: replay
window ``w`` and drop ``c``). Mixture decisions (``set_mixture``) are refused after a re-lane.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.flush import Flush, is_flush
from zephon_nodes.core.seeding import derive_seed
from zephon_nodes.core.workitem import WorkItem
from zephon_nodes.engine.lane import Lane, WorkItemNode
from zephon_nodes.engine.work import WorkSource, lane_length

__all__ = [
    "LINEAGE_KEY",
    "Lineage",
    "RelanedLane",
    "RelanedWorkItemNode",
    "RelanedWorkSource",
    "check_lineage",
    "describe_lineage",
    "for_state",
    "pipeline_at",
    "relane_state",
]

LINEAGE_KEY = "lineage"
_RELANE_TAG = 0x52454C4E  # "RELN"
_ENDLESS = 1 << 62


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Where a re-laned stream came from: the checkpoint it was re-laned at.

    Attributes:
        fingerprint: The old checkpoint's recipe fingerprint (the recipe with ``num_lanes``).
        num_lanes: The old lane count ``L``.
        step: The step the old checkpoint was taken after.
        lanes: Per old lane, ``(window, consumed)``.
        pass_index: The pass the old lanes were reading.
        mixture: The old checkpoint's dynamic-mixture section, or None.
        parent: The old checkpoint's own lineage (it was re-laned too), or None.
    """

    fingerprint: str
    num_lanes: int
    step: int
    lanes: tuple[tuple[int, int], ...]
    pass_index: int = 0
    mixture: dict[str, Any] | None = None
    parent: Lineage | None = None

    @property
    def depth(self) -> int:
        """Re-lanes in this chain (1 for a single re-lane)."""
        return 1 + (self.parent.depth if self.parent is not None else 0)

    def to_state(self) -> dict[str, Any]:
        """Return the JSON-safe form stored under ``"lineage"`` in a checkpoint."""
        out: dict[str, Any] = {
            "fingerprint": self.fingerprint,
            "num_lanes": self.num_lanes,
            "step": self.step,
            "lanes": [[w, c] for w, c in self.lanes],
        }
        if self.pass_index:
            out["pass"] = self.pass_index
        if self.mixture is not None:
            out["mixture"] = copy.deepcopy(self.mixture)
        if self.parent is not None:
            out["parent"] = self.parent.to_state()
        return out

    @classmethod
    def from_state(cls, raw: Any, where: str = "checkpoint lineage") -> Lineage:
        """Validate an (untrusted) ``"lineage"`` section and return it.

        Raises:
            CheckpointError: Naming the field that is wrong.
        """
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{where} must be a dict, got {type(raw).__name__}")
        allowed = {"fingerprint", "num_lanes", "step", "lanes", "pass", "mixture", "parent"}
        extra = sorted(set(map(str, raw)) - allowed)
        if extra:
            raise CheckpointError(f"{where}: unexpected key(s) {extra}")
        missing = sorted({"fingerprint", "num_lanes", "step", "lanes"} - set(raw))
        if missing:
            raise CheckpointError(f"{where}: missing key(s) {missing}")
        fp = raw["fingerprint"]
        if not isinstance(fp, str) or len(fp) != 64:
            raise CheckpointError(f"{where}: fingerprint must be 64 hex digits, got {fp!r:.80}")
        for key in ("num_lanes", "step", "pass"):
            v = raw.get(key, 0)
            if not _is_int(v) or not 0 <= v < 2**62 or (key == "num_lanes" and v < 1):
                raise CheckpointError(f"{where}: {key}={v!r} must be an integer >= 0 (lanes >= 1)")
        lanes = raw["lanes"]
        if not isinstance(lanes, list) or len(lanes) != raw["num_lanes"]:
            raise CheckpointError(
                f"{where}: 'lanes' must be a list of {raw['num_lanes']} [window, consumed] pairs"
            )
        pairs = []
        for k, v in enumerate(lanes):
            if (
                not isinstance(v, list)
                or len(v) != 2
                or not all(_is_int(x) and 0 <= x < 2**62 for x in v)
            ):
                raise CheckpointError(f"{where}: lane {k} must be [window, consumed], got {v!r}")
            pairs.append((int(v[0]), int(v[1])))
        mixture = raw.get("mixture")
        if mixture is not None and not isinstance(mixture, Mapping):
            raise CheckpointError(f"{where}: 'mixture' must be a dict")
        parent = raw.get("parent")
        return cls(
            fingerprint=fp,
            num_lanes=int(raw["num_lanes"]),
            step=int(raw["step"]),
            lanes=tuple(pairs),
            pass_index=int(raw.get("pass", 0)),
            mixture=copy.deepcopy(dict(mixture)) if mixture is not None else None,
            parent=cls.from_state(parent, where + " parent") if parent is not None else None,
        )


def describe_lineage(raw: Any) -> list[str]:
    """One line per re-lane of a checkpoint's lineage (newest first), for ``inspect``/``lanes``."""
    out = []
    node = raw
    while isinstance(node, Mapping):
        lanes = node.get("lanes")
        out.append(
            f"re-laned after step {node.get('step')} from {node.get('num_lanes')} lanes "
            f"(fingerprint {str(node.get('fingerprint'))[:16]}...; "
            f"{len(lanes) if isinstance(lanes, list) else '?'} old lane positions kept)"
        )
        node = node.get("parent")
    return out


# -- lane geometry of any work source ----------------------------------------------------------


def window_bounds(source: WorkSource, lane: int, window: int, flush_every: int) -> tuple[int, int]:
    """Positions ``[start, stop)`` of flush window ``window`` of ``lane`` (before its end)."""
    own = getattr(source, "window_bounds", None)
    if callable(own):
        got: tuple[int, int] = own(lane, window)
        return got
    start, stop = window * flush_every, (window + 1) * flush_every
    n = lane_length(source, lane)
    if n is not None:
        start, stop = min(start, n), min(stop, n)
    return start, stop


def _lane_item_sizes(source: WorkSource, lane: int) -> np.ndarray | None:
    """Sizes of ``lane``'s items if the source was dealt by size (else None)."""
    own = getattr(source, "lane_item_sizes", None)
    if not callable(own):
        return None
    got = own(lane)
    return None if got is None else np.asarray(got, dtype=np.int64)


def seed_parts(source: WorkSource, seed: int, lane: int, window: int) -> tuple[int, int, int]:
    """The ``(seed, lane, window)`` a lane's shuffle buffer of ``window`` is seeded with."""
    own = getattr(source, "shuffle_parts", None)
    if callable(own):
        got: tuple[int, int, int] = own(lane, window)
        return got
    return seed, lane, window


def leftover_drop(source: WorkSource, lane: int, window: int) -> int:
    """Samples a re-laned lane drops at the start of ``window`` (0 for any other source)."""
    own = getattr(source, "drop", None)
    return int(own(lane, window)) if callable(own) else 0


# -- the re-laned work source -------------------------------------------------------------------


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


class RelanedWorkSource(WorkSource):
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

    relaned = True

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
        starts, stops, ends = [], [], []
        for lane, (w, _) in enumerate(lineage.lanes):
            n = lane_length(old, lane)
            start, stop = window_bounds(old, lane, w, K)
            has = getattr(old, "has_window", None)
            exists = has(lane, w) if callable(has) else stop > start
            if w > 0 and not exists:
                raise CheckpointError(
                    f"lineage lane {lane}: window {w} is beyond the end of the old lane's stream"
                )
            starts.append(start)
            stops.append(stop)
            ends.append(n)
        self._old_starts = starts
        self._old_stops = stops
        self.untouched = _Untouched(stops, ends)
        # Per new lane: the old lanes whose leftovers it replays, and the prefix positions.
        self._olds: list[list[int]] = []
        self._prefix: list[list[int]] = []
        for nl in range(Ln):
            olds = list(range(nl, L, Ln))
            prefix = [0]
            for ol in olds:
                prefix.append(prefix[-1] + stops[ol] - starts[ol])
            self._olds.append(olds)
            self._prefix.append(prefix)
        # Catch-up: lane l' first takes a block of ``M - A_l'`` untouched items (``A_l'``: its
        # leftover items, ``M`` their maximum), so every new lane holds as many items.
        held = [prefix[-1] for prefix in self._prefix]
        top = max(held, default=0)
        self._catch = [top - a for a in held]
        self._catch_at = [0]
        for d in self._catch:
            self._catch_at.append(self._catch_at[-1] + d)
        # A stream dealt by size: deal the untouched items by the same sizes instead.
        self._dealt: list[np.ndarray] | None = None
        self._sizes: list[np.ndarray] | None = None
        old_sizes = [_lane_item_sizes(old, lane) for lane in range(L)]
        if self.untouched.total is not None and all(x is not None for x in old_sizes):
            self._deal_by_size([x for x in old_sizes if x is not None], sample_tokens)
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
        from zephon_nodes.engine.balance import deal

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
        for nl, olds in enumerate(self._olds):
            for ol in olds:
                window = int(old_sizes[ol][self._old_starts[ol] : self._old_stops[ol]].sum())
                start[nl] += max(0, window - self.lineage.lanes[ol][1] * sample_tokens)
        lane_of = deal(ranked, self.num_lanes, start=start)
        self._dealt = [np.flatnonzero(lane_of == nl) for nl in range(self.num_lanes)]
        self._sizes = [
            np.concatenate(
                [old_sizes[ol][self._old_starts[ol] : self._old_stops[ol]] for ol in olds]
                + [ranked[dealt]]
            )
            for olds, dealt in zip(self._olds, self._dealt, strict=True)
        ]

    # -- geometry ----------------------------------------------------------------------------

    def lane_item_sizes(self, lane: int) -> np.ndarray | None:
        """Size of each item of new lane ``lane`` (None: the old stream was not dealt by size)."""
        return None if self._sizes is None else self._sizes[lane]

    def leftovers(self, lane: int) -> int:
        """Number of leftover windows of new lane ``lane`` (``a``)."""
        return len(self._olds[lane])

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

    def window_bounds(self, lane: int, window: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of new lane ``lane``'s flush window ``window``."""
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

    def has_window(self, lane: int, window: int) -> bool:
        """Whether window ``window`` of ``lane`` exists (a leftover, or holds an item)."""
        if window < self.leftovers(lane):
            return True
        start, stop = self.window_bounds(lane, window)
        return stop > start

    def drop(self, lane: int, window: int) -> int:
        """Samples dropped at the start of window ``window`` (the old lane's consumed)."""
        olds = self._olds[lane]
        if window < len(olds):
            return self.lineage.lanes[olds[window]][1]
        return 0

    def shuffle_parts(self, lane: int, window: int) -> tuple[int, int, int]:
        """Seed parts of ``window``: the old lane's for a leftover, salted ones after."""
        olds = self._olds[lane]
        if window < len(olds):
            ol = olds[window]
            return seed_parts(self.old, self.seed, ol, self.lineage.lanes[ol][0])
        return self.salt, lane, window - len(olds)

    # -- the WorkSource ----------------------------------------------------------------------

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return item ``i`` of new lane ``lane``, or None past its end."""
        prefix = self._prefix[lane]
        if i < prefix[-1]:
            j = bisect.bisect_right(prefix, i) - 1
            ol = self._olds[lane][j]
            item = self.old.work(ol, self._old_starts[ol] + i - prefix[j])
        else:
            got = self.untouched.locate(self.untouched_rank(lane, i - prefix[-1]))
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

    def lane_seed(self, lane: int, items: RelanedWorkItemNode, window: int) -> tuple[int, int, int]:
        """Shuffle seed parts of ``window`` of ``lane`` in the pass ``items`` is reading."""
        if items.pass_index == 0:
            return self.shuffle_parts(lane, window)
        return seed_parts(self.base, self.seed, lane, window)


class RelanedWorkItemNode(WorkItemNode):
    """Source of a re-laned lane: its work items with a flush marker after every window.

    In the re-laned pass the windows are the leftovers (whatever their size, even empty),
    then ``K`` items each (see :class:`RelanedWorkSource`); later passes are plain lanes.
    State adds ``"window"`` (several empty windows may start at the same position).
    """

    WINDOW_KEY = "window"

    def __init__(self, work_source: RelanedWorkSource, lane: int, flush_every: int) -> None:
        super().__init__(work_source, lane, flush_every)
        self.relaned = work_source
        self._w = 0
        self._start, self._stop = work_source.window_bounds(lane, 0)

    @property
    def pass_index(self) -> int:
        """The pass being read."""
        return self._pass

    def _enter(self, window: int) -> None:
        self._w = window
        self._start, self._stop = self.relaned.window_bounds(self.lane, window)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at window 0 of pass 0, or at the position in ``initial_state``."""
        super().reset(initial_state)
        if self._pass:
            return
        if initial_state is not None and self.WINDOW_KEY in initial_state:
            window = int(initial_state[self.WINDOW_KEY])
        elif initial_state is None:
            window = 0
        else:  # a plain index state: the window holding it
            window = 0
            while self.relaned.window_bounds(self.lane, window)[1] <= self._index:
                if not self.relaned.has_window(self.lane, window):
                    break
                window += 1
        self._enter(window)
        if not self._start <= self._index <= max(self._stop, self._start):
            raise CheckpointError(
                f"re-laned lane {self.lane}: work item {self._index} is not in window {window} "
                f"[{self._start}, {self._stop})"
            )

    def next(self) -> WorkItem | Flush:
        """Return the next work item, or the flush marker that closes a window."""
        if self._pass:
            return super().next()
        while True:
            if self._index >= self._stop:
                w = self._w
                if w < self.relaned.leftovers(self.lane) or self._index > self._start:
                    self._enter(w + 1)
                    self._index = self._start
                    self._flushed = True
                    return Flush(w)
                raise StopIteration
            item = self.relaned.work(self.lane, self._index)
            if item is None:  # pragma: no cover - the geometry says it exists
                self._stop = self._index
                continue
            self._index += 1
            self._flushed = False
            return item

    def get_state(self) -> dict[str, Any]:
        """Return the next item index, its window and the pass."""
        state = super().get_state()
        if not self._pass:
            state[self.WINDOW_KEY] = self._w
        return state

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state at the first item of flush window ``window`` (current pass)."""
        if self._pass:
            return super().state_at_window(window)
        start = self.relaned.window_bounds(self.lane, window)[0]
        return {
            self.INDEX_KEY: start,
            self.FLUSHED_KEY: True,
            self.PASS_KEY: self._pass,
            self.WINDOW_KEY: window,
        }


class RelanedLane(Lane):
    """A re-laned lane: drops the samples its old lane had consumed of each leftover window.

    Positions count the dropped samples as consumed: ``[w, c]`` replays window ``w`` and
    drops ``max(c, dropped(w))`` samples.
    """

    def __init__(self, source: BaseNode[Any], lane: int, relaned: RelanedWorkSource) -> None:
        super().__init__(source, lane)
        self.relaned = relaned

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at the re-lane point (window 0), or replay to ``initial_state``."""
        state = dict(initial_state) if initial_state is not None else {}
        window = int(state.get(self.WINDOW_KEY, 0))
        p = int(state.get(self.PASS_KEY, 0))
        if initial_state is not None and p:
            super().reset(initial_state)
            return
        consumed = int(state.get(self.CONSUMED_KEY, 0))
        state[self.WINDOW_KEY] = window
        state[self.CONSUMED_KEY] = max(consumed, self.relaned.drop(self.lane, window))
        state[self.PASS_KEY] = p
        super().reset(state)

    def next(self) -> dict[str, Any]:
        """Return the lane's next sample."""
        while True:
            item = next(self.source)
            if is_flush(item):
                self._window = item.window + 1
                self._consumed = 0
                if not self._pass:
                    self._skip(self.relaned.drop(self.lane, self._window))
                continue
            self._consumed += 1
            return item

    def _skip(self, n: int) -> None:
        for _ in range(n):
            try:
                item = next(self.source)
            except StopIteration:
                item = None
            if item is None or is_flush(item):
                raise CheckpointError(
                    f"re-laned lane {self.lane}: the lineage says {n} samples of window "
                    f"{self._window} were consumed before the re-lane, but the window holds "
                    f"only {self._consumed}"
                )
            self._consumed += 1


# -- building re-laned pipelines ------------------------------------------------------------------


def _canonical_at(pipeline: Any, num_lanes: int) -> dict[str, Any]:
    canonical = copy.deepcopy(pipeline.canonical)
    canonical["num_lanes"] = num_lanes
    return canonical


def _fingerprint_of(canonical: Mapping[str, Any]) -> str:
    # An indexed dataset's file list is lazy (recipe/canonical.py): same hash, no dict per file.
    from zephon_nodes.recipe.canonical import canonical_sha256

    return canonical_sha256(canonical)


def fingerprint_at(pipeline: Any, num_lanes: int) -> str:
    """The fingerprint of the pipeline's recipe with ``num_lanes`` lanes."""
    return _fingerprint_of(_canonical_at(pipeline, num_lanes))


def summary_at(pipeline: Any, num_lanes: int) -> dict[str, Any]:
    """The checkpoint recipe summary of the pipeline's recipe with ``num_lanes`` lanes."""
    from zephon_nodes.engine.checkpoint import recipe_summary

    summary = recipe_summary(_canonical_at(pipeline, num_lanes))
    if "contents" in pipeline.summary:
        summary["contents"] = pipeline.summary["contents"]
    return summary


def _base_source(pipeline: Any, num_lanes: int) -> WorkSource:
    """The recipe's own work source at ``num_lanes`` lanes (same data, same estimate)."""
    if num_lanes == pipeline.num_lanes and not getattr(pipeline, "lineage", None):
        return pipeline.work_source  # type: ignore[no-any-return,unused-ignore]
    from zephon_nodes.engine.assembly import work_source

    recipe = pipeline.recipe
    try:
        changed = recipe.replace(num_lanes=num_lanes)
    except RecipeError as e:
        raise CheckpointError(f"cannot rebuild the recipe with num_lanes={num_lanes}: {e}") from e
    estimate = pipeline.canonical.get("mixture", {}).get("estimate")
    if estimate is not None and recipe.mixture.tokens_per_record is None:
        changed = changed.replace(
            mixture=dataclasses.replace(recipe.mixture, tokens_per_record=dict(estimate))
        )
    source, _ = work_source(changed, pipeline.datasets, pipeline.stateless)
    return source


def pipeline_at(pipeline: Any, num_lanes: int) -> Any:
    """The pipeline of the same recipe at ``num_lanes`` lanes, never re-laned (cheap copy).

    Raises:
        RecipeError: If ``num_lanes`` does not divide the global batch.
    """
    if pipeline.num_lanes == num_lanes and getattr(pipeline, "lineage", None) is None:
        return pipeline
    out = copy.copy(pipeline)
    out.recipe = pipeline.recipe.replace(num_lanes=num_lanes)
    out.canonical = _canonical_at(pipeline, num_lanes)
    out.fingerprint = _fingerprint_of(out.canonical)
    out.summary = summary_at(pipeline, num_lanes)
    out.lineage = None
    out.work_source = _base_source(pipeline, num_lanes)
    out._cache_feed = None
    return out


def _install_mixture(source: WorkSource, lineage: Lineage, pipeline: Any) -> None:
    """Install the old checkpoint's decision log into the old work source (all lanes)."""
    if lineage.mixture is None:
        return
    from zephon_nodes.engine.decisions import parse_mixture_state

    names = [d.name for d in pipeline.recipe.datasets]
    log = parse_mixture_state(lineage.mixture, names, range(lineage.num_lanes), lineage.step)
    setter = getattr(source, "set_decisions", None)
    if setter is None:
        if log:
            raise CheckpointError("the lineage holds mixture decisions but the recipe has none")
        return
    K = pipeline.recipe.flush_every
    setter(
        [tuple(w[n] for n in names) for _, w in log.entries],
        {i: [e * K for e in log.effects.get(i, [])] for i in range(lineage.num_lanes)},
    )


def _source_for(pipeline: Any, lineage: Lineage | None, num_lanes: int) -> WorkSource:
    """The work source a checkpoint with ``lineage`` and ``num_lanes`` lanes reads."""
    base = _base_source(pipeline, num_lanes)
    if lineage is None:
        return base
    got = fingerprint_at(pipeline, lineage.num_lanes)
    if got != lineage.fingerprint:
        from zephon_nodes.engine.checkpoint import fingerprint_pair

        raise CheckpointError(
            f"the checkpoint's lineage does not match this recipe: it was re-laned after step "
            f"{lineage.step} from a recipe with num_lanes={lineage.num_lanes} and fingerprint "
            f"{fingerprint_pair(lineage.fingerprint, got)} (with num_lanes="
            f"{lineage.num_lanes}); only num_lanes may differ across a re-lane"
        )
    old_full = _source_for(pipeline, lineage.parent, lineage.num_lanes)
    if lineage.mixture is not None:
        old_full = _fork(old_full)
        _install_mixture(old_full, lineage, pipeline)
    old = old_full.for_pass(lineage.pass_index)
    if old is None:
        raise CheckpointError(
            f"the checkpoint's lineage reads pass {lineage.pass_index}, which has no data"
        )
    base_pass = getattr(old_full, "base_pass", 0) + lineage.pass_index
    return RelanedWorkSource(
        old,
        base,
        lineage,
        pipeline.recipe.flush_every,
        pipeline.recipe.seed,
        base_pass,
        sample_tokens=int(getattr(pipeline.recipe, "seq_len", 0) or 0),
    )


def _fork(source: WorkSource) -> WorkSource:
    fork = getattr(source, "fork", None)
    return fork() if callable(fork) else source  # type: ignore[no-any-return,unused-ignore]


def for_state(pipeline: Any, state: Mapping[str, Any] | None) -> Any:
    """Return the pipeline that resumes ``state``.

    ``pipeline`` itself for a checkpoint that was never re-laned; for a re-laned one, a copy
    whose work source and lanes read the re-laned streams (the recipe must be the
    checkpoint's, its ``num_lanes`` the new lane count). Cheap: no shard is opened again.

    Raises:
        CheckpointError: If the lineage is malformed or does not match the recipe.
    """
    if state is None or state.get(LINEAGE_KEY) is None:
        return pipeline
    if state.get("fingerprint") != pipeline.fingerprint:
        return pipeline  # another recipe: the resume refuses it, naming the fields that differ
    lineage = Lineage.from_state(state[LINEAGE_KEY])
    if getattr(pipeline, "lineage", None) == lineage.to_state():
        return pipeline
    source = _source_for(pipeline, lineage, pipeline.num_lanes)
    out = copy.copy(pipeline)
    out.work_source = source
    out.lineage = lineage.to_state()
    out._cache_feed = None
    return out


def check_lineage(state: Mapping[str, Any], pipeline: Any) -> None:
    """Refuse a state whose lineage is not the one the pipeline reads.

    Raises:
        CheckpointError: Naming what to do.
    """
    saved = state.get(LINEAGE_KEY)
    mine = getattr(pipeline, "lineage", None)
    if saved == mine:
        return
    if mine is None:
        first = Lineage.from_state(saved)
        raise CheckpointError(
            f"the checkpoint was re-laned (after step {first.step}, from {first.num_lanes} "
            f"lanes); build the pipeline with zephon_nodes.engine.relane.for_state(pipeline, "
            f"state) before its rank nodes (the zephon commands and the TorchTitan loader do)"
        )
    if saved is None:
        raise CheckpointError(
            "this pipeline reads re-laned streams but the checkpoint has no lineage; build "
            "the pipeline afresh for a checkpoint that was never re-laned"
        )
    raise CheckpointError(
        "the checkpoint's lineage differs from the one this pipeline was built for; build "
        "it with zephon_nodes.engine.relane.for_state(pipeline, state) for this checkpoint"
    )


def relane_state(pipeline: Any, state: Mapping[str, Any], num_lanes: int) -> dict[str, Any]:
    """Re-lane a merged checkpoint state to ``num_lanes`` lanes.

    Args:
        pipeline: The compiled recipe of the checkpoint (its ``num_lanes`` may be the old or
            the new count: only ``num_lanes`` may differ from the checkpoint's recipe).
        state: A merged, step-boundary state holding every lane.
        num_lanes: The new lane count ``L'`` (must divide the global batch).

    Returns:
        The new state (plain JSON data): resume it with the recipe at ``num_lanes`` lanes.

    Raises:
        CheckpointError: If the state is mid-step, lacks lanes, or belongs to another recipe.
        RecipeError: If ``num_lanes`` does not divide the global batch.
    """
    from zephon_nodes.engine.checkpoint import validate_state

    recipe = pipeline.recipe
    if not _is_int(num_lanes) or num_lanes < 1:
        raise RecipeError(f"--num-lanes={num_lanes!r} must be an integer >= 1")
    if recipe.global_batch_size % num_lanes:
        raise RecipeError(
            f"cannot re-lane to num_lanes={num_lanes}: global_batch_size="
            f"{recipe.global_batch_size} must be a multiple of it (every step takes the same "
            f"number of samples from each lane)"
        )
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a zephon-nodes state must be a dict, got {type(state).__name__}")
    raw_lanes: Any = state.get("num_lanes")
    if not _is_int(raw_lanes) or raw_lanes < 1:
        raise CheckpointError(f"checkpoint num_lanes={raw_lanes!r} must be an integer >= 1")
    old_lanes = int(raw_lanes)
    if state.get("micro", 0):
        raise CheckpointError(
            "cannot re-lane a state taken in the middle of a step (micro="
            f"{state.get('micro')!r}); re-lane a step-boundary checkpoint"
        )
    old_pipeline = for_state(pipeline_at(pipeline, old_lanes), state)
    positions = validate_state(
        state,
        fingerprint=old_pipeline.fingerprint,
        summary=old_pipeline.summary,
        num_lanes=old_lanes,
        lanes=range(old_lanes),
        samples_per_lane=None,
    )
    check_lineage(state, old_pipeline)
    source = old_pipeline.work_source
    mixture = state.get("mixture")
    if mixture is not None and getattr(source, "relaned", False):  # pragma: no cover
        raise CheckpointError("a re-laned checkpoint cannot hold mixture decisions")
    p = int(state.get("pass", 0))
    lanes = []
    for lane in range(old_lanes):
        w, c = positions[lane]
        if not p:  # a re-laned lane's position counts its dropped samples as consumed
            c = max(c, leftover_drop(source, lane, w))
        lanes.append((w, c))
    parent = state.get(LINEAGE_KEY)
    lineage = Lineage(
        fingerprint=str(state["fingerprint"]),
        num_lanes=old_lanes,
        step=int(state["step"]),
        lanes=tuple(lanes),
        pass_index=p,
        mixture=copy.deepcopy(dict(mixture)) if mixture is not None else None,
        parent=Lineage.from_state(parent) if parent is not None else None,
    )
    relaned = _source_for(pipeline_at(pipeline, num_lanes), lineage, num_lanes)  # checks all
    assert isinstance(relaned, RelanedWorkSource)
    return {
        "format": state["format"],
        "fingerprint": fingerprint_at(pipeline, num_lanes),
        "recipe": summary_at(pipeline, num_lanes),
        "num_lanes": num_lanes,
        "step": lineage.step,
        "micro": 0,
        "lanes": {str(i): [0, relaned.drop(i, 0)] for i in range(num_lanes)},
        LINEAGE_KEY: lineage.to_state(),
    }
