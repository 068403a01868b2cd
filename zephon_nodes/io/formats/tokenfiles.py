"""The files of a pre-tokenized corpus: pinned range reads, whole decompressed files, ids.

What the Megatron, MDS and LitData readers (:mod:`~zephon_nodes.io.formats.megatron`,
:mod:`~zephon_nodes.io.formats.mds`, :mod:`~zephon_nodes.io.formats.litdata`) share. A file
is pinned when its corpus is opened (:func:`pin`: its content checksum, size and, for a
remote object, its version tag); every later read is a range read of
:func:`zephon_nodes.io.storage.storage.read_range` keyed by that checksum and conditional on
that version, so local paths and every remote backend read the same bytes. A compressed
file (an MDS ``.mds.zstd`` shard, a LitData ``.zstd.bin`` chunk) is read whole and kept
decompressed in a small per-process cache.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from zephon_nodes.core.errors import (
    CHANGED_FILE,
    CORRUPT_ZSTD,
    MISSING_FILE,
    TRUNCATED_FILE,
    DataError,
    os_error_kind,
)
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.checksum import file_checksum
from zephon_nodes.io.storage.remote import fetched, known_checksum

__all__ = [
    "FileRef",
    "check_count",
    "check_distinct",
    "bad_ids",
    "bad_parts",
    "decompressed",
    "offset_table",
    "pin",
    "read_json",
    "read_listing",
    "sibling",
    "uint32s",
]

# Decompressed files kept per process (a work item reads a few records of one of them).
_KEEP = 4
_CACHE: OrderedDict[str, bytes] = OrderedDict()
_LOCK = threading.Lock()
# Local files each thread keeps open for ``pread`` (one open per file, not per read).
_OPEN = 32
_THREAD = threading.local()


@dataclass(frozen=True)
class FileRef:
    """One file of a corpus as it was when the corpus was opened; small and picklable.

    Attributes:
        uri: Local path or remote URI.
        checksum: Content checksum (``xxh3_128:...``).
        size: Bytes of the file.
        version: A remote object's version tag (every read is pinned to it); empty locally.
        mtime_ns: A local file's modification time when it was opened (every read checks
            it and the size, as text shards do); 0 for a remote object.
    """

    uri: str
    checksum: str
    size: int
    version: str = ""
    mtime_ns: int = 0

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the file (a range request for a remote one).

        Raises:
            DataError: The range is outside the file, the read fails, or the file changed.
        """
        if not 0 <= start <= stop <= self.size:
            raise DataError(
                f"{storage.redact(self.uri)}: bytes [{start}, {stop}) are outside the file "
                f"of {self.size} bytes (a corrupt or truncated file)",
                kind=TRUNCATED_FILE,
            )
        if storage.is_remote(self.uri):
            return storage.read_range(
                self.uri, start, stop, tag=self.checksum, version=self.version
            )
        try:
            fd = _descriptor(self.uri, self.checksum)
            self._check_unchanged(os.fstat(fd))
            blob = os.pread(fd, stop - start, start)
        except OSError as e:
            raise DataError(
                f"{self.uri}: cannot read: {e.strerror}", kind=os_error_kind(e)
            ) from None
        if len(blob) != stop - start:
            raise DataError(
                f"{self.uri}: truncated since it was opened (bytes [{start}, {stop}) asked, "
                f"{len(blob)} read)",
                kind=TRUNCATED_FILE,
            )
        return blob

    def _check_unchanged(self, st: os.stat_result) -> None:
        """Refuse a local file whose size or modification time changed since it was opened.

        Under either ``on_error``: what a skip would leave out would depend on when the edit
        happened, and a read would otherwise give tokens that are not the pinned content's.
        """
        if self.mtime_ns and (st.st_size != self.size or st.st_mtime_ns != self.mtime_ns):
            raise DataError(
                f"{self.uri}: the file changed during the run (size {self.size} -> "
                f"{st.st_size}, modification time {self.mtime_ns} -> {st.st_mtime_ns} ns); "
                f"a corpus must not be edited while a run reads it",
                kind=CHANGED_FILE,
                refused_under_skip=True,
            )

    def read_all(self) -> bytes:
        """The whole file."""
        return self.read(0, self.size)


