"""Checksums of the cache's copies, verified where they are read, and the key they are for.

A decompressed copy of a ``.jsonl.zst`` shard (``$ZEPHON_CACHE_DIR/<key>.jsonl``, or an entry
``zst-*`` of the node cache) and its record index (``<key>.index.npy``) are derived from the
shard's content checksum, so they are trusted as that content. Disk errors, a half-restored
backup, files swapped or copied over each other or a hand edit could still change them; a
changed copy would silently change batches on one machine only. Each copy therefore gets
``<key>.sums.npy``, a uint64 table written when the copy is made::

    MAGIC, xxh3-64 of the entry's key, bytes of the copy (or of the text indexed),
    xxh3-64 of the record index's bytes, xxh3-64 of each 16 KiB block of the copy ...

The key is the entry's name (``<key>``, from the content checksum): sums read under another
name (files swapped, copied over one another, rotated) are refused, and with them the index
and the copy they vouch for; a table without the magic (an older cache) is refused too, never
trusted. Every read checks the blocks it covers (at most 32 KiB more than it needs, see
``benchmarks/integrity.py`` for its cost), the index is checked when it is loaded, and a bad
entry (a directory or anything unreadable where a file should be included) raises
:class:`BadEntry`, which the reader answers by dropping the copy, its index and its sums,
making them again from the shard, and counting one ``bad_cache_entries`` (in the loader's
metrics).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import xxhash

from zephon_nodes.core.errors import DataError
from zephon_nodes.io.storage.cache import atomic_write

__all__ = [
    "BLOCK",
    "BadEntry",
    "count_bad",
    "bad_entries",
    "check_copy",
    "check_index",
    "drop",
    "entry_key",
    "read_checked",
    "recorded_size",
    "sums_path",
    "write_sums",
]

BLOCK = 1 << 14
# "ZSUMS" and the table's version: a table without it (version 1 had no key) is refused.
MAGIC = 0x5A53554D53000002
_HEAD = 4  # magic, key hash, size, index hash; the blocks' hashes follow
_LOCK = threading.Lock()
_BAD = [0]
# sums file -> its array (the file is replaced, never edited, when a copy is made again).
_SUMS: dict[str, np.ndarray] = {}


class BadEntry(DataError):
    """A cache copy or record index does not match its checksums (it is dropped and remade)."""


def count_bad() -> None:
    """Count one bad entry dropped by this process."""
    with _LOCK:
        _BAD[0] += 1


def bad_entries() -> int:
    """Bad cache entries this process dropped and made again."""
    with _LOCK:
        return _BAD[0]


def sums_path(index_path: str | os.PathLike[str]) -> Path:
    """The sums file of a copy whose record index is ``index_path`` (``<key>.index.npy``)."""
    text = str(index_path)
    base = text[: -len(".index.npy")] if text.endswith(".index.npy") else text
    return Path(base + ".sums.npy")


def entry_key(path: str | os.PathLike[str]) -> str:
    """The key of the entry a cache file belongs to: its name without the entry's suffix."""
    name = os.path.basename(os.fspath(path))
    for suffix in (".index.npy", ".sums.npy", ".jsonl"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def write_sums(
    data_path: str | os.PathLike[str] | None,
    index: np.ndarray,
    index_path: str,
    size: int | None = None,
) -> None:
    """Hash a finished copy (None: the shard is read itself) and its record index.

    Args:
        data_path: The copy (None: no copy, the index is of the shard's own bytes).
        index: The record index.
        index_path: Where the index is kept (``<key>.index.npy``: the key recorded).
        size: Bytes of the text indexed when there is no copy (recorded; 0 if unknown).
    """
    blocks: list[int] = []
    total = 0
    if data_path is not None:
        with open(data_path, "rb") as f:
            while block := f.read(BLOCK):
                blocks.append(xxhash.xxh3_64_intdigest(block))
                total += len(block)
    head = [
        MAGIC,
        xxhash.xxh3_64_intdigest(entry_key(index_path).encode()),
        total if data_path is not None else int(size or 0),
        xxhash.xxh3_64_intdigest(np.ascontiguousarray(index).tobytes()),
    ]
    sums = np.asarray(head + blocks, dtype=np.uint64)
    target = sums_path(index_path)
    atomic_write(target, lambda f: np.save(f, sums, allow_pickle=False))
    with _LOCK:
        _SUMS.pop(str(target), None)
        _SUMS.pop(str(index_path), None)


def _sums(index_path: str) -> np.ndarray:
    sums = _SUMS.get(index_path)  # a dict read is atomic: no lock on the hot path
    if sums is not None:
        return sums
    key = str(sums_path(index_path))
    with _LOCK:
        sums = _SUMS.get(key)
    if sums is None:
        try:
            sums = np.load(key, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BadEntry(f"{key}: the cache copy has no readable checksums ({e})") from None
        if sums.dtype != np.uint64 or sums.ndim != 1 or len(sums) < _HEAD:
            raise BadEntry(f"{key}: not a checksum table")
        if int(sums[0]) != MAGIC:
            raise BadEntry(f"{key}: a checksum table of an older cache (no key): made again")
        if int(sums[1]) != xxhash.xxh3_64_intdigest(entry_key(index_path).encode()):
            raise BadEntry(f"{key}: the checksums are of another entry than {entry_key(key)}")
        with _LOCK:
            _SUMS[key] = sums
            _SUMS[index_path] = sums
    return sums


def recorded_size(index_path: str) -> int:
    """Bytes of the text an index was made of, as its sums recorded them.

    Raises:
        BadEntry: The sums are unreadable, of another entry or of an older cache.
    """
    return int(_sums(index_path)[2])


def check_index(index: np.ndarray, index_path: str) -> None:
    """Refuse a record index whose bytes are not those its sums recorded.

    Raises:
        BadEntry: It differs (or it has no sums).
    """
    want = int(_sums(index_path)[3])
    if xxhash.xxh3_64_intdigest(np.ascontiguousarray(index).tobytes()) != want:
        raise BadEntry(f"{index_path}: the cached record index does not match its checksum")


def check_copy(data_path: str | os.PathLike[str], index_path: str) -> None:
    """Check a whole cache copy against its sums, read afresh from disk (not remembered).

    For a copy whose read failed and that another reader may have made again meanwhile: a
    copy that passes is sound now (made again), one that fails is to be dropped.

    Raises:
        BadEntry: The sums are unreadable, of another entry or of an older cache, or do not
            cover the copy, or a block, the copy's size or its readability differs.
    """
    with _LOCK:
        _SUMS.pop(str(sums_path(index_path)), None)
        _SUMS.pop(str(index_path), None)
    sums = _sums(index_path)
    size = int(sums[2])
    if len(sums) != _HEAD + -(-size // BLOCK):
        raise BadEntry(f"{data_path}: the checksums do not cover the cache copy")
    try:
        with open(data_path, "rb") as f:
            for k, expected in enumerate(sums[_HEAD:].tolist()):
                block = f.read(BLOCK)
                if xxhash.xxh3_64_intdigest(block) != expected:
                    raise BadEntry(f"{data_path}: block {k} of the cache copy is damaged")
            if f.read(1):
                raise BadEntry(f"{data_path}: the cache copy is longer than its checksums say")
    except OSError as e:
        raise BadEntry(f"{data_path}: cannot read the cache copy: {e.strerror}") from None


def read_checked(data_path: str, index_path: str, lo: int, hi: int) -> bytes:
    """Bytes ``[lo, hi)`` of a cache copy, each 16 KiB block they touch checked.

    Raises:
        BadEntry: A block differs from its checksum, or the copy is shorter than recorded.
    """
    if hi <= lo:
        return b""
    sums = _sums(index_path)
    first, last = lo // BLOCK, (hi - 1) // BLOCK
    if last + _HEAD >= len(sums):
        raise BadEntry(f"{data_path}: the cache copy is longer than its checksums say")
    base = first * BLOCK
    try:
        with open(data_path, "rb") as f:
            # The bytes asked for are read into the result itself; the parts of the first
            # and last blocks around them only to be hashed.
            f.seek(base)
            head = f.read(lo - base)
            body = f.read(hi - lo)
            tail = f.read((last + 1) * BLOCK - hi)
    except OSError as e:
        raise BadEntry(f"{data_path}: cannot read the cache copy: {e.strerror}") from None
    if len(head) != lo - base or len(body) != hi - lo:
        raise BadEntry(f"{data_path}: the cache copy is shorter than its record index")
    parts = ((base, memoryview(head)), (lo, memoryview(body)), (hi, memoryview(tail)))
    want = sums[first + _HEAD : last + _HEAD + 1].tolist()
    for k, expected in enumerate(want):
        start = base + k * BLOCK
        end = start + BLOCK
        pieces = [
            view[max(start - at, 0) : end - at]
            for at, view in parts
            if at < end and at + len(view) > start
        ]
        if len(pieces) == 1:
            got = xxhash.xxh3_64_intdigest(pieces[0])
        else:
            h = xxhash.xxh3_64()
            for piece in pieces:
                h.update(piece)
            got = h.intdigest()
        if got != expected:
            raise BadEntry(f"{data_path}: block {first + k} of the cache copy is damaged")
    return body


def drop(*paths: str | os.PathLike[str]) -> None:
    """Remove a bad entry's files (a copy, its record index, its sums; a directory too)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)
        with _LOCK:
            _SUMS.pop(str(path), None)
            _SUMS.pop(str(sums_path(path)), None)
