"""The file locks a node's processes coordinate their node cache through.

A node cache's processes share nothing but its directory: a global ``flock`` on
``root/.lock`` around every decision, one lock file per key under ``root/lock/`` (shared:
the entry is pinned; exclusive: it is being fetched) and one per plan under ``root/plan/``
(held exclusively by its living owner). Locks die with their process, so a crashed rank
leaves no stale pin, reservation or plan behind. :func:`entry_lock` is a per-key lock for
files kept beside the node cache (work-item sizes, the remake of a bad cache copy or index).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["GlobalLock", "entry_lock", "fetch_in_flight", "key_lock", "try_flock"]


class GlobalLock:
    """The node-wide ``flock`` on ``root/.lock`` taken around every decision of a cache.

    Re-entrant within a process: the thread lock is held with it, and the file lock is taken
    by the outermost :meth:`held` block only.

    Args:
        path: The lock file (created if missing).
        tlock: The thread lock held with it (the cache's, which also guards its counters).
    """

    def __init__(self, path: Path, tlock: threading.RLock) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._tlock = tlock
        self._depth = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock inside the block (this thread first, then the node's processes)."""
        with self._tlock:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock file (the lock must not be held)."""
        os.close(self._fd)


def try_flock(fd: int, op: int) -> bool:
    """Take ``flock(fd, op)`` if it is free now; return whether it was taken.

    Args:
        fd: An open file descriptor.
        op: ``fcntl.LOCK_SH`` or ``fcntl.LOCK_EX``.

    Raises:
        OSError: Any error but "held by someone else".
    """
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def key_lock(root: Path, name: str) -> int:
    """Open (creating it) the lock file of entry ``name`` under ``root``; the caller closes it."""
    return os.open(root / "lock" / name, os.O_RDWR | os.O_CREAT, 0o644)


def fetch_in_flight(root: Path, name: str) -> bool:
    """Return whether someone holds the key's lock exclusively (a fetch in flight)."""
    fd = key_lock(root, name)
    try:
        if try_flock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def entry_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive ``flock`` on the lock file ``path`` (created) inside the block.

    The node's other processes wait for it, and so do this process's other threads: each
    block locks an open file of its own. Not re-entrant. Nothing is held when the lock file
    cannot be created (a read-only cache directory: whatever the block writes fails anyway).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
