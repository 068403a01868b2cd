"""The token store: tokenized work items on the node's disk, shared by every rank and run.

An entry holds the token ids of one work item's documents (after parse and tokenize), their
lengths and the records skipped on the way, under a key that the caller computes from what
determines them (see :mod:`zephon_nodes.operators.tokencache`). The store knows nothing of
tokenizers: it keeps bytes, bounded, checked.

Entries live in a :class:`~zephon_nodes.io.nodecache.cache.NodeCache` rooted at
``$ZEPHON_CACHE_DIR/tokens`` with the ``"lru"`` policy, so they get its coordination between
processes for free: a global lock around every decision, a per-key exclusive lock while an
entry is written (a key wanted by several ranks at once is written once; the others wait and
read it), writes into ``part/`` renamed into ``data/`` atomically, entries pinned while read,
and the size limit with eviction of unpinned entries.

Entry layout (little-endian; no pickle)::

    "ZTOK" 02 00 00 00            magic and format version (8 bytes)
    u32 header length, u32 0, u64 xxh3_64 of the header
    header: JSON {"key", "docs", "tokens", "dtype" ("<u2" | "<u4" | "<i4"),
                  "ldtype" ("<u4" | "<i8"), "skipped", "cpu_ns", "lengths_xxh", "tokens_xxh"}
    zero padding to a multiple of 8, the lengths, zero padding to 8, the token ids

Tokens are stored as uint16 when every id fits (vocabularies up to 65,536), else uint32. A
read memory-maps the file and checks the header's and each section's xxh3-64 before a byte is
served, and that the header's key is the key asked for: entries swapped, copied over one
another or renamed are refused, and so are entries of version 1 (they had no key). A damaged
entry (a directory or an unreadable file where one should be included) raises
:class:`DamagedEntry` and the caller drops, counts and recomputes it.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from zephon_nodes.core.environment import is_location
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import current, update
from zephon_nodes.io.nodecache.cache import NodeCache
from zephon_nodes.io.nodecache.entries import CacheFullError
from zephon_nodes.io.nodecache.policies import Policy
from zephon_nodes.io.nodecache.sharedtokens import SharedTokens
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import cache_dir

__all__ = [
    "DEFAULT_LIMIT",
    "ENABLED_ENV",
    "LIMIT_ENV",
    "DamagedEntry",
    "Entry",
    "TokenStore",
    "clear",
    "read_entry",
    "set_token_cache",
    "token_cache_settings",
    "token_store",
    "write_entry",
]

ENABLED_ENV = "ZEPHON_TOKEN_CACHE"
LIMIT_ENV = "ZEPHON_TOKEN_CACHE_LIMIT"
# The default size limit when the cache is on and no limit is given.
DEFAULT_LIMIT = "16G"

# Eviction order of the store (see docs/storage.md, "The token cache": chosen by
# benchmarks/token_cache.py --eviction).
POLICY: Policy = "lru"

_MAGIC = b"ZTOK\x02\x00\x00\x00"
_PREFIX = struct.Struct("<8sIIQ")


class DamagedEntry(Exception):
    """An entry whose bytes do not match its checksums (never served)."""


@dataclass(frozen=True)
class Entry:
    """One work item's tokenized documents.

    Attributes:
        tokens: Every document's ids, concatenated (int32).
        lengths: Tokens per document (int64).
        skipped: ``((reason, count), ...)`` records dropped by the parse.
        cpu_ns: CPU nanoseconds it took to compute (what a hit saves).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    skipped: tuple[tuple[str, int], ...] = ()
    cpu_ns: int = 0


def _pad(n: int) -> int:
    return -n % 8


def _token_dtype(tokens: np.ndarray) -> str:
    if not len(tokens):
        return "<u2"
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0:
        return "<i4"
    return "<u2" if hi < 1 << 16 else "<u4"