def _descriptor(path: str, checksum: str) -> int:
    """A read-only descriptor of a local file at ``checksum``, kept open by this thread.

    Each thread keeps its last :data:`_OPEN` files open (closing only its own, so a
    descriptor is never closed under another thread's read); a file replaced since it was
    opened is still read as it was.
    """
    fds: OrderedDict[str, int] | None = getattr(_THREAD, "fds", None)
    if fds is None:
        fds = _THREAD.fds = OrderedDict()
    key = f"{os.getpid()}|{path}|{checksum}"
    fd = fds.get(key)
    if fd is not None:
        fds.move_to_end(key)
        return fd
    try:
        fd = os.open(storage.local_path(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}", kind=os_error_kind(e)) from None
    fds[key] = fd
    while len(fds) > _OPEN:
        _, old = fds.popitem(last=False)
        os.close(old)
    return fd


def pin(uri: str) -> FileRef:
    """Stat and checksum one file of a corpus (a remote one is fetched once per content).

    Raises:
        DataError: If the file is missing or cannot be read.
    """
    if storage.is_remote(uri):
        st = storage.stat(uri)
        checksum = known_checksum(uri, st)
        if checksum is None:
            with fetched(uri, st) as (_, checksum):
                pass
        return FileRef(uri, checksum, st.size, st.version)
    p = storage.local_path(uri)
    try:
        local: os.stat_result | None = os.stat(p)
    except OSError:
        local = None
    if local is None or not stat.S_ISREG(local.st_mode):
        raise DataError(f"{p}: data file not found", kind=MISSING_FILE)
    # Stat before the checksum: an edit while it is computed is refused at the first read.
    return FileRef(p, file_checksum(p), local.st_size, mtime_ns=local.st_mtime_ns)


def sibling(uri: str, name: str) -> str:
    """The file ``name`` in the folder of ``uri`` (local path or URI)."""
    head, sep, _ = str(uri).rpartition("/")
    return f"{head}{sep}{name}" if sep else name


def read_json(uri: str) -> object:
    """A small JSON file (an ``index.json``), local or remote.

    Raises:
        DataError: If it cannot be read or is not JSON.
    """
    try:
        if storage.is_remote(uri):
            st = storage.stat(uri)
            blob = storage.read_range(uri, 0, st.size, cache=False, version=st.version)
        else:
            blob = Path(storage.local_path(uri)).read_bytes()
        return json.loads(blob)
    except OSError as e:
        raise DataError(f"{storage.redact(uri)}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise DataError(f"{storage.redact(uri)}: not a JSON file: {e}") from None


def read_listing(index_uri: str, key: str, kind: str) -> dict[str, Any]:
    """A corpus's ``index.json``: a JSON object whose ``key`` lists the corpus's files.

    Args:
        index_uri: The ``index.json``.
        key: The list's key (MDS: ``"shards"``, LitData: ``"chunks"``).
        kind: The corpus format, for messages.

    Raises:
        DataError: It is unreadable, not JSON, or has no such list.
    """
    index = read_json(index_uri)
    if not isinstance(index, dict) or not isinstance(index.get(key), list):
        raise DataError(f"{storage.redact(index_uri)}: not {kind} index.json (no {key!r} list)")
    return index


def decompressed(
    ref: FileRef, codec: str, decode: Callable[[bytes, str], bytes] | None = None
) -> bytes:
    """The whole of ``ref`` decompressed (``"zstd"`` or ``"gz"``), cached per process.

    ``decode(raw, where)``, when given, decodes the file instead (a format's own framing;
    ``codec`` then only names it in the cache).

    Raises:
        DataError: A corrupt or truncated stream, naming the file.
    """
    key = f"{ref.checksum}|{codec}"
    with _LOCK:
        blob = _CACHE.get(key)
        if blob is not None:
            _CACHE.move_to_end(key)
            return blob
    raw = ref.read_all()
    where = storage.redact(ref.uri)
    if decode is not None:
        blob = decode(raw, where)
    elif codec == "zstd":
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            blob = reader.read()
        except zstandard.ZstdError as e:
            raise DataError(f"{where}: corrupt zstd data: {e}", kind=CORRUPT_ZSTD) from None
    elif codec == "gz":
        try:
            blob = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{where}: corrupt gzip data: {e}", kind=CORRUPT_ZSTD) from None
    else:
        raise DataError(f"{where}: compression {codec!r} is not read (zstd or gz are)")
    with _LOCK:
        _CACHE[key] = blob
        while len(_CACHE) > _KEEP:
            _CACHE.popitem(last=False)
    return blob


def uint32s(blob: bytes, where: str) -> np.ndarray:
    """``blob`` as little-endian uint32 values (a header), refused if it is not whole."""
    if len(blob) % 4:
        raise DataError(f"{where}: a truncated header", kind=TRUNCATED_FILE)
    return np.frombuffer(blob, dtype="<u4").astype(np.int64)


def bad_parts(where: str, size: int, said: int, names: tuple[str, str], parts: str) -> DataError:
    """The error for a record of ``size`` bytes whose parts' sizes say ``said``.

    Raised by the readers (MDS samples, LitData items), which check inline: a call per
    record would cost 3-6% of the decode rate (``benchmarks/pretokenized.py``).
    """
    article = "an" if names[1][0] in "aeiou" else "a"
    return DataError(
        f"{where}: {article} {names[1]} of {size} bytes, its {parts}' sizes say {said} (a "
        f"corrupt {names[0]}, or an index.json of other {names[0]}s)",
        kind=TRUNCATED_FILE,
    )


def bad_ids(
    where: str, body: int, ids: np.dtype[Any], count: int | None, names: tuple[str, str], what: str
) -> DataError:
    """The error for a token value of ``body`` bytes that is not whole ids (``count`` if stated).

    Raised by the readers, which check inline (see :func:`bad_parts`).
    """
    shape = f"{count} ids" if count is not None else "whole ids"
    return DataError(
        f"{where}: a token {what} of {body} bytes is not {shape} of {ids} (a corrupt "
        f"{names[1]}, or an index.json of other {names[0]}s)",
        kind=TRUNCATED_FILE,
    )


def check_distinct(where: str, names: list[str], kind: str) -> None:
    """Refuse an ``index.json`` that names one file twice (its records would come twice).

    Raises:
        DataError: Naming the index, the file and both entries.
    """
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise DataError(
                f"{where}: {kind}s {seen[name]} and {i} are both {name!r} (its records would "
                f"be read twice: an index.json merged twice?)"
            )
        seen[name] = i


def check_count(where: str, count: int, size: object, names: tuple[str, str]) -> None:
    """Refuse an ``index.json`` record count that a file of ``size`` bytes cannot hold.

    A file laid out as a count, ``n + 1`` offsets and the records (:func:`offset_table`)
    holds at most ``size / 4 - 2`` records; ``size`` None (not known before the file is
    decompressed) checks only that the count is not negative.

    Raises:
        DataError: Naming the file, the count and the size.
    """
    bound = int(size) // 4 - 2 if isinstance(size, int) else None
    if count < 0 or (bound is not None and count > bound):
        raise DataError(
            f"{where}: its index.json lists {count} {names[1]}s, and a {names[0]} of {size} "
            f"bytes holds at most {max(bound or 0, 0)} (an index.json of other "
            f"{names[0]}s, or a corrupt one)",
            kind=TRUNCATED_FILE,
        )


def offset_table(
    file: FileRef,
    blob: bytes | None,
    span: tuple[int, int, int],
    where: str,
    names: tuple[str, str],
) -> list[tuple[int, bytes]]:
    """Records ``[start, stop)`` of a file laid out as a count, offsets, then the records.

    The layout of an MDS shard and a LitData chunk: the record count (uint32), ``n + 1``
    byte offsets (uint32), then the records, which end where the file does. Read from
    ``blob`` (the whole file decompressed) or, when it is None, by two range reads of
    ``file``. The file must be what its ``index.json`` says, checked without another read:
    a span from the first record reads the count with the offsets, a span to the last one
    ends at the end of the file, and the records start after the offsets.

    Args:
        file: The file (read by range when there is no ``blob``).
        blob: The whole file decompressed, or None.
        span: ``(start, stop, count)``: the records read, and the file's records as its
            ``index.json`` says.
        where: The file as messages name it.
        names: The file's kind and a record's, for messages (``("shard", "sample")``).

    Returns:
        ``(record number, raw bytes)`` pairs.

    Raises:
        DataError: The offsets run backwards or out of the file, or the file holds another
            number of records than its ``index.json`` says.
    """
    start, stop, count = span
    size = file.size if blob is None else len(blob)

    def part(lo: int, hi: int) -> bytes:
        if blob is None:
            return file.read(lo, hi)
        if hi > len(blob):
            raise DataError(f"{where}: a truncated {names[0]}", kind=TRUNCATED_FILE)
        return blob[lo:hi]

    head = uint32s(part(0 if start == 0 else 4 * (1 + start), 4 * (2 + stop)), where)
    if start == 0 and int(head[0]) != count:
        raise _miscounted(where, names, count, f"holds {int(head[0])} {names[1]}s")
    offsets = head[1:] if start == 0 else head
    if np.any(np.diff(offsets) < 0) or int(offsets[0]) < 4 * (2 + count):
        raise DataError(f"{where}: corrupt {names[1]} offsets", kind=TRUNCATED_FILE)
    if stop == count and int(offsets[-1]) != size:
        raise _miscounted(
            where,
            names,
            count,
            f"has {size} bytes, its {names[1]} {count - 1} ends at {offsets[-1]}",
        )
    lo = int(offsets[0])
    data = part(lo, int(offsets[-1]))
    return [
        (start + k, data[a - lo : b - lo]) for k, (a, b) in enumerate(pairwise(offsets.tolist()))
    ]


def _miscounted(where: str, names: tuple[str, str], count: int, what: str) -> DataError:
    return DataError(
        f"{where}: the {names[0]} {what}, and its index.json lists it with {count} "
        f"{names[1]}s (an index.json of other {names[0]}s, or a corrupt {names[0]})",
        kind=TRUNCATED_FILE,
    )
