"""Shards read whole (single-frame ``.zst``) go through the bounded node cache.

A single-frame ``.jsonl.zst`` cannot be read in part: its decompressed copy is made on first
use. Without a node-cache limit that copy stays in ``$ZEPHON_CACHE_DIR`` for good (see
:class:`~zephon_nodes.io.shards.FileShard`). With a limit (``ZEPHON_CACHE_LIMIT``,
``--cache-limit``), :func:`route_whole_shards` wraps such shards in :class:`NodeCachedShard`,
whose decompressed copy is an entry of the node cache: fetched once per node, pinned while a
work item reads it, evicted by the exact future (see :mod:`zephon_nodes.io.nodecache`). The
small record index stays in the ordinary cache. Bytes read are the same either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.errors import DataError
from zephon_nodes.io.cache import atomic_write
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.nodecache import node_cache
from zephon_nodes.io.shards import FileShard

__all__ = ["NodeCachedShard", "route_whole_shards"]


@dataclass(frozen=True)
class NodeCachedShard:
    """A single-frame ``.zst`` shard whose decompressed copy lives in the node cache.

    Attributes:
        shard: The shard (opened from a dataset index, not yet decompressed).
    """

    shard: FileShard

    @property
    def path(self) -> str:
        """The shard as named by the recipe."""
        return self.shard.path

    @property
    def num_records(self) -> int:
        """Number of records."""
        return self.shard.num_records

    @property
    def cache_key(self) -> str:
        """The node-cache key: the shard's content checksum."""
        algo, _, digest = self.shard.checksum.partition(":")
        return f"zst-{algo}-{digest[:40]}"

    @property
    def cache_size(self) -> int:
        """Bytes reserved for the decompressed copy (its records end at ``shard.end``)."""
        return self.shard.end + 1

    def cache_fetch(self, dest: Path) -> None:
        """Fetch (if remote), check the checksum and decompress the shard into ``dest``."""
        from zephon_nodes.io import storage
        from zephon_nodes.io.checksum import file_checksum
        from zephon_nodes.io.shards import _check_same, _decompress_to

        s = self.shard

        def decompress(src: Path) -> None:
            try:
                with open(dest, "wb") as f:
                    _decompress_to(src, f)
            except DataError as e:
                raise DataError(f"{s.path}: {str(e).partition(': ')[2]}") from None

        if storage.is_remote(s.uri):
            from zephon_nodes.io.remote import fetched

            with fetched(s.uri, storage.stat(s.uri)) as (tmp, checksum):
                _check_same(s, checksum)
                decompress(tmp)
        else:
            local = Path(storage.local_path(s.uri))
            _check_same(s, file_checksum(local))
            decompress(local)
        self._index(dest)

    def _index(self, data: Path) -> str:
        """The record index of the decompressed copy (built once, kept in the usual cache)."""
        from zephon_nodes.io.shards import _artifacts, _index_file

        index_path = _artifacts(self.shard.checksum)[1]
        if not index_path.exists():
            index = _index_file(data)
            atomic_write(index_path, lambda f: np.save(f, index, allow_pickle=False))
        return str(index_path)

    def _with_copy(self, fn: Any) -> Any:
        cache = node_cache()
        if cache is None:  # no limit (any more): the shard's own, unbounded copy
            return fn(self.shard)
        with cache.open(self.cache_key, self.cache_size, self.cache_fetch) as local:
            local_shard = dataclasses.replace(
                self.shard, data_path=str(local), index_path=self._index(local)
            )
            return fn(local_shard)

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


def route_whole_shards(datasets: Sequence[Dataset]) -> list[Dataset]:
    """Wrap the shards read whole in :class:`NodeCachedShard` when a cache limit is set."""
    if node_cache() is None:
        return list(datasets)
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
    return out
