"""Shards read whole (single-frame ``.zst``) go through the bounded node cache.

A single-frame ``.jsonl.zst`` cannot be read in part: its decompressed copy is made on first
use. :func:`route_whole_shards` wraps such shards in :class:`NodeCachedShard`, whose
decompressed copy is an entry of the node cache: fetched once per node, pinned while a work
item reads it, evicted by the exact future (see :mod:`zephon_nodes.io.nodecache.cache`).
The node cache is always bounded: by ``--cache-limit`` / ``ZEPHON_CACHE_LIMIT``, else by a
share of its disk's free space
(:meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`), and
:func:`check_whole_shards_fit` refuses at start-up a cache too small for the largest such
shard. The small record index stays in the ordinary cache. Bytes read are the same either
way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.formats.shards import FileShard
from zephon_nodes.io.nodecache.nodecache import check_fits, node_cache
from zephon_nodes.io.storage.cache import atomic_write

__all__ = ["NodeCachedShard", "check_whole_shards_fit", "open_whole_shard", "route_whole_shards"]


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
        from zephon_nodes.io.formats.shards import _check_same, _decompress_to, _index_file
        from zephon_nodes.io.storage import storage
        from zephon_nodes.io.storage.checksum import file_checksum

        s = self.shard

        def decompress(src: Path) -> None:
            from zephon_nodes.io.storage.checksum import Hasher

            hasher = Hasher()  # the copy is of the checksummed content, whatever was trusted
            try:
                with open(dest, "wb") as f:
                    _decompress_to(src, f, hasher)
            except DataError as e:
                raise DataError(f"{s.path}: {str(e).partition(': ')[2]}", kind=e.kind) from None
            _check_same(s, hasher.hexdigest())

        if storage.is_remote(s.uri):
            from zephon_nodes.io.storage.remote import fetched

            with fetched(s.uri, storage.stat(s.uri)) as (tmp, checksum):
                _check_same(s, checksum)
                decompress(tmp)
        else:
            local = Path(storage.local_path(s.uri))
            _check_same(s, file_checksum(local))
            decompress(local)
        from zephon_nodes.io.formats.copies import load_index
        from zephon_nodes.io.formats.entrysums import BadEntry, write_sums

        index_path = self._index(dest)
        try:
            index = load_index(index_path)
        except BadEntry:  # no sums yet, or an index not of this copy: made from it now
            index = _index_file(dest)
            atomic_write(Path(index_path), lambda f: np.save(f, index, allow_pickle=False))
        write_sums(dest, index, index_path)  # the copy is of the checksummed content
        from zephon_nodes.io.formats.copies import forget_index

        forget_index(index_path)

    def _index(self, data: Path) -> str:
        """The record index of the decompressed copy (built once, kept in the usual cache)."""
        from zephon_nodes.io.formats.shards import _artifacts, _index_file

        index_path = _artifacts(self.shard.checksum)[1]
        if not index_path.exists():
            index = _index_file(data)
            atomic_write(index_path, lambda f: np.save(f, index, allow_pickle=False))
        return str(index_path)

    def _with_copy(self, fn: Any) -> Any:
        from zephon_nodes.io.formats.entrysums import BadEntry, count_bad, drop, sums_path

        cache = node_cache()
        if cache is None:  # no limit (any more): the shard's own, unbounded copy
            return fn(self.shard)
        for attempt in (0, 1):
            try:
                with cache.open(self.cache_key, self.cache_size, self.cache_fetch) as local:
                    local_shard = dataclasses.replace(
                        self.shard, data_path=str(local), index_path=self._index(local)
                    )
                    return fn(local_shard)
            except BadEntry:
                if attempt:
                    raise
                # A damaged entry (or one without sums): dropped, fetched again, counted.
                from zephon_nodes.io.formats.copies import forget_index
                from zephon_nodes.io.formats.shards import _artifacts

                count_bad()
                index_path = _artifacts(self.shard.checksum)[1]
                drop(index_path, sums_path(index_path))
                forget_index(str(index_path))
                cache.discard(self.cache_key)
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


def _whole(shard: Any) -> bool:
    """Whether ``shard`` is read whole: a ``.zst`` from an index, not yet decompressed."""
    return (
        isinstance(shard, FileShard)
        and not shard.index_path
        and not shard.every
        and not getattr(shard, "frames", ())
        and bool(shard.checksum)
    )


def route_whole_shards(
    datasets: Sequence[Dataset], settings: Settings | None = None
) -> list[Dataset]:
    """Wrap the shards read whole in :class:`NodeCachedShard`; check the node cache holds one.

    Raises:
        CacheFullError: The node cache's limit is smaller than the largest shard read whole
            (see :func:`check_whole_shards_fit`).
    """
    out = []
    for d in datasets:
        if hasattr(d.shards, "whole"):
            out.append(d)  # LazyShards route each shard when they open it
            continue
        if not any(_whole(s) for s in d.shards):
            out.append(d)
            continue
        shards: tuple[Any, ...] = tuple(
            NodeCachedShard(s) if isinstance(s, FileShard) and _whole(s) else s for s in d.shards
        )
        out.append(Dataset(d.name, d.text_field, shards, d.chunk_size))
    check_whole_shards_fit(out, settings)
    return out


def check_whole_shards_fit(datasets: Sequence[Dataset], settings: Settings | None = None) -> None:
    """Refuse, at start-up, a node cache smaller than the largest shard read whole.

    The decompressed size of a shard opened here is known; for one listed by a dataset index
    its compressed size is the lower bound checked (the decompressed copy is larger).

    Raises:
        CacheFullError: Naming the shard, the bytes it needs, the limit and its source.
    """
    from zephon_nodes.io.index.lazyshards import LazyShards
    from zephon_nodes.io.index.table import KINDS

    largest, what = 0, ""
    for d in datasets:
        if isinstance(d.shards, LazyShards):
            sizes = d.shards.files.table.sizes[d.shards.files.rows]
            whole = (d.shards.kinds == KINDS.index("jsonl.zst")) & (d.shards.frames < 2)
            if np.any(whole):
                k = int(np.argmax(np.where(whole, sizes, -1)))
                if int(sizes[k]) > largest:
                    uri = d.shards.files.table.uri(int(d.shards.files.rows[k]))
                    largest, what = int(sizes[k]), f"shard {uri} (at least; compressed)"
            continue
        for s in d.shards:
            if isinstance(s, NodeCachedShard) and s.cache_size > largest:
                largest, what = s.cache_size, f"shard {s.path} (decompressed)"
    if largest:
        check_fits(largest, what, settings)


class _LineCounter:
    """A file-like sink that finds record byte ranges in a stream (as ``_index_file``)."""

    def __init__(self) -> None:
        self.size = 0
        self.newlines: list[np.ndarray] = []
        self.cr_before: list[np.ndarray] = []  # per newline: the byte before it is "\r"
        self.last = -1

    def write(self, block: bytes) -> int:
        arr = np.frombuffer(block, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        before = np.where(nl > 0, arr[np.maximum(nl - 1, 0)], self.last)
        self.newlines.append(nl.astype(np.int64) + self.size)
        self.cr_before.append(before == 13)
        if len(arr):
            self.last = int(arr[-1])
            self.size += len(arr)
        return len(block)

    def index(self) -> np.ndarray:
        """``(n, 2)`` start and end offsets of the non-blank lines."""
        nl = np.concatenate(self.newlines) if self.newlines else np.zeros(0, np.int64)
        cr = np.concatenate(self.cr_before) if self.cr_before else np.zeros(0, bool)
        starts = np.concatenate([[0], nl + 1])
        ends = np.concatenate([nl, [self.size]])
        # A line is "\r" alone when it is one byte long and that byte is "\r".
        lone_cr = np.concatenate([cr, [self.last == 13]]) & (ends - starts == 1)
        keep = (ends > starts) & ~lone_cr
        return np.stack([starts[keep], ends[keep]], axis=1).astype(np.int64)


def open_whole_shard(uri: str) -> NodeCachedShard:
    """Open a ``.jsonl.zst`` that has no dataset index, under a node-cache limit.

    The shard is hashed and decompressed once as a stream to count its records (its small
    record index is kept in the ordinary cache, keyed by its checksum, so a later build
    reads nothing); the decompressed copy is never kept outside the node cache, which makes
    it again when a work item reads the shard. A remote shard is fetched for this once.

    Raises:
        DataError: A missing, unreadable, corrupt or truncated shard (naming it).
    """
    from zephon_nodes.io.formats.copies import forget_index
    from zephon_nodes.io.formats.entrysums import BadEntry, count_bad, drop, sums_path
    from zephon_nodes.io.formats.shards import _artifacts, _decompress_to, _load_index
    from zephon_nodes.io.storage import storage
    from zephon_nodes.io.storage.checksum import file_checksum

    def counted(src: Path, checksum: str) -> tuple[np.ndarray, int]:
        size_path = _artifacts(checksum)[1].with_suffix(".size")
        index_path = _artifacts(checksum)[1]
        if index_path.exists() and size_path.exists():
            try:
                return _load_index(str(index_path)), int(size_path.read_text())
            except (BadEntry, ValueError):
                # A damaged record index (or one without its sums): dropped, made again,
                # counted; never used.
                count_bad()
                drop(index_path, sums_path(index_path), size_path)
                forget_index(str(index_path))
        counter = _LineCounter()
        try:
            _decompress_to(src, counter)
        except DataError as e:
            raise DataError(
                f"{storage.redact(uri)}: {str(e).partition(': ')[2]}", kind=e.kind
            ) from None
        index = counter.index()
        atomic_write(index_path, lambda f: np.save(f, index, allow_pickle=False))
        atomic_write(size_path, lambda f: f.write(str(counter.size).encode()))
        return index, counter.size

    st = storage.stat(uri)
    if storage.is_remote(uri):
        from zephon_nodes.io.storage.remote import fetched, known_checksum

        checksum = known_checksum(uri, st)
        ready = checksum is not None and _artifacts(checksum)[1].with_suffix(".size").exists()
        if checksum is not None and ready:
            index, plain = counted(Path(), checksum)
        else:
            with fetched(uri, st) as (tmp, checksum):
                index, plain = counted(tmp, checksum)
    else:
        local = Path(storage.local_path(uri))
        checksum = file_checksum(local)
        index, plain = counted(local, checksum)
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
