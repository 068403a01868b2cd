"""Parquet shards: random access to the text column by row groups (needs ``pyarrow``).

Install with ``pip install 'zephon-nodes[parquet]'``. Only the dataset's text column is
read, one row group range per work item. A missing column makes every record a
"missing field"; a column that is not a string type makes them "non-string field": both go
through the dataset's ``on_error`` policy like jsonl records.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.core.errors import MISSING_FILE, UNREADABLE_PARQUET, DataError
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.checksum import file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = ["ParquetShard", "open_parquet_shard"]

# One open ParquetFile per thread: pyarrow's ParquetFile is not safe to read from several
# worker threads at once (its read-range cache raced: "ReadRangeCache did not find matching
# cache entry").
_LOCAL = threading.local()


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            "reading .parquet shards needs pyarrow: pip install 'zephon-nodes[parquet]'"
        ) from None
    return pq


class _PinnedFile(io.RawIOBase):
    """A remote Parquet file read through :func:`~zephon_nodes.io.storage.storage.read_range`.

    Every read pyarrow makes (the footer, each row group) is a range read pinned to the
    object's version seen when the shard was opened, through the process's block cache: the
    bytes are that version's, or the read stops with ``ObjectChanged``.
    """

    def __init__(self, uri: str, size: int, checksum: str, version: str) -> None:
        super().__init__()
        self.uri, self.size, self.checksum, self.version = uri, size, checksum, version
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        stop = min(self.size, self.pos + len(buffer))
        if stop <= self.pos:
            return 0
        blob = storage.read_range(self.uri, self.pos, stop, tag=self.checksum, version=self.version)
        n = len(blob)
        memoryview(buffer).cast("B")[:n] = blob
        self.pos += n
        return n


def _parquet_file(path: str, checksum: str = "", version: str = "", size: int = 0) -> Any:
    # Keyed by content checksum (a same-size edit with its mtime restored gets a new handle)
    # and by the pinned version of a remote object.
    remote = storage.is_remote(path)
    key = f"{path}|{checksum}|{version}"
    files: dict[str, Any] | None = getattr(_LOCAL, "files", None)
    if files is None:
        files = _LOCAL.files = {}
    f = files.get(key)
    if f is None:
        pq = _pq()
        if remote:
            # pyarrow reads the footer and each row group with range requests, each pinned
            # to the version seen at open when there is one.
            if version and size:
                f = pq.ParquetFile(_PinnedFile(path, size, checksum, version))
            else:
                f = storage.with_retries(
                    lambda: pq.ParquetFile(storage.filesystem(path).open(path, "rb")),
                    path,
                    what="open",
                )
        else:
            try:
                f = pq.ParquetFile(path)
            except Exception as e:
                raise DataError(
                    f"{path}: unreadable Parquet file: {e}", kind=UNREADABLE_PARQUET
                ) from None
        files[key] = f
    return f


def _forget(path: str) -> None:
    files: dict[str, Any] = getattr(_LOCAL, "files", {})
    for key in [k for k in files if k.startswith(path + "|")]:
        del files[key]


@dataclass(frozen=True)
class ParquetShard:
    """A Parquet file's text column; small and picklable, so it travels with tasks.

    Attributes:
        path: The file.
        column: The text column (the dataset's ``text_field``).
        num_records: Rows in the file.
        row_group_ends: Cumulative row counts of the row groups.
        has_column: Whether the file has the text column.
        image_column: A binary image column also read (multimodal recipes), if the file
            has it.
        checksum: Content checksum of the file (``xxh3_128:...``).
        size: Bytes of the file.
        version: A remote object's version tag when the shard was opened (every read is
            pinned to it); empty for a local file.
    """

    path: str
    column: str
    num_records: int
    row_group_ends: tuple[int, ...]
    has_column: bool
    image_column: str | None = None
    checksum: str = ""
    size: int = 0
    version: str = ""

    def read(self, start: int, stop: int) -> list[tuple[int, Any]]:
        """Return rows ``[start, stop)`` as ``(row number, {column: value})`` pairs.

        Raises:
            DataError: If the row groups cannot be read.
        """
        if not 0 <= start <= stop <= self.num_records:
            raise DataError(f"{self.path}: rows [{start}, {stop}) out of range")
        if start == stop:
            return []
        if not self.has_column:
            return [(r, {}) for r in range(start, stop)]
        ends = np.asarray(self.row_group_ends, dtype=np.int64)
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        base = int(ends[first - 1]) if first else 0
        columns = [self.column] + ([self.image_column] if self.image_column else [])
        groups = list(range(first, last + 1))
        try:
            if storage.is_remote(self.path):

                def read() -> Any:
                    try:
                        f = _parquet_file(self.path, self.checksum, self.version, self.size)
                        return f.read_row_groups(groups, columns=columns)
                    except BaseException:
                        _forget(self.path)
                        raise

                table = storage.with_retries(read, self.path)
            else:
                f = _parquet_file(self.path, self.checksum)
                table = f.read_row_groups(groups, columns=columns)
            values = table.column(0).to_pylist()[start - base : stop - base]
            images = (
                table.column(1).to_pylist()[start - base : stop - base]
                if self.image_column
                else None
            )
        except DataError:
            raise
        except Exception as e:
            raise DataError(
                f"{self.path}: unreadable Parquet file: {e}", kind=UNREADABLE_PARQUET
            ) from None
        if len(values) != stop - start:
            raise DataError(
                f"{self.path}: unreadable Parquet file: short read", kind=UNREADABLE_PARQUET
            )
        if images is not None and self.image_column is not None:
            key = self.image_column
            return [
                (start + k, {self.column: v, key: b})
                for k, (v, b) in enumerate(zip(values, images, strict=True))
            ]
        return [(start + k, {self.column: v}) for k, v in enumerate(values)]

    def where(self, record: int) -> str:
        """Describe a row's place for error messages."""
        return f"{self.path} row {record}"


