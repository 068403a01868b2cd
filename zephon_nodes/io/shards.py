"""Random access to records of ``.jsonl`` and ``.jsonl.zst`` shards.

Each shard gets a record index (start and end byte offset of every non-blank line), built in
one pass and cached on disk next to a decompressed copy for ``.zst`` shards, so reaching any
work item costs one seek and one read, and a compressed shard is decompressed at most once
per machine. Cache files live in ``$ZEPHON_CACHE_DIR`` (default ``~/.cache/zephon_nodes``)
and are keyed by the shard's absolute path, size and modification time; they are written to
a temporary name and renamed, so concurrent ranks never read a half-written file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from zephon_nodes.errors import DataError
from zephon_nodes.io.arrow import ArrowShard
from zephon_nodes.io.cache import atomic_write, cache_dir, cache_key
from zephon_nodes.io.parquet import ParquetShard
from zephon_nodes.io.tar import TarShard

__all__ = ["FileShard", "MemoryShard", "Shard", "cache_dir", "open_shard"]

_BLOCK = 16 << 20


@dataclass(frozen=True)
class FileShard:
    """A shard file with a record index; small and picklable, so it travels with tasks.

    Attributes:
        path: The shard as named by the recipe (used in messages).
        data_path: The uncompressed file records are read from.
        index_path: ``.npy`` file with an ``(n, 2)`` int64 array of record byte ranges.
        num_records: Number of records (non-blank lines).
    """

    path: str
    data_path: str
    index_path: str
    num_records: int

    def read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Return records ``[start, stop)`` as ``(record number, raw line)`` pairs."""
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: records [{start}, {stop}) out of range")
        if start == stop:
            return []
        index = _load_index(self.index_path)
        lo = int(index[start, 0])
        hi = int(index[stop - 1, 1])
        with open(self.data_path, "rb") as f:
            f.seek(lo)
            blob = f.read(hi - lo)
        if len(blob) != hi - lo:
            raise DataError(f"{self.path}: file changed since it was indexed (short read)")
        rows = index[start:stop] - lo
        return [(start + k, blob[a:b]) for k, (a, b) in enumerate(rows.tolist())]

    def line_number(self, record: int) -> int:
        """Return the 1-based line number of a record (counts blank lines too)."""
        index = _load_index(self.index_path)
        offset = int(index[record, 0])
        count = 0
        with open(self.data_path, "rb") as f:
            remaining = offset
            while remaining > 0:
                block = f.read(min(_BLOCK, remaining))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
        return count + 1

    def where(self, record: int) -> str:
        """Describe a record's place for error messages: ``path:line``."""
        return f"{self.path}:{self.line_number(record)}"


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


Shard = FileShard | MemoryShard | ParquetShard | TarShard | ArrowShard

_INDEX_CACHE: dict[str, np.ndarray] = {}


def _load_index(index_path: str) -> np.ndarray:
    index = _INDEX_CACHE.get(index_path)
    if index is None:
        index = np.load(index_path, allow_pickle=False)
        _INDEX_CACHE[index_path] = index
    return index


def _decompress_to(src: Path, dst: Any) -> None:
    """Decompress every zstd frame of ``src`` into the file object ``dst``."""
    dctx = zstandard.ZstdDecompressor()
    obj = dctx.decompressobj()
    frame_done = True
    with open(src, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            while block:
                try:
                    out = obj.decompress(block)
                except zstandard.ZstdError as e:
                    raise DataError(f"{src}: corrupt zstd data: {e}") from None
                dst.write(out)
                frame_done = obj.eof
                if obj.eof:
                    block = obj.unused_data
                    obj = dctx.decompressobj()
                    frame_done = True
                    if block:
                        frame_done = False
                else:
                    block = b""
    if not frame_done:
        raise DataError(f"{src}: truncated zstd stream (the last frame is incomplete)")


def _index_file(data_path: Path) -> np.ndarray:
    """Return an ``(n, 2)`` int64 array of [start, end) byte ranges of non-blank lines."""
    size = data_path.stat().st_size
    newlines: list[np.ndarray] = []
    with open(data_path, "rb") as f:
        base = 0
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            arr = np.frombuffer(block, dtype=np.uint8)
            newlines.append(np.flatnonzero(arr == 10).astype(np.int64) + base)
            base += len(block)
    nl = np.concatenate(newlines) if newlines else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [size]])
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    # A line holding only "\r" (a blank CRLF line) is blank too.
    ones = np.flatnonzero(ends - starts == 1)
    if len(ones):
        with open(data_path, "rb") as f:
            drop = []
            for i in ones.tolist():
                f.seek(int(starts[i]))
                if f.read(1) == b"\r":
                    drop.append(i)
        if drop:
            mask = np.ones(len(starts), dtype=bool)
            mask[drop] = False
            starts, ends = starts[mask], ends[mask]
    return np.stack([starts, ends], axis=1).astype(np.int64)


def open_shard(path: str | os.PathLike[str]) -> FileShard:
    """Index a ``.jsonl`` or ``.jsonl.zst`` shard (once per machine) and return a handle.

    Raises:
        DataError: If the file is missing, unreadable, or a corrupt/truncated zstd stream.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: data file not found")
    try:
        key = cache_key(p)
        root = cache_dir()
        compressed = p.name.endswith(".zst")
        data_path = root / f"{key}.jsonl" if compressed else p
        index_path = root / f"{key}.index.npy"
        if compressed and not data_path.exists():
            atomic_write(data_path, lambda f: _decompress_to(p, f))
        if not index_path.exists():
            index = _index_file(data_path)
            atomic_write(index_path, lambda f: np.save(f, index, allow_pickle=False))
        n = int(_load_index(str(index_path)).shape[0])
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e}") from None
    return FileShard(
        path=str(p), data_path=str(data_path), index_path=str(index_path), num_records=n
    )


def memory_shard(name: str, records: Sequence[Mapping[str, Any]]) -> MemoryShard:
    """Wrap in-memory records as one shard."""
    return MemoryShard(path=f"<memory:{name}>", records=tuple(records))
