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

Policies:

- ``"belady"``: the access sequence of a recipe is known in advance (``work(lane, i)`` is pure),
  so each process tells the cache its exact upcoming accesses with :meth:`NodeCache.set_future`
  (see :mod:`zephon_nodes.io.nodecache.future`). The entry whose next use, by any process on the
  node, is farthest away is evicted first (Belady's rule, optimal for a known sequence); entries
  no process will use again go first, ties by key. A background prefetcher
  (:meth:`NodeCache.start_prefetch`) fetches the next keys of the future ahead of use; it only
  evicts entries that no process plans to use, and keeps at most a quarter of the limit in entries
  fetched ahead and not used yet, so it takes little room from entries that will be used sooner.
- ``"lru"``: the least recently used unpinned entry is evicted first (the comparison policy).

If the limit would be exceeded and every entry is pinned, ``open`` waits for pins to be
released for at most ``wait_s`` seconds, then raises :class:`CacheFullError`; it raises at once
when the entry can never fit (larger than the limit, or the pins held by this very process
leave no room), so nothing hangs.

The limit is a physical setting (``--cache-limit``, ``ZEPHON_CACHE_LIMIT``): it never changes
a byte of output and stays outside the recipe's fingerprint.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from zephon_nodes.core import settings as _settings
from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings, parse_size

__all__ = [
    "LIMIT_ENV",
    "POLICY_ENV",
    "PREFETCH_ENV",
    "CacheFullError",
    "Cacheable",
    "Fetch",
    "NodeCache",
    "check_fits",
    "node_cache",
    "parse_size",
    "prefetch_depth",
    "set_cache_limit",
]

LIMIT_ENV = "ZEPHON_CACHE_LIMIT"
POLICY_ENV = "ZEPHON_CACHE_POLICY"
PREFETCH_ENV = "ZEPHON_CACHE_PREFETCH"

Fetch = Callable[[Path], None]
"""Writes the whole entry to the given path (called with a temporary path inside the cache)."""

Policy = Literal["belady", "lru"]

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_INF = float("inf")
_PLAN_HORIZON = 4096
_PLAN_PUBLISH_S = 0.05
_ADVANCE_WINDOW = 256


@runtime_checkable
class Cacheable(Protocol):
    """A shard read through the node cache (what :mod:`~zephon_nodes.io.nodecache.future` plans).

    Attributes:
        cache_key: Identity of the cached file (content checksum or URI + version tag); the
            same string in every process.
        cache_size: Bytes the cached file takes (or an upper bound).
    """

    cache_key: str
    cache_size: int

    def cache_fetch(self, dest: Path) -> None:
        """Write the whole cached file to ``dest``."""


class CacheFullError(DataError):
    """The node cache cannot make room for an entry within its limit."""


def _name(key: str) -> str:
    """Return the file name for ``key`` (the key itself when safe, else a hash)."""
    if _SAFE.fullmatch(key) and not key.endswith((".tmp", ".json")):
        return key
    return "h-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def _try_flock(fd: int, op: int) -> bool:
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


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
        self._glock_fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._tlock = threading.RLock()
        self._depth = 0
        self._token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._plan_path = self.root / "plan" / f"{self._token}.json"
        self._plan_fd: int | None = None
        self._future: list[str] = []
        self._keys: dict[str, str] = {}  # file name -> key, for the prefetcher
        self._cursor = 0
        self._consumed: set[int] = set()  # planned accesses done out of order, past the cursor
        self._in_flight: set[int] = set()  # planned accesses the prefetcher leaves alone
        self._ahead: dict[str, int] = {}  # prefetched, not opened yet: name -> bytes
        self._published = 0.0
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
        self._prefetch: _Prefetcher | None = None
        self.settings: Settings | None = None  # what its prefetcher's fetches run under
        self._closed = False
        self._unscanned = 0  # decisions since this process last listed data/ (see _data_bytes)
        with self._global():  # a smaller limit than last time's: trim unpinned entries now
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
        name = _name(key)
        self._advance(name)
        with self._tlock:
            self._ahead.pop(name, None)
        fd = self._acquire(key, name, int(size), fetch, prefetch=False)
        assert fd is not None
        path = self.root / "data" / name
        try:
            yield path
        finally:
            with self._global():
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
        with self._tlock:
            self._keys = {_name(k): k for k in keys}
            self._future = [_name(k) for k in keys]
            self._cursor = 0
            self._consumed = set()
            self._in_flight = set(in_flight)
        self._publish(force=True)
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
        self._prefetch = _Prefetcher(self, resolve, depth)

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
        with self._global():
            return self._usage()

    def contains(self, key: str) -> bool:
        """Return whether ``key`` is in the cache now."""
        return (self.root / "data" / _name(key)).exists()

    def discard(self, key: str) -> bool:
        """Remove ``key``'s entry now (a reader found it damaged) unless someone pins it.

        Returns:
            Whether an entry was removed.
        """
        name = _name(key)
        with self._global():
            fd = self._lock_fd(name)
            try:
                if not _try_flock(fd, fcntl.LOCK_EX):
                    return False
                path = self.root / "data" / name
                try:
                    size = path.stat().st_size
                    before = self._data_mtime()
                    path.unlink()
                    self._record_change(before, -size)
                except FileNotFoundError:
                    return False
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        return True

    def close(self) -> None:
        """Stop prefetching and withdraw this process's plan; entries stay on disk."""
        if self._closed:
            return
        self._closed = True
        if self._prefetch is not None:
            self._prefetch.stop()
        with contextlib.suppress(FileNotFoundError):
            self._plan_path.unlink()
        if self._plan_fd is not None:
            os.close(self._plan_fd)
            self._plan_fd = None
        os.close(self._glock_fd)

    def __enter__(self) -> NodeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ locking

    @contextlib.contextmanager
    def _global(self) -> Iterator[None]:
        with self._tlock:
            if self._depth == 0:
                fcntl.flock(self._glock_fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._glock_fd, fcntl.LOCK_UN)

    def _lock_fd(self, name: str) -> int:
        return os.open(self.root / "lock" / name, os.O_RDWR | os.O_CREAT, 0o644)

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
            with self._global():
                if data.exists():
                    if prefetch:
                        return None
                    fd = self._lock_fd(name)
                    if _try_flock(fd, fcntl.LOCK_SH):
                        self._stats["hits"] += 1
                        self._stats["bytes_read"] += data.stat().st_size
                        self._pin(name)
                        self._touch(data)
                        return fd
                    os.close(fd)  # an evictor's brief exclusive lock: retry
                elif resv.exists() and self._live(name):
                    if prefetch:
                        return None
                    fetching = True  # another process (or thread) fetches it: wait below
                else:
                    if resv.exists():
                        self._clean_stale(name)
                    fd = self._lock_fd(name)
                    if _try_flock(fd, fcntl.LOCK_EX):
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
            with self._global():
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
                before = self._data_mtime()
                os.replace(part, data)
                self._record_change(before, actual)
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
            with self._global():
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

    def _live(self, name: str) -> bool:
        """Return whether someone holds the key's lock exclusively (a fetch in flight)."""
        fd = self._lock_fd(name)
        try:
            if _try_flock(fd, fcntl.LOCK_SH):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            return True
        finally:
            os.close(fd)

    def _clean_stale(self, name: str) -> None:
        """Remove the reservation and partial files a dead fetcher left behind."""
        with contextlib.suppress(FileNotFoundError):
            (self.root / "resv" / name).unlink()
        for part in (self.root / "part").glob(f"{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    # ------------------------------------------------------------------ usage

    # A full listing of data/ at least every this many decisions of a process, whatever the
    # record says (bounds the drift a crash between a change and its record could leave).
    _RESCAN_EVERY = 64

    def _data_mtime(self) -> int:
        return os.stat(self.root / "data").st_mtime_ns

    def _read_record(self) -> tuple[int, int] | None:
        try:
            mtime, total = (self.root / ".usage").read_text().split()
            return int(mtime), int(total)
        except (FileNotFoundError, ValueError):
            return None

    def _write_record(self, mtime: int, total: int) -> None:
        (self.root / ".usage").write_text(f"{mtime} {total}")

    def _record_change(self, before: int, delta: int) -> None:
        """After adding (``delta`` > 0) or removing an entry of data/: keep the record exact.

        Under the global lock. The record holds data/'s modification time and total bytes as
        of the last recorded change; it is updated only if it was current just before this
        change, else dropped (the next decision lists data/).
        """
        rec = self._read_record()
        if rec is not None and rec[0] == before:
            self._write_record(self._data_mtime(), rec[1] + delta)
        elif rec is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.root / ".usage").unlink()

    def _data_bytes(self) -> int:
        """Bytes of the entries in data/ (under the global lock).

        Every change to data/ is made under the global lock and recorded in ``.usage`` with
        data/'s modification time after it, so while that time is unchanged the recorded
        total is exact and data/ need not be listed (a cache of many small entries would
        otherwise list it on every miss). A change the record does not know (a process that
        died between the two, a file removed by hand) changes the time: then, and every
        :attr:`_RESCAN_EVERY` decisions anyway, data/ is listed again.
        """
        self._unscanned += 1
        rec = self._read_record()
        fresh = rec is not None and self._unscanned < self._RESCAN_EVERY
        if fresh and rec is not None and rec[0] == self._data_mtime():
            return rec[1]
        mtime = self._data_mtime()
        total = 0
        for entry in os.scandir(self.root / "data"):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
        self._write_record(mtime, total)
        self._unscanned = 0
        return total

    def _usage(self) -> int:
        total = self._data_bytes()
        for entry in os.scandir(self.root / "resv"):
            if not self._live(entry.name):  # its fetcher died: free its room
                self._clean_stale(entry.name)
                continue
            with contextlib.suppress(FileNotFoundError, ValueError):
                total += int(Path(entry.path).read_text() or 0)
        return total

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
        for victim, _ in self._victims(unplanned_only=prefetch):
            path = self.root / "data" / victim
            try:
                vsize = path.stat().st_size
            except FileNotFoundError:
                continue
            fd = self._lock_fd(victim)
            try:
                if not _try_flock(fd, fcntl.LOCK_EX):
                    continue  # pinned
                before = self._data_mtime()
                path.unlink()
                self._record_change(before, -vsize)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
            self._stats["evictions"] += 1
            used -= vsize
            if used + size <= self.limit_bytes:
                return True
        return None

    def _victims(self, unplanned_only: bool = False) -> list[tuple[str, float]]:
        """Return eviction candidates, best victim first (pins are checked by the caller)."""
        names = [e.name for e in os.scandir(self.root / "data")]
        if self.policy == "lru":
            order = []
            for n in names:
                with contextlib.suppress(FileNotFoundError):
                    order.append((os.stat(self.root / "data" / n).st_mtime_ns, n))
            order.sort()
            return [(n, 0.0) for _, n in order]
        dist = self._distances()
        ranked = sorted(((dist.get(n, _INF), n) for n in names), key=lambda t: (-t[0], t[1]))
        if unplanned_only:  # the prefetcher: only what no process plans to use
            ranked = [t for t in ranked if t[0] == _INF]
        return [(n, d) for d, n in ranked]

    # ------------------------------------------------------------------ the future

    def _distances(self) -> dict[str, float]:
        """Next use of each key by any process on the node, in accesses from now."""
        dist: dict[str, float] = {}
        with self._tlock:
            base = self._cursor
            mine = self._future[base:]
            done = set(self._consumed)
        for i, n in enumerate(mine):
            if n not in dist and base + i not in done:
                dist[n] = float(i)
        for plan in (self.root / "plan").glob("*.json"):
            if plan == self._plan_path:
                continue
            keys = self._read_plan(plan)
            for i, n in enumerate(keys):
                if dist.get(n, _INF) > i:
                    dist[n] = float(i)
        return dist

    def _read_plan(self, plan: Path) -> list[str]:
        """Read another process's plan; remove it if that process is gone."""
        try:
            fd = os.open(plan, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            if _try_flock(fd, fcntl.LOCK_SH):  # its owner holds it exclusively while alive
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

    def _advance(self, name: str) -> None:
        """Move the cursor past the next planned access of ``name``."""
        with self._tlock:
            fut = self._future
            end = min(len(fut), self._cursor + _ADVANCE_WINDOW)
            for i in range(self._cursor, end):
                if fut[i] == name and i not in self._consumed:
                    self._consumed.add(i)
                    break
            else:
                return
            while self._cursor in self._consumed:
                self._consumed.discard(self._cursor)
                self._cursor += 1
        self._publish()
        if self._prefetch is not None:
            self._prefetch.wake()

    def _publish(self, force: bool = False) -> None:
        """Write this process's upcoming keys for the others (at most every 50 ms)."""
        now = time.monotonic()
        if not force and now - self._published < _PLAN_PUBLISH_S:
            return
        self._published = now
        with self._tlock:
            keys = [
                n
                for i, n in enumerate(self._future[self._cursor : self._cursor + _PLAN_HORIZON])
                if self._cursor + i not in self._consumed
            ]
        blob = json.dumps(keys).encode("utf-8")
        if self._plan_fd is None:
            self._plan_fd = os.open(self._plan_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._plan_fd, fcntl.LOCK_EX)
        os.ftruncate(self._plan_fd, 0)
        os.pwrite(self._plan_fd, blob, 0)

    def _ahead_bytes(self) -> int:
        """Bytes prefetched and not opened yet (forgetting entries evicted meanwhile)."""
        with self._tlock:
            for name in list(self._ahead):
                if not (self.root / "data" / name).exists():
                    del self._ahead[name]
            return sum(self._ahead.values())

    def _upcoming(self, depth: int) -> list[str]:
        with self._tlock:
            out: list[str] = []
            for i in range(self._cursor, len(self._future)):
                n = self._future[i]
                if i not in self._consumed and i not in self._in_flight and n not in out:
                    out.append(n)
                    if len(out) >= depth:
                        break
            return out


_SHARED: dict[tuple[int, str, int | None, int | None, str], NodeCache] = {}
_SHARED_LOCK = threading.Lock()


def set_cache_limit(
    limit: str | int | None, policy: str | None = None, prefetch: int | None = None
) -> None:
    """Change this process's node-cache limit, policy and prefetch depth (settings updates).

    Each is an :func:`~zephon_nodes.core.settings.update` of the process's settings, which
    pools send to their workers with every call. None leaves a setting as the environment
    or the default has it (``limit=None``: ``ZEPHON_CACHE_LIMIT``, else the automatic
    default, see :meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`).

    Raises:
        RecipeError: ``limit`` is not a byte size, ``policy`` unknown or ``prefetch`` < 0.
    """
    _settings.update(cache_limit=limit, cache_policy=policy, cache_prefetch=prefetch)


def prefetch_depth(settings: Settings | None = None) -> int:
    """Return the prefetch depth: upcoming shards kept fetched ahead of use.

    From :attr:`Settings.cache_prefetch <zephon_nodes.core.settings.Settings>`
    (``ZEPHON_CACHE_PREFETCH``, default 4; 0 disables the prefetcher).
    """
    return (settings or _settings.current()).cache_prefetch


def node_cache(settings: Settings | None = None) -> NodeCache:
    """Return this process's node cache for ``settings`` (default: the current settings).

    The cache lives in ``<cache_dir>/node`` with the limit of ``cache_limit``
    (``--cache-limit`` / ``ZEPHON_CACHE_LIMIT``, e.g. ``50G``; without one, a share of the
    disk's free space computed once per process, see
    :meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`) and the policy of
    ``cache_policy`` (default ``belady``); one instance per process and settings, shared by
    its threads.
    """
    s = settings or _settings.current()
    root = str(Path(s.cache_dir) / "node")
    key = (os.getpid(), root, s.cache_limit, s.cache_free_bytes, s.cache_policy)
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            try:
                cache = NodeCache(root, s.cache_limit_bytes(), s.cache_policy)
            except OSError as e:
                raise DataError(
                    f"node cache {root}: cannot use the directory ({e.strerror or e}); the "
                    "cache directory (ZEPHON_CACHE_DIR) must be writable with --cache-limit"
                ) from None
            cache.settings = s
            _SHARED[key] = cache
    return cache


def check_fits(largest: int, what: str, settings: Settings | None = None) -> None:
    """Refuse at start-up a node cache too small for the largest entry it must hold.

    Args:
        largest: Bytes of the largest shard read through the node cache (or a lower bound).
        what: That shard, for the message.
        settings: The settings (default: the current ones).

    Raises:
        DataError: Naming the shard, its size, the limit and where the limit comes from.
    """
    s = settings or _settings.current()
    limit = node_cache(s).limit_bytes
    if largest > limit:
        raise CacheFullError(
            f"node cache {Path(s.cache_dir) / 'node'}: {what} needs {largest} bytes, more than "
            f"its limit of {limit} bytes ({s.limit_source()}); free space on that disk, point "
            "ZEPHON_CACHE_DIR at a larger one or set a larger --cache-limit"
        )


class _Prefetcher:
    """Background thread fetching the next keys of a cache's future (bounded, stoppable)."""

    def __init__(
        self, cache: NodeCache, resolve: Callable[[str], tuple[int, Fetch]], depth: int
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
        with self._cond:
            self._dirty = True
            self._cond.notify()

    def stop(self) -> None:
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
            for name in self.cache._upcoming(self.depth):
                if self._stop:
                    return
                if (self.cache.root / "data" / name).exists():
                    continue
                key = self.cache._keys.get(name, name)
                try:
                    size, fetch = self.resolve(key)
                    if self.cache._ahead_bytes() + size > self.cache.limit_bytes // 4:
                        break  # a quarter of the cache at most waits for its first use
                    self.cache._acquire(key, name, size, fetch, prefetch=True)
                except Exception as exc:  # the foreground open will fetch and report it
                    self.error = exc
                    break
