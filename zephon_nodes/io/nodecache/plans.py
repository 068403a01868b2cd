"""The plans of a node: each process's exact upcoming accesses, shared through files.

A process tells its node cache the keys it will open, next one first
(:meth:`~zephon_nodes.io.nodecache.cache.NodeCache.set_future`); its :class:`Plan` keeps
them with a cursor past the accesses done, and publishes the first
:data:`PLAN_HORIZON` upcoming ones to ``root/plan/<token>.json`` for the other processes of
the node, holding that file's lock exclusively while it lives (the file is created and
locked under a temporary name, then renamed into place: no reader ever finds it unlocked).
Eviction by Belady's rule reads every plan (:meth:`Plan.distances`); a plan whose owner
died is removed by the first process that reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from zephon_nodes.io.nodecache.entries import entry_name
from zephon_nodes.io.nodecache.locks import try_flock

__all__ = ["PLAN_HORIZON", "Plan", "read_plan"]

PLAN_HORIZON = 4096
"""Upcoming keys a plan file holds."""
_PLAN_PUBLISH_S = 0.05
_ADVANCE_WINDOW = 256
_INF = float("inf")


class Plan:
    """This process's upcoming accesses of one node cache (entry file names, next first).

    Args:
        path: The plan file this process publishes (``root/plan/<token>.json``); the other
            plans of the node are the other ``*.json`` files of its folder.
        lock: The cache's thread lock, which guards the plan too.
    """

    def __init__(self, path: Path, lock: threading.RLock) -> None:
        self.path = path
        self._lock = lock
        self._fd: int | None = None
        self.future: list[str] = []
        self.keys: dict[str, str] = {}  # file name -> key, for the prefetcher
        self._cursor = 0
        self._consumed: set[int] = set()  # planned accesses done out of order, past the cursor
        self._in_flight: set[int] = set()  # planned accesses the prefetcher leaves alone
        self._published = 0.0

    def set(self, keys: Sequence[str], in_flight: Iterable[int] = ()) -> None:
        """Replace the plan with ``keys`` (see ``NodeCache.set_future``) and publish it."""
        with self._lock:
            self.keys = {entry_name(k): k for k in keys}
            self.future = [entry_name(k) for k in keys]
            self._cursor = 0
            self._consumed = set()
            self._in_flight = set(in_flight)
        self.publish(force=True)

    def distances(self) -> dict[str, float]:
        """Next use of each key by any process on the node, in accesses from now."""
        dist: dict[str, float] = {}
        with self._lock:
            base = self._cursor
            mine = self.future[base:]
            done = set(self._consumed)
        for i, n in enumerate(mine):
            if n not in dist and base + i not in done:
                dist[n] = float(i)
        for plan in self.path.parent.glob("*.json"):
            if plan == self.path:
                continue
            keys = read_plan(plan)
            for i, n in enumerate(keys):
                if dist.get(n, _INF) > i:
                    dist[n] = float(i)
        return dist

    def advance(self, name: str) -> bool:
        """Move the cursor past the next planned access of ``name``.

        Returns:
            Whether a planned access of ``name`` was found (and the plan published).
        """
        with self._lock:
            fut = self.future
            end = min(len(fut), self._cursor + _ADVANCE_WINDOW)
            for i in range(self._cursor, end):
                if fut[i] == name and i not in self._consumed:
                    self._consumed.add(i)
                    break
            else:
                return False
            while self._cursor in self._consumed:
                self._consumed.discard(self._cursor)
                self._cursor += 1
        self.publish()
        return True

    def publish(self, force: bool = False) -> None:
        """Write this process's upcoming keys for the others (at most every 50 ms)."""
        now = time.monotonic()
        if not force and now - self._published < _PLAN_PUBLISH_S:
            return
        self._published = now
        with self._lock:
            keys = [
                n
                for i, n in enumerate(self.future[self._cursor : self._cursor + PLAN_HORIZON])
                if self._cursor + i not in self._consumed
            ]
        blob = json.dumps(keys).encode("utf-8")
        with self._lock:
            if self._fd is None:
                self._fd = _create_locked(self.path)
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, blob, 0)

    def upcoming(self, depth: int) -> list[str]:
        """The next ``depth`` distinct keys not done and not handed to a reader yet."""
        with self._lock:
            out: list[str] = []
            for i in range(self._cursor, len(self.future)):
                n = self.future[i]
                if i not in self._consumed and i not in self._in_flight and n not in out:
                    out.append(n)
                    if len(out) >= depth:
                        break
            return out

    def withdraw(self) -> None:
        """Remove this process's plan file (the others stop counting its accesses)."""
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _create_locked(path: Path) -> int:
    """Create the plan file ``path`` already locked exclusively; return its open fd.

    It is made and locked under a name no reader looks at, then renamed into place (the
    lock follows the open file, not the name): a reader never finds it unlocked and takes
    its living owner for dead.
    """
    tmp = path.with_name(f"{path.name}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return fd


def read_plan(plan: Path) -> list[str]:
    """Read another process's plan; remove it if that process is gone."""
    try:
        fd = os.open(plan, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        if try_flock(fd, fcntl.LOCK_SH):  # its owner holds it exclusively while alive
            fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(FileNotFoundError):
                plan.unlink()
            return []
        for _ in range(2):  # once more if caught in the middle of a rewrite
            with contextlib.suppress(ValueError):
                keys = json.loads(os.pread(fd, 1 << 24, 0) or b"[]")
                if isinstance(keys, list):
                    return [str(k) for k in keys]
        return []
    finally:
        os.close(fd)