def indexed_parquet_shard(
    uri: str, entry: dict[str, Any], column: str, image_column: str | None = None
) -> ParquetShard:
    """A Parquet shard from its dataset-index entry, without reading the file."""
    names = entry["columns"]
    return ParquetShard(
        path=uri,
        column=column,
        num_records=int(entry["records"]),
        row_group_ends=tuple(int(x) for x in entry["row_group_ends"]),
        has_column=column in names,
        image_column=image_column if image_column in names else None,
        checksum=str(entry["checksum"]),
        size=int(entry["bytes"]),
        version=str(entry.get("version", "")) if storage.is_remote(uri) else "",
    )


def open_parquet_shard(
    path: str | Path, column: str, image_column: str | None = None
) -> ParquetShard:
    """Read a Parquet file's metadata and return a shard of its ``column``.

    ``image_column`` (multimodal recipes) is read too when the file has it.

    Raises:
        DataError: If pyarrow is missing or the file is not a readable Parquet file.
    """
    p = str(path)
    if storage.is_remote(p):
        st = storage.stat(p)
        checksum = known_checksum(p, st)
        if checksum is None:
            with fetched(p, st) as (_, checksum):
                pass
        size, version = st.size, st.version
    else:
        version = ""
        p = storage.local_path(p)
        if not Path(p).is_file():
            raise DataError(f"{p}: data file not found", kind=MISSING_FILE)
        checksum = file_checksum(p)
        size = Path(p).stat().st_size
    f = _parquet_file(p, checksum, version, size)
    try:
        meta = f.metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        names = f.schema_arrow.names
    except Exception as e:
        raise DataError(f"{p}: unreadable Parquet file: {e}", kind=UNREADABLE_PARQUET) from None
    ends = tuple(int(x) for x in np.cumsum(counts)) if counts else ()
    return ParquetShard(
        path=p,
        column=column,
        num_records=ends[-1] if ends else 0,
        row_group_ends=ends,
        has_column=column in names,
        image_column=image_column if image_column in names else None,
        checksum=checksum,
        size=size,
        version=version,
    )
