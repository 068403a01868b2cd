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

__all__ = ["Prefetched", "Prefetcher"]


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
        self._thread = threading.Thread(target=self._run, name="zephon-prefetch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the plan again (it changed, or an access was done)."""
        with self._cond:
            self._dirty = True
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it (a fetch in progress finishes first)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with _settings.using(self.cache.settings):
            self._loop()

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
