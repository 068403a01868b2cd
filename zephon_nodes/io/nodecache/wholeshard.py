"""Shards read whole (single-frame ``.zst``) go through the bounded node cache.

A single-frame ``.jsonl.zst`` cannot be read in part: its decompressed copy is made on first
use. :func:`route_whole_shards` wraps such shards in :class:`NodeCachedShard`, whose
decompressed copy is an entry of the node cache: fetched once per node, pinned while a work
item reads it, evicted by the exact future (see :mod:`zephon_nodes.io.nodecache.cache`).
The node cache is always bounded: by ``--cache-limit`` / ``ZEPHON_CACHE_LIMIT``, else by a
share of its disk's free space
(:meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`), and
:func:`check_whole_shards_fit` refuses at start-up a cache too small for the largest such
shard. The small record index stays in the ordinary cache, with its sums (the entry's key,
the text's size, see :mod:`zephon_nodes.io.formats.entrysums`). Bytes read are the same
either way.

An entry that fails its sums (damaged, without sums, with sums of an older cache or of
another key) is never served: its reader waits until no other reader pins it, checks it
whole against its sums read afresh (another reader may have made it again meanwhile) and,
if it still fails, drops it with its record index and sums, counts one
``bad_cache_entries`` and fetches it again; the entry's other readers then read the new
copy. The record index and its sums are written and dropped under the entry's file lock
(``K.lock``, as :func:`~zephon_nodes.io.formats.copies.remake` takes it): a node's processes
share the cache directory, so a bad kept index is checked again inside it, dropped and counted
once, and no reader drops or overwrites the index and sums another has just written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings
from zephon_nodes.io.formats.copies import (
    artifacts,
    entry_locked,
    forget_index,
    load_index,
    sound,
)
from zephon_nodes.io.formats.entrysums import (
    BadEntry,
    count_bad,
    drop,
    recorded_size,
    sums_path,
    write_sums,
)
from zephon_nodes.io.formats.lines import LineCounter, decompress_to, index_file
from zephon_nodes.io.formats.shards import FileShard, check_same
from zephon_nodes.io.nodecache.nodecache import check_fits, node_cache
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import atomic_write
from zephon_nodes.io.storage.checksum import Hasher, file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = [
    "NodeCachedShard",
    "check_whole_shards_fit",
    "open_whole_shard",
    "read_whole",
    "route_whole_shards",
]

D = TypeVar("D")
_ATTEMPTS = 3  # reads of a shard whose node-cache entry is found damaged (then made again)


@dataclass(frozen=True)
class NodeCachedShard:
    """A single-frame ``.zst`` shard whose decompressed copy lives in the node cache.

    Attributes:
        shard: The shard (opened from a dataset index, or indexed by
            :func:`open_whole_shard`; not decompressed).
        plain_size: Bytes of the decompressed copy, when known (else its records' end).
    """

    shard: FileShard
    plain_size: int = 0

    @property
    def path(self) -> str:
        """The shard as named by the recipe."""
        return self.shard.path

    @property
    def num_records(self) -> int:
        """Number of records."""
        return self.shard.num_records

    @property
    def checksum(self) -> str:
        """The shard file's content checksum."""
        return self.shard.checksum

    @property
    def cache_key(self) -> str:
        """The node-cache key: the shard's content checksum."""
        algo, _, digest = self.shard.checksum.partition(":")
        return f"zst-{algo}-{digest[:40]}"

    @property
    def cache_size(self) -> int:
        """Bytes reserved for the decompressed copy (its records end at ``shard.end``)."""
        return self.plain_size or self.shard.end + 1

    def cache_fetch(self, dest: Path) -> None:
        """Fetch (if remote), check the checksum and decompress the shard into ``dest``."""
        s = self.shard

        def decompress(src: Path) -> None:
            hasher = Hasher()  # the copy is of the checksummed content, whatever was trusted
            try:
                with open(dest, "wb") as f:
                    decompress_to(src, f, hasher)
            except DataError as e:
                raise DataError(f"{s.path}: {str(e).partition(': ')[2]}", kind=e.kind) from None
            check_same(s, hasher.hexdigest())

        if storage.is_remote(s.uri):
            with fetched(s.uri, storage.stat(s.uri), indexed=True) as (tmp, checksum):
                check_same(s, checksum)
                decompress(tmp)
        else:
            local = Path(storage.local_path(s.uri))
            check_same(s, file_checksum(local))
            decompress(local)
        index_path = str(artifacts(s.checksum)[1])
        with entry_locked(s.checksum):  # no other process drops or writes the index meanwhile
            forget_index(index_path)  # as on disk now: another process may have dropped it
            try:
                index = load_index(index_path)  # kept when the shard was opened
            except BadEntry:  # dropped with a bad copy, or never made: made from the copy now
                index = index_file(dest)
                atomic_write(Path(index_path), lambda f: np.save(f, index, allow_pickle=False))
            write_sums(dest, index, index_path)  # the copy is of the checksummed content
            forget_index(index_path)

    def _with_copy(self, fn: Any) -> Any:
        cache = node_cache()
        if cache is None:  # no limit (any more): the shard's own, unbounded copy
            return fn(self.shard)
        checksum = self.shard.checksum
        index_path = str(artifacts(checksum)[1])
        for attempt in range(_ATTEMPTS):
            try:
                with cache.open(self.cache_key, self.cache_size, self.cache_fetch) as local:
                    local_shard = dataclasses.replace(
                        self.shard, data_path=str(local), index_path=index_path
                    )
                    return fn(local_shard)
            except BadEntry:
                if attempt == _ATTEMPTS - 1:
                    raise
                # A damaged entry (or one without sums, of an older cache or of another key):
                # dropped once no other reader pins it, fetched again, counted once; other
                # readers of it find it made again.
                if cache.discard_if(self.cache_key, lambda p: _damaged(p, checksum)):
                    count_bad()
        raise AssertionError("unreachable")

    def read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Return records ``[start, stop)`` as ``(record number, raw line)`` pairs."""
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: records [{start}, {stop}) out of range")
        if start == stop:
            return []
        rows: list[tuple[int, bytes]] = self._with_copy(lambda s: s.read(start, stop))
        return rows

    def where(self, record: int) -> str:
        """Describe a record's place for error messages: ``path:line``."""
        text: str = self._with_copy(lambda s: s.where(record))
        return text


def read_whole(shard: Any) -> bool:
    """Whether ``shard`` is read whole: a ``.zst`` from an index, not yet decompressed."""
    return (
        isinstance(shard, FileShard)
        and not shard.index_path
        and not shard.every
        and not getattr(shard, "frames", ())
        and bool(shard.checksum)
    )


def route_whole_shards(datasets: Sequence[D], settings: Settings | None = None) -> list[D]:
    """Wrap the shards read whole in :class:`NodeCachedShard`; check the node cache holds one.

    Args:
        datasets: :class:`~zephon_nodes.io.dataset.Dataset` objects (their ``shards`` from a
            dataset index are routed as each is opened).
        settings: The settings the node cache's limit is read from (None: the current ones).

    Raises:
        CacheFullError: The node cache's limit is smaller than the largest shard read whole
            (see :func:`check_whole_shards_fit`).
    """
    out: list[D] = []
    for d in datasets:
        shards: Any = getattr(d, "shards")  # noqa: B009 - any dataset type (see Args)
        if hasattr(shards, "whole") or not any(read_whole(s) for s in shards):
            out.append(d)  # LazyShards route each shard when they open it
            continue
        routed = tuple(NodeCachedShard(s) if read_whole(s) else s for s in shards)
        out.append(dataclasses.replace(d, shards=routed))  # type: ignore[type-var]
    check_whole_shards_fit(out, settings)
    return out


def check_whole_shards_fit(datasets: Sequence[Any], settings: Settings | None = None) -> None:
    """Refuse, at start-up, a node cache smaller than the largest shard read whole.

    The decompressed size of a shard opened here is known; for one listed by a dataset index
    its compressed size is the lower bound checked (the decompressed copy is larger).

    Raises:
        CacheFullError: Naming the shard, the bytes it needs, the limit and its source.
    """
    largest, what = 0, ""
    for d in datasets:
        indexed = getattr(d.shards, "largest_whole", None)  # LazyShards: from the index
        if indexed is not None:
            found = indexed()
            if found is not None and found[0] > largest:
                largest, what = found[0], f"shard {found[1]} (at least; compressed)"
            continue
        for s in d.shards:
            if isinstance(s, NodeCachedShard) and s.cache_size > largest:
                largest, what = s.cache_size, f"shard {s.path} (decompressed)"
    if largest:
        check_fits(largest, what, settings)


def _damaged(copy: Path, checksum: str) -> bool:
    """Whether a node-cache copy or its record index fails its sums (then both are dropped).

    Judged under the entry's file lock, read afresh: another reader (of this node cache, or
    opening the shard) may have made the index again meanwhile, or be writing it.
    """
    index_path = str(artifacts(checksum)[1])
    with entry_locked(checksum):
        if sound(copy, index_path):
            return False
        drop(index_path, sums_path(index_path))
        forget_index(index_path)
    return True


def _kept(index_path: Path) -> tuple[np.ndarray, int] | None:
    """The record index kept at ``index_path`` and its text size; None if there is none.

    Raises:
        BadEntry: It is there but fails its sums (or has none).
    """
    if not (index_path.exists() or index_path.is_symlink()):
        return None
    return load_index(str(index_path)), recorded_size(str(index_path))


def _known_index(checksum: str) -> tuple[np.ndarray, int] | None:
    """The record index and text size kept for ``checksum``, if any (a bad one dropped).

    A damaged record index (or one of an older cache, or of another entry) is never used: it
    is checked again under the entry's file lock, and only if still bad dropped and counted
    (once, however many readers found it bad: a node's processes share the cache
    directory); the caller makes it again.
    """
    index_path = artifacts(checksum)[1]
    try:
        return _kept(index_path)
    except BadEntry:
        pass
    with entry_locked(checksum):
        forget_index(str(index_path))
        try:
            return _kept(index_path)  # made again, or dropped, meanwhile by another reader
        except BadEntry:
            pass
        count_bad()
        drop(index_path, sums_path(index_path), index_path.with_suffix(".size"))
        forget_index(str(index_path))
    return None


def _count(src: Path, checksum: str, uri: str) -> tuple[np.ndarray, int]:
    """Decompress ``src`` as a stream to index its records; keep the index and its sums.

    An index another reader kept meanwhile (checked under the entry's file lock) is used as
    it is: its sums may be those of the node cache's copy, which these would replace.
    """
    counter = LineCounter()
    try:
        decompress_to(src, counter)
    except DataError as e:
        raise DataError(
            f"{storage.redact(uri)}: {str(e).partition(': ')[2]}", kind=e.kind
        ) from None
    index = counter.index()
    index_path = artifacts(checksum)[1]
    with entry_locked(checksum):
        forget_index(str(index_path))
        with contextlib.suppress(BadEntry):  # a bad one is replaced (found bad by a caller)
            kept = _kept(index_path)
            if kept is not None:
                return kept
        write_sums(None, index, str(index_path), size=counter.size)
        atomic_write(index_path, lambda f: np.save(f, index, allow_pickle=False))
        forget_index(str(index_path))
    return index, counter.size


def _remote_index(uri: str, st: storage.FileStat) -> tuple[str, tuple[np.ndarray, int]]:
    """A remote shard's checksum and record index: kept ones if the checksum is known."""
    checksum = known_checksum(uri, st)
    if checksum is not None:
        known = _known_index(checksum)
        if known is not None:
            return checksum, known
    with fetched(uri, st) as (tmp, fetched_checksum):
        return fetched_checksum, _count(tmp, fetched_checksum, uri)


def open_whole_shard(uri: str) -> NodeCachedShard:
    """Open a ``.jsonl.zst`` that has no dataset index, under a node-cache limit.

    The shard is hashed and decompressed once as a stream to count its records (its small
    record index is kept in the ordinary cache, keyed by its checksum, with the text's size
    in its sums, so a later build reads nothing); the decompressed copy is never kept
    outside the node cache, which makes it again when a work item reads the shard. A remote
    shard is fetched for this once.

    Raises:
        DataError: A missing, unreadable, corrupt or truncated shard (naming it).
    """
    st = storage.stat(uri)
    if storage.is_remote(uri):
        checksum, (index, plain) = _remote_index(uri, st)
    else:
        local = Path(storage.local_path(uri))
        checksum = file_checksum(local)
        index, plain = _known_index(checksum) or _count(local, checksum, uri)
    shard = FileShard(
        path=storage.redact(uri),
        data_path="",
        index_path="",
        num_records=int(index.shape[0]),
        checksum=checksum,
        size=st.size,
        uri=uri,
        end=int(index[-1, 1]) if len(index) else 0,
        version="" if storage.is_remote(uri) else st.version,
    )
    return NodeCachedShard(shard, plain_size=plain)
