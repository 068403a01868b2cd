"""Random access to records of ``.jsonl`` and ``.jsonl.zst`` shards, local or remote.

Each shard gets a record index (start and end byte offset of every non-blank line), built in
one pass and cached on disk next to a decompressed copy for ``.zst`` shards, so reaching any
work item costs one seek and one read (a range request for a remote ``.jsonl``), and a
compressed shard is decompressed at most once per machine. Cache files live in
``$ZEPHON_CACHE_DIR`` (default ``~/.cache/zephon_nodes``) and are keyed by the shard's
content checksum (:mod:`zephon_nodes.io.storage.checksum`), never by its path or modification time:
a same-size edit is a new key on a warm cache and a cold one alike. They are written to a
temporary name and renamed, so concurrent ranks never read a half-written file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import zstandard

from zephon_nodes.core.errors import (
    CHANGED_FILE,
    CORRUPT_ZSTD,
    MISSING_FILE,
    DataError,
    os_error_kind,
)
from zephon_nodes.io.formats.arrow import ArrowShard
from zephon_nodes.io.formats.copies import artifacts as _artifacts
from zephon_nodes.io.formats.copies import build as _build
from zephon_nodes.io.formats.copies import load_index as _load_index
from zephon_nodes.io.formats.copies import remake
from zephon_nodes.io.formats.entrysums import BadEntry, count_bad, read_checked
from zephon_nodes.io.formats.lines import BLOCK as _BLOCK
from zephon_nodes.io.formats.lines import split_records as _split_records
from zephon_nodes.io.formats.litdata import LitDataShard
from zephon_nodes.io.formats.mds import MDSShard
from zephon_nodes.io.formats.megatron import MegatronShard
from zephon_nodes.io.formats.parquet import ParquetShard
from zephon_nodes.io.formats.tar import TarShard
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import cache_dir
from zephon_nodes.io.storage.checksum import file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = ["FileShard", "MemoryShard", "Shard", "ShardChanged", "cache_dir", "open_shard"]

T = TypeVar("T")


class ShardChanged(DataError):
    """A shard changed during the run: refused even under ``on_error = "skip"``.

    What a skip would leave out depends on when the edit happened, so the output would too.
    """

    refused_under_skip = True


@dataclass(frozen=True)
class FileShard:
    """A shard file with a record index; small and picklable, so it travels with tasks.

    Attributes:
        path: The shard as named by the recipe (used in messages).
        data_path: The uncompressed file records are read from (a local path, or the
            remote URI of an uncompressed shard, read with range requests).
        index_path: ``.npy`` file with an ``(n, 2)`` int64 array of record byte ranges.
        num_records: Number of records (non-blank lines).
        checksum: Content checksum of the shard file (``xxh3_128:...``).
        size: Bytes of the shard file.
        uri: The shard file itself (for a shard opened from a dataset index).
        every: With a dataset index: ``offsets`` holds every ``every``-th record's start
            (``index_path`` is then empty: the shard was opened without reading it).
        offsets: Start offsets of records ``0, every, 2*every, ...`` (uncompressed).
        end: End offset of the last record (uncompressed).
    """

    path: str
    data_path: str
    index_path: str
    num_records: int
    checksum: str = ""
    size: int = 0
    uri: str = ""
    every: int = 0
    offsets: tuple[int, ...] = field(default=(), repr=False)
    end: int = 0
    frames: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)
    version: str = ""

    @property
    def _pin(self) -> str:
        """The version tag reads of a remote shard are conditional on (``""``: local)."""
        return self.version if storage.is_remote(self.uri or self.path) else ""

    def _opened_stat(self) -> storage.FileStat:
        """The remote shard's size and version as opened (a new stat without a version)."""
        if self.version:
            return storage.FileStat(self.size, self.version)
        return storage.stat(self.uri)

    def _check_unchanged(self) -> None:
        """Refuse a local shard whose size or modification time changed since it was opened.

        Every read checks (one ``stat``), whatever is cached: the records of a shard edited
        during a run would differ from the checkpointed ones.
        """
        source = self.uri or self.path
        if not self.version or storage.is_remote(source):
            return
        try:
            st = os.stat(storage.local_path(source))
        except OSError as e:
            raise DataError(
                f"{self.path}: cannot read: {e.strerror}", kind=os_error_kind(e)
            ) from None
        if st.st_size != self.size or str(st.st_mtime_ns) != self.version:
            raise ShardChanged(
                f"{self.path}: the file changed during the run (size {self.size} -> "
                f"{st.st_size}, modification time {self.version} -> {st.st_mtime_ns} ns); "
                "a shard must not be edited while a run reads it"
            )

    def _read_plain(self, lo: int, hi: int) -> bytes:
        """Uncompressed bytes ``[lo, hi)``: a range read, or the zstd frames covering it."""
        if not self.frames:
            return storage.read_range(self.data_path, lo, hi, tag=self.checksum, version=self._pin)
        starts = np.cumsum([0] + [f[2] for f in self.frames])
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        j = int(np.searchsorted(starts, hi, side="left")) - 1
        first, last = self.frames[i], self.frames[j]
        blob = storage.read_range(
            self.data_path, first[0], last[0] + last[1], tag=self.checksum, version=self._pin
        )
        dctx = zstandard.ZstdDecompressor()
        parts = []
        for offset, csize, usize in self.frames[i : j + 1]:
            rel = offset - first[0]
            try:
                plain = dctx.decompress(blob[rel : rel + csize], max_output_size=usize)
            except zstandard.ZstdError as e:
                raise DataError(
                    f"{self.path}: corrupt zstd frame at byte {offset}: {e}", kind=CORRUPT_ZSTD
                ) from None
            if len(plain) != usize:
                raise DataError(
                    f"{self.path}: file changed since it was indexed (zstd frame)",
                    kind=CHANGED_FILE,
                )
            parts.append(plain)
        data = b"".join(parts)
        base = int(starts[i])
        return data[lo - base : hi - base]

    def _local_copy(self) -> tuple[str, str]:
        """Decompressed copy and record index of an indexed ``.zst`` (made on first read)."""
        data_path, index_path = _artifacts(self.checksum)
        if data_path.exists() and index_path.exists():
            return str(data_path), str(index_path)
        if storage.is_remote(self.uri):
            with fetched(self.uri, self._opened_stat(), indexed=True) as (tmp, checksum):
                check_same(self, checksum)
                _build(tmp, checksum, compressed=True)
        else:
            local = Path(storage.local_path(self.uri))
            check_same(self, file_checksum(local))
            _build(local, self.checksum, compressed=True)
        return str(data_path), str(index_path)

    def _read_sparse(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        first = start // self.every
        last = -(-stop // self.every)
        lo = self.offsets[first]
        hi = self.offsets[last] if last < len(self.offsets) else self.end
        try:
            blob = self._read_plain(lo, hi)
        except DataError as e:
            raise _rewrap(self.path, e) from None
        rows = _split_records(blob)
        base = first * self.every
        # Between two kept offsets lie exactly `every` records, after the last one exactly
        # the rest: a record count or offset that is not the file's is refused here.
        expected = min(last * self.every, self.num_records) - base
        want = rows[start - base : stop - base].tolist()
        if len(rows) != expected or len(want) != stop - start:
            raise DataError(
                f"{self.path}: file changed since it was indexed (records [{start}, {stop}) "
                f"not where the dataset index says: {len(rows)} records between offsets "
                f"{lo} and {hi}, the index says {expected}); rebuild it with `zephon index`",
                kind=CHANGED_FILE,
            )
        return [(start + k, blob[a:b]) for k, (a, b) in enumerate(want)]

    def read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Return records ``[start, stop)`` as ``(record number, raw line)`` pairs."""
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: records [{start}, {stop}) out of range")
        if start == stop:
            return []
        rows = self._remade_if_bad(lambda: self._read(start, stop))
        self._check_unchanged()  # after the read: what was read is what was opened
        return rows

    def _remade_if_bad(self, fn: Callable[[], T]) -> T:
        """``fn()``, run again after making this content's bad cache copy or index again.

        The bad entry is counted. A node-cache entry's :class:`BadEntry` is raised on: its
        owner (:mod:`~zephon_nodes.io.nodecache.wholeshard`) drops and fetches it again. One
        still bad after it was made again (a failing disk) is raised even under
        ``on_error = "skip"``: a cache's fault must not leave out records silently.
        """
        try:
            return fn()
        except BadEntry:
            if self._foreign_copy():
                raise  # the node cache's entry: its owner drops and fetches it again
            if self._remake():  # a damaged cache copy or record index: made again, never served
                count_bad()
        try:
            return fn()
        except BadEntry as e:
            e.refused_under_skip = True
            raise

    def _compressed(self) -> bool:
        return (self.uri or self.path).endswith(".zst") and not self.frames

    def _foreign_copy(self) -> bool:
        """Whether the copy read is not this content's own cache copy (a node-cache entry)."""
        own = {str(p) for p in _artifacts(self.checksum)}
        return bool(self.data_path) and self._compressed() and self.data_path not in own

    def _remake(self) -> bool:
        """Make this content's cache copy, record index and sums again from the shard.

        Returns:
            Whether they were bad (False: another reader made them again meanwhile).
        """
        source = self.uri or self.path
        if storage.is_remote(source):
            with fetched(source, self._opened_stat()) as (tmp, checksum):
                check_same(self, checksum)
                return remake(tmp, checksum, self._compressed())
        return remake(Path(storage.local_path(source)), self.checksum, self._compressed())

    def _read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        if not self.index_path:
            if self.every:
                return self._read_sparse(start, stop)
            data_path, index_path = self._local_copy()
            return dataclasses.replace(self, data_path=data_path, index_path=index_path)._read(
                start, stop
            )
        index = _load_index(self.index_path)
        lo = int(index[start, 0])
        hi = int(index[stop - 1, 1])
        if self._compressed():  # a cache copy: each block read is checked
            blob = read_checked(self.data_path, self.index_path, lo, hi)
        else:
            try:
                blob = storage.read_range(
                    self.data_path, lo, hi, tag=self.checksum, version=self._pin
                )
            except DataError as e:
                raise _rewrap(self.path, e) from None
        rows = index[start:stop] - lo
        return [(start + k, blob[a:b]) for k, (a, b) in enumerate(rows.tolist())]

    def line_number(self, record: int) -> int:
        """Return the 1-based line number of a record (counts blank lines too)."""
        if not self.index_path:
            if not self.every:
                data_path, index_path = self._local_copy()
                shard = dataclasses.replace(self, data_path=data_path, index_path=index_path)
                return shard.line_number(record)
            k = record // self.every
            base = self.offsets[k]
            hi = self.offsets[k + 1] if k + 1 < len(self.offsets) else self.end
            rows = _split_records(self._read_plain(base, hi))
            offset = base + int(rows[record % self.every, 0])
        else:
            offset = int(_load_index(self.index_path)[record, 0])
        count = 0
        pos = 0
        while pos < offset:
            end = min(offset, pos + _BLOCK)
            count += self._read_plain(pos, end).count(b"\n")
            pos = end
        return count + 1

    def where(self, record: int) -> str:
        """Describe a record's place for error messages: ``path:line``."""
        return f"{self.path}:{self._remade_if_bad(lambda: self.line_number(record))}"


@dataclass(frozen=True)
class MemoryShard:
    """In-memory records (dicts), for tests and notebooks.

    Attributes:
        path: A display name such as ``<memory:web>``.
        records: The records.
    """

    path: str
    records: tuple[Mapping[str, Any], ...] = field(repr=False)

    @property
    def num_records(self) -> int:
        """Number of records."""
        return len(self.records)

    def read(self, start: int, stop: int) -> list[tuple[int, Any]]:
        """Return records ``[start, stop)`` as ``(record number, record)`` pairs."""
        return [(start + k, r) for k, r in enumerate(self.records[start:stop])]

    def where(self, record: int) -> str:
        """Describe a record's place for error messages."""
        return f"{self.path} record {record}"


Shard = (
    FileShard
    | MemoryShard
    | ParquetShard
    | TarShard
    | ArrowShard
    | MegatronShard
    | MDSShard
    | LitDataShard
)


def _rewrap(path: str, e: DataError) -> DataError:
    """``e`` naming ``path`` instead of the file it names (same kind and skip rule)."""
    return DataError(
        f"{path}: {str(e).partition(': ')[2]}", kind=e.kind, refused_under_skip=e.refused_under_skip
    )


def check_same(shard: FileShard, checksum: str) -> None:
    if checksum != shard.checksum:
        raise DataError(
            f"{shard.path}: content differs from the dataset index (checksum {checksum}, the "
            f"index says {shard.checksum}); rebuild it with `zephon index`"
        )


def indexed_shard(uri: str, entry: Mapping[str, Any]) -> FileShard:
    """A shard from its dataset-index entry, without reading the file."""
    frames = tuple(tuple(int(x) for x in f) for f in entry.get("frames", ()))
    # A multi-frame .zst is read frame by frame; a single frame is decompressed whole.
    compressed = entry["kind"] == "jsonl.zst" and len(frames) < 2
    return FileShard(
        path=storage.redact(uri),
        data_path="" if compressed else uri,
        index_path="",
        num_records=int(entry["records"]),
        checksum=str(entry["checksum"]),
        size=int(entry["bytes"]),
        uri=uri,
        every=0 if compressed else int(entry["every"]),
        offsets=() if compressed else tuple(int(x) for x in entry["offsets"]),
        end=int(entry.get("end", 0)),
        frames=() if compressed else frames,  # type: ignore[arg-type]
        version=str(entry.get("version", "")),
    )


def _open_remote(uri: str) -> FileShard:

    compressed = uri.endswith(".zst")
    st = storage.stat(uri)
    checksum = known_checksum(uri, st)
    if checksum is not None:
        data_path, index_path = _artifacts(checksum)
        ready = index_path.exists() and (data_path.exists() or not compressed)
    if checksum is None or not ready:
        try:
            with fetched(uri, st) as (tmp, checksum):
                data_path, index_path = _build(tmp, checksum, compressed)
        except DataError as e:
            text = str(e)
            raise DataError(text.replace(str(cache_dir()), "<cache>"), kind=e.kind) from None
    shard = FileShard(
        path=storage.redact(uri),
        data_path=str(data_path) if compressed else uri,
        index_path=str(index_path),
        num_records=0,
        checksum=checksum,
        size=st.size,
        uri=uri,
        version=st.version,  # every later range read is conditional on it
    )
    return dataclasses.replace(shard, num_records=_records(shard))


def _records(shard: FileShard) -> int:
    """Records of a shard from its cached record index (made again if it is damaged)."""
    try:
        return int(_load_index(shard.index_path).shape[0])
    except BadEntry:
        if shard._remake():
            count_bad()
        return int(_load_index(shard.index_path).shape[0])


def open_shard(path: str | os.PathLike[str]) -> FileShard:
    """Index a ``.jsonl`` or ``.jsonl.zst`` shard (once per content) and return a handle.

    ``path`` is a local path, ``file://`` or remote URI (see
    :mod:`zephon_nodes.io.storage.storage`).
    A local shard is read once to compute its content checksum (see
    :mod:`zephon_nodes.io.storage.checksum`); its index and decompressed copy are built on the first
    use of that content. A remote shard is fetched once per content (see
    :mod:`zephon_nodes.io.storage.remote`).

    Raises:
        DataError: If the file is missing, unreadable, or a corrupt/truncated zstd stream.
    """
    if storage.is_remote(path):
        return _open_remote(str(path))
    p = Path(storage.local_path(path))
    if not p.is_file():
        raise DataError(f"{p}: data file not found", kind=MISSING_FILE)
    try:
        compressed = p.name.endswith(".zst")
        st = p.stat()
        checksum = file_checksum(p)
        data_path, index_path = _build(p, checksum, compressed)
        shard = FileShard(
            path=str(p),
            data_path=str(data_path) if compressed else str(p),
            index_path=str(index_path),
            num_records=0,
            checksum=checksum,
            size=st.st_size,
            version=str(st.st_mtime_ns),
        )
        return dataclasses.replace(shard, num_records=_records(shard))
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e}", kind=os_error_kind(e)) from None


def memory_shard(name: str, records: Sequence[Mapping[str, Any]]) -> MemoryShard:
    """Wrap in-memory records as one shard."""
    return MemoryShard(path=f"<memory:{name}>", records=tuple(records))
