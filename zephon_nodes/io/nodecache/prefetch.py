"""The prefetcher: a background thread fetching the next keys of a node cache's plan.

It fetches at most ``depth`` upcoming accesses ahead of use, evicts only entries that no
process plans to use, and keeps at most a quarter of the limit in entries fetched ahead and
not opened yet. A failed fetch is left to the foreground open, which fetches and reports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from zephon_nodes.core import settings as _settings
from zephon_nodes.core.settings import Settings
from zephon_nodes.io.nodecache.entries import Fetch
from zephon_nodes.io.nodecache.plans import Plan

__all__ = ["STOP_WAIT_S", "Prefetched", "Prefetcher"]

STOP_WAIT_S = 60.0
"""Longest wait in :meth:`Prefetcher.stop` for a fetch in progress to finish."""


class Prefetched(Protocol):
    """What the prefetcher needs of the cache it fills (a ``NodeCache``, which owns it)."""

    root: Path
    limit_bytes: int
    settings: Settings | None
    _plan: Plan

    def _ahead_bytes(self) -> int: ...

    def _acquire(
        self, key: str, name: str, size: int, fetch: Fetch, *, prefetch: bool
    ) -> int | None: ...


class Prefetcher:
    """Background thread fetching the next keys of a cache's future (bounded, stoppable).

    Args:
        cache: The cache it fills (its fetches run under ``cache.settings``).
        resolve: Maps a key of the future to ``(size, fetch)`` as ``NodeCache.open`` takes
            them.
        depth: How many upcoming accesses to keep fetched ahead of use (at least 1).
    """

    def __init__(
        self, cache: Prefetched, resolve: Callable[[str], tuple[int, Fetch]], depth: int
    ) -> None:
        self.cache = cache
        self.resolve = resolve
        self.depth = max(1, depth)
        self._cond = threading.Condition()
        self._stop = False
        self._dirty = True
        self.error: BaseException | None = None
        self._running = True  # under _cond: the thread has not ended yet
        self._then: Callable[[], None] | None = None  # what the thread calls when it ends
        self._thread = threading.Thread(target=self._run, name="zephon-prefetch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the plan again (it changed, or an access was done)."""
        with self._cond:
            self._dirty = True
            self._cond.notify()

    def stop(self, then: Callable[[], None] | None = None) -> None:
        """Stop the thread and wait for it (a fetch in progress finishes first), then ``then``.

        The wait is bounded (:data:`STOP_WAIT_S`). A thread still fetching after that wait
        calls ``then`` itself when it ends: what ``then`` closes (the cache's global lock) is
        still in use by its fetch, which installs the entry under that lock.

        Args:
            then: Called once the thread has ended (by the thread when it outlives the wait).
        """
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=STOP_WAIT_S)
        with self._cond:
            if self._running:
                self._then = then
                return
        if then is not None:
            then()

    def _run(self) -> None:
        try:
            with _settings.using(self.cache.settings):
                self._loop()
        finally:
            with self._cond:
                self._running = False
                then = self._then
            if then is not None:
                then()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                self._dirty = False
            for name in self.cache._plan.upcoming(self.depth):
                if self._stop:
                    return
                if (self.cache.root / "data" / name).exists():
                    continue
                key = self.cache._plan.keys.get(name, name)
                try:
                    size, fetch = self.resolve(key)
                    if self.cache._ahead_bytes() + size > self.cache.limit_bytes // 4:
                        break  # a quarter of the cache at most waits for its first use
                    self.cache._acquire(key, name, size, fetch, prefetch=True)
                except Exception as exc:  # the foreground open will fetch and report it
                    self.error = exc
                    break
