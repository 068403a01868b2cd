"""One bounded cache directory per node, shared by all its ranks, with exact-future eviction.

A :class:`NodeCache` keeps whole files (fetched shards, decompressed shards) under ``root`` and
never lets the bytes it holds (finished entries plus fetches in flight) exceed ``limit_bytes``.
Every rank and worker of a node opens the same ``root``; they coordinate through the file
system only:

- a global ``flock`` on ``root/.lock`` around every decision (hit, reservation, eviction);
- one lock file per key: a *shared* lock on it pins the entry (it is in use and never evicted),
  an *exclusive* lock means "being fetched" (other processes wanting the key wait for it, so a
  key is fetched once however many ranks want it at the same time);
- fetches write into ``root/part/`` and are renamed into ``root/data/`` atomically, so nobody
  ever reads a half-written entry. Locks die with their process, so a crashed rank leaves no
  stale pin or reservation behind.

Usage::

    cache = NodeCache("/local/zephon-cache", limit_bytes=50 << 30, policy="belady")
    cache.set_future(["shard-07", "shard-03", "shard-07", ...])  # exact upcoming accesses
    with cache.open("shard-07", size=1 << 30, fetch=lambda dest: download(uri, dest)) as path:
        data = path.read_bytes()  # pinned until the block ends
    cache.stats()  # {"hits": ..., "misses": ..., "bytes_fetched": ..., "evictions": ...}

``open(key, size, fetch)`` returns the local path of ``key``: on a miss it reserves ``size``
bytes (an upper bound of the entry's size), evicting unpinned entries as the policy says, and
calls ``fetch(dest)`` which must write the whole entry to ``dest``. The entry stays pinned
until the ``with`` block ends.

Policies (:mod:`~zephon_nodes.io.nodecache.policies`):

- ``"belady"``: the access sequence of a recipe is known in advance (``work(lane, i)`` is pure),
  so each process tells the cache its exact upcoming accesses with :meth:`NodeCache.set_future`
  (see :mod:`zephon_nodes.io.nodecache.future`). The entry whose next use, by any process on the
  node, is farthest away is evicted first (Belady's rule, optimal for a known sequence); entries
  no process will use again go first, ties by key. A background prefetcher
  (:meth:`NodeCache.start_prefetch`, :mod:`~zephon_nodes.io.nodecache.prefetch`) fetches the
  next keys of the future ahead of use, taking little room from entries used sooner.
- ``"lru"``: the least recently used unpinned entry is evicted first (the comparison policy).

If the limit would be exceeded and every entry is pinned, ``open`` waits for pins to be
released for at most ``wait_s`` seconds, then raises :class:`CacheFullError`; it raises at once
when the entry can never fit (larger than the limit, or the pins held by this very process
leave no room), so nothing hangs.

The limit is a physical setting (``--cache-limit``, ``ZEPHON_CACHE_LIMIT``): it never changes
a byte of output and stays outside the recipe's fingerprint. The process's cache made from
the settings is :func:`~zephon_nodes.io.nodecache.nodecache.node_cache`. Its parts: the
entries (:mod:`~zephon_nodes.io.nodecache.entries`), the file locks (``locks``), the plans of
the node's processes (``plans``) and the bytes held (``usage``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings
from zephon_nodes.io.nodecache.entries import CacheFullError, Fetch, entry_name
from zephon_nodes.io.nodecache.locks import GlobalLock, fetch_in_flight, key_lock, try_flock
from zephon_nodes.io.nodecache.plans import Plan
from zephon_nodes.io.nodecache.policies import Policy, victims
from zephon_nodes.io.nodecache.prefetch import Prefetcher
from zephon_nodes.io.nodecache.usage import UsageRecord, drop_reservation, reserved_bytes

__all__ = ["NodeCache"]


class NodeCache:
    """A bounded directory of fetched files shared by every process of a node.

    Args:
        root: The cache directory (created if missing); the same for all ranks of a node.
        limit_bytes: Most bytes the cache holds at any time, fetches in flight included.
        policy: ``"belady"`` (evict the entry needed farthest in the future) or ``"lru"``.
        wait_s: Longest wait for pinned entries to be released, or for another process's
            fetch of the same key, before :class:`CacheFullError` / :class:`DataError`.

    Raises:
        ValueError: ``limit_bytes`` is negative or ``policy`` unknown.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        limit_bytes: int,
        policy: Policy = "belady",
        *,
        wait_s: float = 300.0,
    ) -> None:
        if limit_bytes < 0:
            raise ValueError(f"{limit_bytes=} should be >= 0")
        if policy not in ("belady", "lru"):
            raise ValueError(f"{policy=} should be 'belady' or 'lru'")
        self.root = Path(root)
        self.limit_bytes = int(limit_bytes)
        self.policy: Policy = policy
        self.wait_s = float(wait_s)
        for sub in ("data", "lock", "part", "resv", "plan"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._tlock = threading.RLock()
        self._lock = GlobalLock(self.root / ".lock", self._tlock)
        self._token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._plan = Plan(self.root / "plan" / f"{self._token}.json", self._tlock)
        self._ahead: dict[str, int] = {}  # prefetched, not opened yet: name -> bytes
        self._clock = 0
        self._pinned: dict[tuple[int, str], int] = {}  # (thread, name) -> open pins
        self._stats = {
            "hits": 0,
            "misses": 0,
            "fetches": 0,
            "prefetches": 0,
            "bytes_fetched": 0,
            "bytes_read": 0,
            "evictions": 0,
            "waits": 0,
            "peak_bytes": 0,
        }
        self._prefetch: Prefetcher | None = None
        self.settings: Settings | None = None  # what its prefetcher's fetches run under
        self._closed = False
        self._record = UsageRecord(self.root)
        with self._lock.held():  # a smaller limit than last time's: trim unpinned entries now
            self._make_room(0, "", prefetch=False)

    # ------------------------------------------------------------------ public API

    @contextlib.contextmanager
    def open(self, key: str, size: int, fetch: Fetch) -> Iterator[Path]:
        """Return the local path of ``key``, fetching it on a miss; pinned inside the block.

        Args:
            key: Identity of the entry (e.g. a shard's content checksum or URI + version tag).
            size: Bytes to reserve before fetching: the entry's size or an upper bound.
            fetch: Called as ``fetch(dest)`` on a miss; writes the whole entry to ``dest``.

        Raises:
            CacheFullError: The entry cannot fit within the limit (now or within ``wait_s``).
            DataError: Another process's fetch of the same key did not finish within
                ``wait_s``.
        """
        name = entry_name(key)
        self._advance(name)
        with self._tlock:
            self._ahead.pop(name, None)
        fd = self._acquire(key, name, int(size), fetch, prefetch=False)
        assert fd is not None
        path = self.root / "data" / name
        try:
            yield path
        finally:
            with self._lock.held():
                self._unpin(name, fd)

    def set_future(self, keys: Sequence[str], in_flight: Iterable[int] = ()) -> None:
        """Tell the cache this process's exact upcoming accesses, next one first.

        Each :meth:`open` of a planned key marks it done and moves a cursor past the done
        prefix; eviction (``belady``) and prefetch read the keys from the cursor on. Other
        processes sharing the directory see the first 4096 keys through a plan file in
        ``root/plan/``.

        Args:
            keys: The upcoming accesses, in order.
            in_flight: Indexes of accesses already handed to a reader: they count for
                eviction, but the prefetcher leaves them to their reader.
        """
        self._plan.set(keys, in_flight)
        if self._prefetch is not None:
            self._prefetch.wake()

    def start_prefetch(self, resolve: Callable[[str], tuple[int, Fetch]], depth: int = 4) -> None:
        """Fetch the next ``depth`` keys of the future in a background thread.

        Args:
            resolve: Maps a key of the future to ``(size, fetch)`` as :meth:`open` takes them.
            depth: How many upcoming accesses to keep fetched ahead of use.

        Called again, it replaces ``resolve`` and ``depth`` (one prefetcher per cache).
        """
        if self._prefetch is not None:  # a newer plan (e.g. a new pipeline) takes over
            self._prefetch.resolve = resolve
            self._prefetch.depth = max(1, depth)
            self._prefetch.wake()
            return
        self._prefetch = Prefetcher(self, resolve, depth)

    def stats(self) -> dict[str, int]:
        """Return this process's counters as a JSON-safe dict.

        Keys: hits and misses (foreground opens), fetches and prefetches (fetch calls, all and
        background), bytes_fetched, bytes_read (bytes of entries opened), evictions, waits
        (opens that waited for another fetcher or for room), peak_bytes (the most bytes the
        directory held, as seen by this process) and limit_bytes.
        """
        with self._tlock:
            out = dict(self._stats)
        out["limit_bytes"] = self.limit_bytes
        return out

    def usage_bytes(self) -> int:
        """Return the bytes the cache holds now: entries plus reservations of fetches."""
        with self._lock.held():
            return self._usage()

    def contains(self, key: str) -> bool:
        """Return whether ``key`` is in the cache now."""
        return (self.root / "data" / entry_name(key)).exists()

    def discard(self, key: str) -> bool:
        """Remove ``key``'s entry now (a reader found it damaged) unless someone pins it.

        Returns:
            Whether an entry was removed.
        """
        name = entry_name(key)
        with self._lock.held():
            fd = key_lock(self.root, name)
            try:
                if not try_flock(fd, fcntl.LOCK_EX):
                    return False
                try:
                    self._remove_entry(self.root / "data" / name)
                except FileNotFoundError:
                    return False
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        return True

    def discard_if(self, key: str, bad: Callable[[Path], bool]) -> bool:
        """Remove ``key``'s entry if ``bad(path)`` finds it damaged, judged while no one pins it.

        Every reader that found the entry damaged calls this, each after its own pin is gone:
        the first one to hold the key alone judges the entry and removes it; a later one finds
        it removed, or made again and sound, and keeps it. ``bad`` runs under the key's
        exclusive lock (no reader, no fetch of the key meanwhile) but not the node-wide
        lock, and may drop what is derived from the entry when it answers True.

        Args:
            key: The entry's key.
            bad: Called as ``bad(path)`` with the entry's path; whether it is damaged.

        Returns:
            Whether the entry was removed.

        Raises:
            DataError: Other readers kept the entry pinned for more than ``wait_s`` seconds.
        """
        name = entry_name(key)
        path = self.root / "data" / name
        deadline = time.monotonic() + self.wait_s
        delay = 0.001
        while True:
            with self._lock.held():
                fd = key_lock(self.root, name)
                if try_flock(fd, fcntl.LOCK_EX):
                    break
                os.close(fd)
            if time.monotonic() > deadline:
                raise DataError(
                    f"node cache {self.root}: {key!r} is damaged and stayed in use by other "
                    f"readers for more than wait_s={self.wait_s:g} s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        try:
            if not (path.exists() or path.is_symlink()) or not bad(path):
                return False
            with self._lock.held():
                try:
                    self._remove_entry(path)
                except FileNotFoundError:
                    return False
            return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _remove_entry(self, path: Path) -> int:
        """Remove an entry (call under the global lock); return the bytes it held.

        Raises:
            FileNotFoundError: It is gone already.
        """
        size = path.lstat().st_size
        before = self._record.data_mtime()
        _remove(path)
        self._record.record_change(before, -size)
        return size

    def close(self) -> None:
        """Stop prefetching and withdraw this process's plan; entries stay on disk.

        Bounded: a prefetch still fetching after ``prefetch.STOP_WAIT_S`` seconds is left to
        finish in its thread, which closes the global lock when it ends (its fetch installs
        the entry under that lock).
        """
        if self._closed:
            return
        self._closed = True
        if self._prefetch is not None:
            self._prefetch.stop(then=self._lock.close)
        else:
            self._lock.close()
        self._plan.withdraw()

    def __enter__(self) -> NodeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ pins

    def _pin(self, name: str) -> None:
        key = (threading.get_ident(), name)
        self._pinned[key] = self._pinned.get(key, 0) + 1

    def _unpin(self, name: str, fd: int) -> None:
        os.close(fd)
        key = (threading.get_ident(), name)
        left = self._pinned.get(key)
        if left is not None:
            if left <= 1:
                del self._pinned[key]
            else:
                self._pinned[key] = left - 1

    # ------------------------------------------------------------------ core

    def _acquire(
        self, key: str, name: str, size: int, fetch: Fetch, *, prefetch: bool
    ) -> int | None:
        """Pin ``name`` (fetching it if absent) and return the pinning fd.

        With ``prefetch``, return None instead of waiting, and release the entry unpinned.
        """
        data = self.root / "data" / name
        resv = self.root / "resv" / name
        deadline = time.monotonic() + self.wait_s
        delay = 0.001
        waited = False
        while True:
            fetching = False
            with self._lock.held():
                if data.exists():
                    if prefetch:
                        return None
                    fd = key_lock(self.root, name)
                    if try_flock(fd, fcntl.LOCK_SH):
                        self._stats["hits"] += 1
                        self._stats["bytes_read"] += data.stat().st_size
                        self._pin(name)
                        self._touch(data)
                        return fd
                    os.close(fd)  # an evictor's brief exclusive lock: retry
                elif resv.exists() and fetch_in_flight(self.root, name):
                    if prefetch:
                        return None
                    fetching = True  # another process (or thread) fetches it: wait below
                else:
                    if resv.exists():
                        drop_reservation(self.root, name)
                    fd = key_lock(self.root, name)
                    if try_flock(fd, fcntl.LOCK_EX):
                        room = self._make_room(size, name, prefetch=prefetch)
                        if room is True:
                            resv.write_text(str(size))
                            self._note_peak()
                            break
                        fcntl.flock(fd, fcntl.LOCK_UN)
                        os.close(fd)
                        if prefetch:
                            return None
                        if room is not None:
                            raise CacheFullError(room)
                    else:
                        os.close(fd)  # a waiter's momentary shared lock: retry
            # Wait (outside the global lock) for a fetch in flight or for pins to go.
            if time.monotonic() > deadline:
                if fetching:
                    raise DataError(
                        f"node cache {self.root}: {key!r} has been fetched by another process "
                        f"for more than wait_s={self.wait_s:g} s without finishing"
                    )
                raise CacheFullError(self._full_message(key, size))
            if not waited:
                waited = True
                with self._tlock:
                    self._stats["waits"] += 1
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self._fetch(key, name, size, fetch, fd, prefetch=prefetch)

    def _fetch(
        self, key: str, name: str, size: int, fetch: Fetch, fd: int, *, prefetch: bool
    ) -> int | None:
        """Run ``fetch`` for a reserved key; install the entry atomically."""
        data = self.root / "data" / name
        resv = self.root / "resv" / name
        part = self.root / "part" / f"{name}.{self._token}.tmp"
        try:
            fetch(part)
            if not part.exists():
                raise DataError(f"node cache: fetch of {key!r} wrote nothing to {part}")
            actual = part.stat().st_size
            with self._lock.held():
                if actual > size:
                    resv.write_text("0")
                    room = self._make_room(actual, name, prefetch=False)
                    self._note_peak()
                    if room is not True:
                        raise CacheFullError(
                            f"node cache: {key!r} is {actual} bytes, more than the {size} "
                            f"bytes reserved for it, and the cache (limit {self.limit_bytes} "
                            "bytes) cannot make room"
                        )
                before = self._record.data_mtime()
                os.replace(part, data)
                self._record.record_change(before, actual)
                self._touch(data)
                resv.unlink()
                self._stats["fetches"] += 1
                self._stats["bytes_fetched"] += actual
                if prefetch:
                    self._stats["prefetches"] += 1
                    self._ahead[name] = actual
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                    return None
                self._stats["misses"] += 1
                self._stats["bytes_read"] += actual
                fcntl.flock(fd, fcntl.LOCK_SH)  # converts: pinned, and waiters may pin too
                self._pin(name)
                return fd
        except BaseException:
            with self._lock.held():
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
                with contextlib.suppress(FileNotFoundError):
                    resv.unlink()
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            raise

    def _touch(self, data: Path) -> None:
        """Stamp ``data`` as just used (LRU order; file times are too coarse by themselves)."""
        if self.policy == "lru":
            now = max(time.time_ns(), self._clock + 1)
            self._clock = now
            os.utime(data, ns=(now, now))

    # ------------------------------------------------------------------ usage

    def _usage(self) -> int:
        return self._record.data_bytes() + reserved_bytes(self.root)

    def _note_peak(self) -> None:
        used = self._usage()
        if used > self._stats["peak_bytes"]:
            self._stats["peak_bytes"] = used

    def _full_message(self, key: str, size: int) -> str:
        return (
            f"node cache {self.root}: no room for {key!r} ({size} bytes) within "
            f"limit_bytes={self.limit_bytes} after waiting {self.wait_s:g} s: every entry is "
            "in use (pinned) or being fetched; raise the limit (--cache-limit / "
            "ZEPHON_CACHE_LIMIT) or open fewer entries at once"
        )

    def _make_room(self, size: int, name: str, *, prefetch: bool) -> bool | str | None:
        """Evict until ``size`` more bytes fit. Call under the global lock.

        Returns True when room was made, None when waiting may help (entries pinned by other
        processes), or a message when it never will.
        """
        if size > self.limit_bytes:
            return (
                f"node cache {self.root}: entry {name!r} needs {size} bytes, more than "
                f"limit_bytes={self.limit_bytes}; raise --cache-limit / ZEPHON_CACHE_LIMIT"
            )
        used = self._usage()
        if used + size <= self.limit_bytes:
            return True
        me = threading.get_ident()
        own_pinned = 0  # pins of the calling thread: waiting would never release them
        for thread, pinned in self._pinned:
            if thread == me:
                with contextlib.suppress(FileNotFoundError):
                    own_pinned += (self.root / "data" / pinned).stat().st_size
        if own_pinned + size > self.limit_bytes:
            return (
                f"node cache {self.root}: entry {name!r} needs {size} bytes but the caller "
                f"already pins {own_pinned} bytes of limit_bytes={self.limit_bytes}; raise "
                "--cache-limit / ZEPHON_CACHE_LIMIT"
            )
        for victim, _ in victims(self.root / "data", self.policy, self._plan, prefetch):
            path = self.root / "data" / victim
            try:
                vsize = path.stat().st_size
            except FileNotFoundError:
                continue
            fd = key_lock(self.root, victim)
            try:
                if not try_flock(fd, fcntl.LOCK_EX):
                    continue  # pinned
                before = self._record.data_mtime()
                _remove(path)
                self._record.record_change(before, -vsize)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
            self._stats["evictions"] += 1
            used -= vsize
            if used + size <= self.limit_bytes:
                return True
        return None

    def _advance(self, name: str) -> None:
        """Move the plan's cursor past the next planned access of ``name``."""
        if self._plan.advance(name) and self._prefetch is not None:
            self._prefetch.wake()

    def _ahead_bytes(self) -> int:
        """Bytes prefetched and not opened yet (forgetting entries evicted meanwhile)."""
        with self._tlock:
            for name in list(self._ahead):
                if not (self.root / "data" / name).exists():
                    del self._ahead[name]
            return sum(self._ahead.values())


def _remove(path: Path) -> None:
    """Remove an entry's file (or a directory found where one should be: a damaged entry)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
