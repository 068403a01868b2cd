"""The exact future: which cached shards a process's lanes read next, in order.

``work(lane, i)`` is a pure function of the recipe, so from the lanes' current positions the
shards they will read are known for any horizon. :class:`AccessPlan` lists them (the lanes
advance together, so the order is round-robin over the lanes: item ``p_l`` of every lane
``l``, then ``p_l + 1``, ...) and :class:`CacheFeed` hands that list to the
:class:`~zephon_nodes.io.nodecache.cache.NodeCache` (eviction by Belady's rule) and resolves
keys for its prefetcher.

Only shards that go through the node cache take part: those with a ``cache_key`` (see
:class:`~zephon_nodes.io.nodecache.entries.Cacheable`); shards read in place are left out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.nodecache.cache import NodeCache
from zephon_nodes.io.nodecache.entries import Cacheable, Fetch

__all__ = ["AccessPlan", "CacheFeed", "WorkSchedule", "cacheable"]


class WorkSchedule(Protocol):
    """What the plan reads of a work source (:class:`~zephon_nodes.engine.work.WorkSource`)."""

    def work(self, lane: int, index: int, /) -> WorkItem | None:
        """The work item of ``lane`` at position ``index`` (None past the lane's end)."""


def cacheable(shard: Any) -> Cacheable | None:
    """Return ``shard`` if it is read through the node cache, else None."""
    return shard if isinstance(getattr(shard, "cache_key", None), str) else None


_UNSEEN = object()
_END = object()  # past the lane's last work item


class AccessPlan:
    """The ordered node-cache accesses of some lanes from their current positions.

    Args:
        work_source: The recipe's work source.
        horizon: Most accesses listed (the farther future does not change decisions much).
    """

    def __init__(self, work_source: WorkSchedule, horizon: int = 256) -> None:
        self.work_source = work_source
        self.horizon = horizon
        self.positions: dict[int, tuple[int, int]] = {}  # lane -> (start, submitted)
        self.shards: dict[str, Cacheable] = {}
        # lane -> {index: its cached shard, None (read in place) or _END}: work(lane, i) is
        # a pure function of the recipe, and keys() runs after most steps.
        self._seen: dict[int, dict[int, Any]] = {}

    def update(self, starts: Mapping[int, int], submitted: Mapping[int, int] | None = None) -> bool:
        """Set lanes' positions; return whether anything changed.

        Args:
            starts: Per lane, the first work item whose shard may still be read.
            submitted: Per lane, the first work item not yet handed to a worker (items
                before it are in flight: the prefetcher leaves them to their worker).
                Default: ``starts``.
        """
        changed = False
        for lane, i in starts.items():
            sub = int(submitted.get(lane, i)) if submitted is not None else int(i)
            if self.positions.get(lane) != (int(i), sub):
                old = self.positions.get(lane, (0, 0))[0]
                self.positions[lane] = (int(i), max(int(i), sub))
                changed = True
                seen = self._seen.get(lane)
                if seen and (int(i) != old or len(seen) > 4 * self.horizon + 64):
                    self._seen[lane] = {k: v for k, v in seen.items() if k >= int(i)}
        return changed

    def items(self) -> Iterable[tuple[WorkItem, bool]]:
        """Yield ``(work item, in flight)`` of the lanes, round-robin over lanes by position."""
        live = dict(sorted(self.positions.items()))
        t = 0
        while live:
            for lane, (start, submitted) in list(live.items()):
                item = self.work_source.work(lane, start + t)
                if item is None:
                    del live[lane]
                    continue
                yield item, start + t < submitted
            t += 1

    def keys(self) -> tuple[list[str], list[int]]:
        """Return the next ``horizon`` cached-shard accesses and which are in flight.

        Returns:
            The accesses' cache keys in order, and the indexes (into them) of those already
            handed to a worker.
        """
        out: list[str] = []
        in_flight: list[int] = []
        if self.horizon <= 0:
            return out, in_flight
        for scanned, (access, flying) in enumerate(self._accesses(), 1):
            if access is not None:
                shard, key = access
                self.shards.setdefault(key, shard)
                if flying:
                    in_flight.append(len(out))
                out.append(key)
                if len(out) >= self.horizon:
                    break
            if scanned >= 8 * self.horizon:  # mostly in-place shards: stop looking
                break
        return out, in_flight

    def _accesses(self) -> Iterator[tuple[tuple[Cacheable, str] | None, bool]]:
        """:meth:`items` as ``((cached shard, its key) or None, in flight)``.

        Each ``(lane, position)`` is looked up in the work source once, not at every call.
        """
        live = dict(sorted(self.positions.items()))
        t = 0
        while live:
            for lane, (start, submitted) in list(live.items()):
                seen = self._seen.setdefault(lane, {})
                got = seen.get(start + t, _UNSEEN)
                if got is _UNSEEN:
                    got = seen[start + t] = self._look_up(lane, start + t)
                if got is _END:
                    del live[lane]
                    continue
                yield got, start + t < submitted
            t += 1

    def _look_up(self, lane: int, i: int) -> Any:
        """Item ``i`` of ``lane``: ``(cached shard, key)``, None (read in place) or ``_END``."""
        item = self.work_source.work(lane, i)
        if item is None:
            return _END
        shard = cacheable(item.shard)
        return None if shard is None else (shard, shard.cache_key)


class CacheFeed:
    """Keeps a node cache's future in step with the lanes of this process.

    Every rank built in the process registers its lanes' positions (lane -> next work item)
    through :meth:`update`, after a reset and after each step; the feed recomputes the
    accesses of all of them and gives them to the cache, and resolves the keys the
    prefetcher asks for.

    Args:
        cache: The node cache.
        work_source: The recipe's work source.
        horizon: Accesses planned ahead.
        prefetch: Shards kept fetched ahead of use (0: no prefetch).
    """

    def __init__(
        self, cache: NodeCache, work_source: WorkSchedule, horizon: int = 256, prefetch: int = 4
    ) -> None:
        self.cache = cache
        self.plan = AccessPlan(work_source, horizon)
        self._lock = threading.Lock()
        if prefetch > 0 and cache.policy == "belady":
            cache.start_prefetch(self._resolve, prefetch)

    def update(self, starts: Mapping[int, int], submitted: Mapping[int, int] | None = None) -> None:
        """Record lane positions (see :meth:`AccessPlan.update`); refresh the cache's future."""
        with self._lock:
            if not self.plan.update(starts, submitted):
                return
            keys, in_flight = self.plan.keys()
        self.cache.set_future(keys, in_flight)

    def _resolve(self, key: str) -> tuple[int, Fetch]:
        shard = self.plan.shards[key]
        return shard.cache_size, shard.cache_fetch