def write_entry(f: Any, entry: Entry, key: str) -> int:
    """Write ``entry``, the entry of ``key``, to the binary file ``f``; return the bytes written."""
    tokens = np.asarray(entry.tokens)
    lengths = np.asarray(entry.lengths, dtype=np.int64)
    tbytes = tokens.astype(_token_dtype(tokens)).tobytes()
    big = bool(len(lengths)) and int(lengths.max()) >= 1 << 32
    ldtype = "<i8" if big else "<u4"
    lbytes = lengths.astype(ldtype).tobytes()
    header = json.dumps(
        {
            "key": key,
            "docs": len(lengths),
            "tokens": len(tokens),
            "dtype": _token_dtype(tokens),
            "ldtype": ldtype,
            "skipped": [list(s) for s in entry.skipped],
            "cpu_ns": int(entry.cpu_ns),
            "lengths_xxh": xxhash.xxh3_64_hexdigest(lbytes),
            "tokens_xxh": xxhash.xxh3_64_hexdigest(tbytes),
        },
        sort_keys=True,
    ).encode()
    head = _PREFIX.pack(_MAGIC, len(header), 0, xxhash.xxh3_64_intdigest(header)) + header
    parts = [head, b"\0" * _pad(len(head)), lbytes, b"\0" * _pad(len(lbytes)), tbytes]
    for p in parts:
        f.write(p)
    return sum(len(p) for p in parts)


def _header(buf: Any, where: str) -> tuple[dict[str, Any], int]:
    if len(buf) < _PREFIX.size:
        raise DamagedEntry(f"{where}: truncated ({len(buf)} bytes)")
    magic, hlen, _, hsum = _PREFIX.unpack_from(buf, 0)
    if magic != _MAGIC:
        raise DamagedEntry(f"{where}: not a token-cache entry of this version")
    raw = bytes(buf[_PREFIX.size : _PREFIX.size + hlen])
    if len(raw) != hlen or xxhash.xxh3_64_intdigest(raw) != hsum:
        raise DamagedEntry(f"{where}: the header does not match its checksum")
    head = _PREFIX.size + hlen
    return json.loads(raw), head + _pad(head)


def _section(buf: Any, off: int, dtype: str, count: int, checksum: str, where: str) -> Any:
    size = np.dtype(dtype).itemsize * count
    view = memoryview(buf)[off : off + size]
    if len(view) != size or xxhash.xxh3_64_hexdigest(view) != checksum:
        raise DamagedEntry(f"{where}: a section does not match its checksum")
    return np.frombuffer(view, dtype=dtype, count=count)


def read_entry(path: Path, key: str, lengths_only: bool = False) -> Entry:
    """Read (memory-mapped) and check the entry of ``key``; ``lengths_only`` leaves the tokens.

    Raises:
        DamagedEntry: A checksum, the magic, the key or a size does not match, or the path
            is not a readable file.
    """
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise DamagedEntry(f"{path}: empty")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:  # a directory, or unreadable: never served, dropped and remade
        raise DamagedEntry(f"{path}: not a readable entry ({e.strerror or e})") from None
    try:
        return _parse(mm, str(path), key, lengths_only)
    except (KeyError, ValueError, TypeError) as e:
        raise DamagedEntry(f"{path}: unreadable header ({e})") from None
    finally:
        with contextlib.suppress(BufferError):  # a view still held by a traceback: GC closes it
            mm.close()


def _parse(mm: Any, where: str, key: str, lengths_only: bool) -> Entry:
    head, off = _header(mm, where)
    if head.get("key") != key:
        raise DamagedEntry(f"{where}: written for another key ({head.get('key')!r}, not {key!r})")
    n, ldt = int(head["docs"]), str(head["ldtype"])
    lengths = _section(mm, off, ldt, n, head["lengths_xxh"], where).astype(np.int64)
    if int(lengths.sum()) != int(head["tokens"]):
        raise DamagedEntry(f"{where}: lengths do not add up to the token count")
    skipped = tuple((str(r), int(c)) for r, c in head["skipped"])
    if lengths_only:
        return Entry(np.empty(0, np.int32), lengths, skipped, int(head["cpu_ns"]))
    off += n * np.dtype(ldt).itemsize
    off += _pad(off)
    m = int(head["tokens"])
    # A copy (int32, as the tokenizer gives): the map is closed after this returns.
    tokens = _section(mm, off, str(head["dtype"]), m, head["tokens_xxh"], where).astype(np.int32)
    return Entry(tokens, lengths, skipped, int(head["cpu_ns"]))


