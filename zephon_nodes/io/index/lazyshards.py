"""A dataset's shards from its index, each opened when a work item of it is first read.

:class:`LazyShards` is the ``shards`` sequence of a
:class:`~zephon_nodes.io.dataset.Dataset` built from a dataset index
(:func:`~zephon_nodes.io.index.table.resolve_indexed`): its length and record counts come from
the index's columns, and shard ``k`` is built on first access. That is also when the file
is checked against its index entry (size and version tag; a local copy with a new
modification time is re-hashed; ``ZEPHON_VERIFY_DATA=1`` hashes every local shard): a
changed shard is refused then, naming the file, whatever the dataset's ``on_error``, since
the dataset's work items were laid out from the index.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.io.formats.parquet import indexed_parquet_shard
from zephon_nodes.io.formats.shards import indexed_shard
from zephon_nodes.io.formats.tar import indexed_tar_shard
from zephon_nodes.io.index.index import _check, rebuild_hint
from zephon_nodes.io.index.table import KINDS, IndexedFiles, verify_data
from zephon_nodes.io.nodecache.wholeshard import NodeCachedShard
from zephon_nodes.io.nodecache.wholeshard import read_whole as _whole
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.checksum import file_checksum

__all__ = ["LazyShards"]


class LazyShards(Sequence[Any]):
    """Shards of an indexed dataset, built on first access.

    Args:
        files: The dataset's rows of its index.
        name: The dataset's name (for messages).
        text_field: The field holding the text (Parquet shards).
        image_column: A Parquet binary image column to read too (multimodal recipes).
    """

    def __init__(
        self, files: IndexedFiles, name: str, text_field: str, image_column: str | None = None
    ) -> None:
        self.files = files
        self.name = name
        self.text_field = text_field
        self.image_column = image_column
        rows = files.rows
        self.records: np.ndarray = files.table.records[rows]
        self.kinds: np.ndarray = files.table.kinds[rows]
        self.frames: np.ndarray = files.table.frames[rows]
        self._built: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.records.shape[0])

    @overload
    def __getitem__(self, k: int) -> Any: ...

    @overload
    def __getitem__(self, k: slice) -> list[Any]: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"shard {k} out of range for {n} shards")
        k %= n
        shard = self._built.get(k)
        if shard is None:
            with self._lock:
                shard = self._built.get(k)
                if shard is None:
                    shard = self._open(k)
                    self._built[k] = shard
        return shard

    def __iter__(self) -> Iterator[Any]:
        for k in range(len(self)):
            yield self[k]

    def has_kind(self, kind: str) -> bool:
        """Whether any shard is of ``kind`` (see :data:`~zephon_nodes.io.index.table.KINDS`)."""
        return bool(np.any(self.kinds == KINDS.index(kind)))

    def first_of_kind(self, kind: str) -> str | None:
        """The path of the first shard of ``kind``, if any (for messages)."""
        hits = np.flatnonzero(self.kinds == KINDS.index(kind))
        return self.files.table.uri(int(self.files.rows[hits[0]])) if len(hits) else None

    def whole(self) -> bool:
        """Whether any shard is a single-frame ``.zst`` (read whole, via the node cache)."""
        zst = self.kinds == KINDS.index("jsonl.zst")
        return bool(np.any(zst & (self.frames < 2)))

    def largest_whole(self) -> tuple[int, str] | None:
        """``(compressed bytes, path)`` of the largest single-frame ``.zst`` shard, if any."""
        sizes = self.files.table.sizes[self.files.rows]
        whole = (self.kinds == KINDS.index("jsonl.zst")) & (self.frames < 2)
        if not np.any(whole):
            return None
        k = int(np.argmax(np.where(whole, sizes, -1)))
        return int(sizes[k]), self.files.table.uri(int(self.files.rows[k]))

    def _open(self, k: int) -> Any:
        table = self.files.table
        row = int(self.files.rows[k])
        uri = table.uri(row)
        entry = table.entry(row)
        try:
            _check(uri, entry, table.directory)
            if _verify(uri):
                _verify_checksum(uri, entry, table.directory)
            shard = _from_entry(uri, entry, self.text_field, self.image_column)
        except DataError as e:
            raise DataError(f"dataset {self.name!r}: {e}", kind=e.kind) from None
        if int(shard.num_records) != int(self.records[k]):
            raise DataError(
                f"dataset {self.name!r}: {storage.redact(uri)}: {shard.num_records} records, "
                f"the dataset index says {int(self.records[k])}"
            )
        if _whole(shard):  # its decompressed copy lives in the bounded node cache
            return NodeCachedShard(shard)
        return shard


def _verify(uri: str) -> bool:
    return verify_data() and not storage.is_remote(uri)


def _verify_checksum(uri: str, entry: dict[str, Any], directory: str) -> None:
    got = file_checksum(uri)
    if got != entry.get("checksum"):
        raise DataError(
            f"{uri}: content differs from the dataset index (checksum {got}, the index says "
            f"{entry.get('checksum')}); {rebuild_hint(directory)}"
        )


def _from_entry(uri: str, entry: dict[str, Any], text_field: str, image_column: str | None) -> Any:
    """A shard from its index entry (as :func:`zephon_nodes.io.sources` opens one)."""
    if entry["kind"] == "parquet":
        return indexed_parquet_shard(uri, entry, text_field, image_column)
    if entry["kind"] == "tar":
        return indexed_tar_shard(uri, entry)
    return indexed_shard(uri, entry)