def _damaged(path: Path, key: str) -> bool:
    """Whether the entry of ``key`` at ``path`` fails its checks (read afresh)."""
    try:
        read_entry(path, key)
    except DamagedEntry:
        return True
    return False


class _Absent(Exception):
    """Raised inside a probe's fetch: the key is not stored and is not to be computed."""


class TokenStore:
    """Bounded, checked, shared store of tokenized work items (one directory per node).

    Args:
        root: Its directory (``$ZEPHON_CACHE_DIR/tokens`` by default).
        limit_bytes: Most bytes its entries may take; the least recently used unpinned
            entries are evicted first.
        policy: The node cache's eviction policy (default :data:`POLICY`, ``"lru"``).
        shared: A folder shared by a cluster, behind this one (see
            :mod:`zephon_nodes.io.nodecache.sharedtokens`); None: node-local only.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        limit_bytes: int,
        policy: Policy | None = None,
        shared: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.cache = NodeCache(self.root, limit_bytes, policy or POLICY)
        self.shared = SharedTokens(shared) if shared else None
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            (
                "damaged",
                "cpu_ns_saved",
                "tokens_served",
                "uncached",
                "shared_hits",
                "shared_writes",
            ),
            0,
        )
        self.write_error: str | None = None  # set at the first failed write: stores no more
        self._bad_shared: set[str] = set()  # keys whose shared entry was found damaged

    def get(self, key: str, compute: Callable[[], Entry]) -> Entry:
        """Return the entry of ``key``, computing and storing it on a miss.

        A damaged entry is dropped, counted and recomputed; an entry larger than the whole
        limit is computed and returned without being stored. A write that fails (a full or
        read-only disk) warns once, in one line, and the store stores nothing more in this
        process: the run goes on uncached.
        """
        if self.write_error is not None:
            return self._uncached(compute)
        for _ in range(2):
            made: list[Entry] = []

            def fetch(dest: Path, made: list[Entry] = made) -> None:
                if self._pull_into(key, dest):
                    return
                entry = compute()
                made.append(entry)
                with open(dest, "wb") as f:
                    write_entry(f, entry, key)
                self._push(key, dest)

            try:
                with self.cache.open(key, 0, fetch) as path:
                    if made:
                        return made[0]
                    entry = read_entry(path, key)
            except CacheFullError:
                self._count("uncached", 1)
                return made[0] if made else compute()
            except OSError as e:
                self._write_failed(e)
                return made[0] if made else self._uncached(compute)
            except DamagedEntry:
                self._drop_damaged(key)
                continue
            self._served(entry)
            return entry
        self._count("uncached", 1)
        return compute()  # damaged again (another reader holds it pinned): serve fresh ids

    def _uncached(self, compute: Callable[[], Entry]) -> Entry:
        self._count("uncached", 1)
        return compute()

    def _write_failed(self, error: OSError) -> None:
        """Warn once (one line) that the store cannot be written; store nothing more."""
        with self._lock:
            if self.write_error is not None:
                return
            self.write_error = f"{error.strerror or error}"
        print(
            f"zephon: warning: token cache {self.root}: cannot write an entry "
            f"({self.write_error}); this process goes on without storing tokenized items "
            "(free space there or set ZEPHON_CACHE_DIR)",
            file=sys.stderr,
        )

    def pull(self, key: str) -> bool:
        """Bring ``key``'s shared entry into this node's cache; whether it is there now.

        False without a shared folder, when it lacks the key or its entry is damaged
        (counted), and when this node's cache cannot take it.
        """
        if self.shared is None or self.write_error is not None:
            return False

        def fetch(dest: Path) -> None:
            if not self._pull_into(key, dest):
                raise _Absent

        try:
            with self.cache.open(key, 0, fetch):
                return True
        except (_Absent, CacheFullError):
            return False
        except OSError as e:
            self._write_failed(e)
            return False

    def _pull_into(self, key: str, dest: Path) -> bool:
        """Write the shared entry of ``key`` to ``dest`` once it is checked; whether it was."""
        if key in self._bad_shared:
            return False
        blob = self._shared("read", key)
        if blob is None:
            return False
        try:
            _parse(blob, f"shared token-cache entry {key}", key, lengths_only=False)
        except (DamagedEntry, KeyError, ValueError, TypeError, struct.error):
            # Never served, and not read again by this process; computed here (the shared
            # entry stays: a create-only store keeps the first write).
            with self._lock:
                self._bad_shared.add(key)
            self._count("damaged", 1)
            return False
        with open(dest, "wb") as f:
            f.write(blob)
        self._count("shared_hits", 1)
        return True

    def _push(self, key: str, dest: Path) -> None:
        """Offer a computed entry to the shared folder (kept only if it is the first)."""
        if self.shared is not None and self._shared("write", key, dest.read_bytes()):
            self._count("shared_writes", 1)

    def _shared(self, action: str, *args: Any) -> Any:
        """Call the shared folder; an error is said once and the node goes on alone."""
        shared = self.shared
        if shared is None:
            return None
        try:
            return getattr(shared, action)(*args)
        except Exception as e:  # an outage or permissions: the run never depends on it
            self.shared = None
            print(
                f"zephon: warning: shared token cache {storage.redact(shared.location)}: "
                f"cannot {action} ({type(e).__name__}: {e}); this process goes on with the "
                "node's own token cache",
                file=sys.stderr,
            )
            return None

    def lengths(self, key: str) -> Entry | None:
        """Return ``key``'s entry without its tokens (lengths and skips), or None if absent.

        Nothing is computed; a damaged entry is dropped, counted and reported absent.
        """

        def fetch(dest: Path) -> None:
            raise _Absent

        if not self.cache.contains(key) and not self.pull(key):
            return None
        for _ in range(2):
            try:
                with self.cache.open(key, 0, fetch) as path:
                    entry = read_entry(path, key, lengths_only=True)
            except _Absent:
                return None
            except DamagedEntry:
                self._drop_damaged(key)
                continue
            self._count("cpu_ns_saved", entry.cpu_ns)
            return entry
        return None

    def _drop_damaged(self, key: str) -> None:
        """Drop ``key``'s entry, found damaged, if it still is once no reader pins it.

        Another process (or thread) that found it damaged too may have dropped it and stored
        a sound one meanwhile: that one is kept, and the damaged entry is counted once, by
        whoever removed it.
        """
        if self.cache.discard_if(key, lambda path: _damaged(path, key)):
            self._count("damaged", 1)

    def _served(self, entry: Entry) -> None:
        with self._lock:
            self._counts["cpu_ns_saved"] += entry.cpu_ns
            self._counts["tokens_served"] += len(entry.tokens)

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._counts[key] += n

    def stats(self) -> dict[str, int]:
        """This process's counters (JSON-safe).

        Keys: hits, misses, bytes_read, bytes_written, evictions, damaged (entries dropped
        by their checksum), uncached (computed but not stored), tokens_served, cpu_ns_saved
        (what the hits had cost to compute), shared_hits (entries taken from the shared
        folder), shared_writes (entries this process wrote there first), limit_bytes.
        """
        node = self.cache.stats()
        with self._lock:
            out = dict(self._counts)
        out.update(
            hits=node["hits"],
            misses=node["misses"],
            bytes_read=node["bytes_read"],
            bytes_written=node["bytes_fetched"],
            evictions=node["evictions"],
            limit_bytes=node["limit_bytes"],
        )
        return out

    def usage(self) -> tuple[int, int]:
        """Return ``(entries, bytes)`` stored now."""
        n = total = 0
        for e in os.scandir(self.root / "data"):
            with contextlib.suppress(FileNotFoundError):
                total += e.stat().st_size
                n += 1
        return n, total


def token_cache_settings() -> tuple[bool, int]:
    """Return ``(enabled, limit_bytes)`` of the settings that apply (``core.settings``).

    From ``ZEPHON_TOKEN_CACHE`` (``on``/``off``, default off) and ``ZEPHON_TOKEN_CACHE_LIMIT``
    (a byte size, default 16 GiB), or ``--token-cache`` / ``--token-cache-limit``.
    """
    settings = current()
    return settings.token_cache, settings.token_cache_limit


def shared_location() -> str | None:
    """The shared folder behind this node's token cache, if any (``token_cache_shared``)."""
    return current().token_cache_shared


def set_token_cache(enabled: bool | str | None = None, limit: str | int | None = None) -> None:
    """Turn the token cache on or off and set its limit for this process and its workers.

    Args:
        enabled: True/``"on"``, False/``"off"``, or a shared folder's URI (on, with that
            folder behind this node's cache); None leaves it as it is.
        limit: A byte size (``"16G"``, an int); None leaves it as it is.

    Raises:
        RecipeError: A value is not understood.
    """
    if (
        isinstance(enabled, str)
        and enabled.strip().lower() not in ("on", "off")
        and not is_location(enabled)
    ):
        raise RecipeError(f"--token-cache should be 'on', 'off' or a storage URI, got {enabled!r}")
    changes: dict[str, object] = {}
    if enabled is not None:
        changes["token_cache"] = enabled
    if limit is not None:
        changes["token_cache_limit"] = limit
    if changes:
        update(**changes)


def default_root() -> Path:
    """The token cache's directory: ``tokens`` in the node's cache directory."""
    return cache_dir() / "tokens"


_STORES: dict[tuple[int, str, int, str], TokenStore] = {}
_STORES_LOCK = threading.Lock()


def token_store(
    root: str | None = None, limit_bytes: int | None = None, shared: str | None = None
) -> TokenStore:
    """This process's store for ``root``, ``limit_bytes`` and a ``shared`` folder.

    Defaults: the settings' root and limit; no shared folder.
    """
    if root is None:
        root = str(default_root())
    if limit_bytes is None:
        limit_bytes = token_cache_settings()[1]
    key = (os.getpid(), root, int(limit_bytes), shared or "")
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = TokenStore(root, int(limit_bytes), shared=shared)
            _STORES[key] = store
    return store


def clear(root: str | os.PathLike[str] | None = None) -> int:
    """Remove every entry nobody is reading now; return how many were removed.

    A limit of 0 on the node cache's own eviction, under its locks: a running job's reads
    stay safe (an entry it pins stays; one it wants again is recomputed).
    """
    path = Path(root) if root is not None else default_root()
    if not (path / "data").is_dir():
        return 0
    before = sum(1 for _ in os.scandir(path / "data"))
    NodeCache(path, 0, "lru").close()
    return before - sum(1 for _ in os.scandir(path / "data"))


def process_stats() -> dict[str, int]:
    """The counters of every store this process opened, added up (empty if none)."""
    with _STORES_LOCK:
        stores = [s for k, s in _STORES.items() if k[0] == os.getpid()]
    out: dict[str, int] = {}
    for s in stores:
        for k, v in s.stats().items():
            out[k] = v if k == "limit_bytes" else out.get(k, 0) + v
    return out


def now_cpu_ns() -> int:
    """CPU time of the calling thread (what computing an entry costs)."""
    return time.thread_time_ns()
