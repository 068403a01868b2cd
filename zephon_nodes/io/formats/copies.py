"""The cache's derived files of a shard: its decompressed copy, record index and checksums.

For a shard of content checksum ``xxh3_128:K`` the cache directory holds ``K.index.npy`` (the
byte range of every record), for a ``.jsonl.zst`` ``K.jsonl`` (its decompressed text), and
``K.sums.npy`` (see :mod:`zephon_nodes.io.formats.entrysums`). A copy is made in a temporary file,
its record index and sums are written, and only then is it renamed into place, so a copy
that exists always has its sums; a copy without them (an older cache) or not matching them
is dropped and made again by :func:`remake`, under the entry's file lock ``K.lock``: a
node's processes (its ranks, a loader's worker processes) share the cache directory, and
the threads of each share the entry.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.io.formats.entrysums import (
    BadEntry,
    check_copy,
    check_index,
    count_bad,
    drop,
    sums_path,
    write_sums,
)
from zephon_nodes.io.formats.lines import decompress_to, index_file
from zephon_nodes.io.nodecache.locks import entry_lock
from zephon_nodes.io.storage.cache import atomic_write, cache_dir, umask_mode
from zephon_nodes.io.storage.checksum import Hasher

__all__ = [
    "artifacts",
    "build",
    "entry_locked",
    "forget_index",
    "load_index",
    "remake",
    "sound",
]

_INDEX_CACHE: dict[str, np.ndarray] = {}


def artifacts(checksum: str) -> tuple[Path, Path]:
    """``(decompressed copy, record index)`` paths of the content ``checksum``."""
    root = cache_dir()
    key = checksum.partition(":")[2][:32]
    return root / f"{key}.jsonl", root / f"{key}.index.npy"


def load_index(index_path: str) -> np.ndarray:
    """A record index from the cache (once per process), checked against its sums.

    Raises:
        BadEntry: It does not match its sums, or has none.
    """
    index = _INDEX_CACHE.get(index_path)
    if index is None:
        try:
            index = np.load(index_path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise BadEntry(f"{index_path}: unreadable cached record index ({e})") from None
        if index.dtype != np.int64 or index.ndim != 2 or index.shape[1:] != (2,):
            raise BadEntry(f"{index_path}: not a record index")
        check_index(index, index_path)
        _INDEX_CACHE[index_path] = index
    return index


def forget_index(index_path: str) -> None:
    """Forget a loaded record index (after it was dropped)."""
    _INDEX_CACHE.pop(index_path, None)


def _save(path: Path, array: np.ndarray) -> None:
    atomic_write(path, lambda f: np.save(f, array, allow_pickle=False))


def build(src: Path, checksum: str, compressed: bool) -> tuple[Path, Path]:
    """Build the decompressed copy, record index and sums of ``src`` (content ``checksum``).

    Raises:
        DataError: ``src`` is corrupt, (compressed) its bytes do not hash to ``checksum``, or
            the cache directory cannot be written (named, e.g. a full disk).
    """
    try:
        return _build(src, checksum, compressed)
    except BadEntry:  # a copy of an older cache (no sums), or not matching them
        if remake(src, checksum, compressed):
            count_bad()
        return artifacts(checksum)
    except OSError as e:
        raise _unwritable(src, e) from None


def _unwritable(src: Path, e: OSError) -> OSError | DataError:
    """``e`` as raised by a build of ``src``'s copy: a cache directory's error named."""
    if not os.path.exists(src) or (e.filename and str(e.filename) == str(src)):
        return e
    return DataError(
        f"cache directory {cache_dir()}: cannot write the copy of {src.name} "
        f"({e.strerror or e}); free space there or set ZEPHON_CACHE_DIR"
    )


def _build(src: Path, checksum: str, compressed: bool) -> tuple[Path, Path]:
    data_path, index_path = artifacts(checksum)
    if compressed and data_path.exists() and not data_path.is_file():
        raise BadEntry(f"{data_path}: not a file where a cache copy should be")
    if compressed and not data_path.exists():
        fd, tmp = tempfile.mkstemp(dir=data_path.parent, prefix=data_path.name + ".", suffix=".tmp")
        try:
            umask_mode(fd)
            # Hashed as it is decompressed: a copy is never kept under another content's
            # checksum (a trusted modification time, an index, ZEPHON_IMMUTABLE_DATA).
            hasher = Hasher()
            with os.fdopen(fd, "wb") as f:
                try:
                    decompress_to(src, f, hasher)
                except DataError as e:
                    raise DataError(f"{src}: {str(e).partition(': ')[2]}", kind=e.kind) from None
            if hasher.hexdigest() != checksum:
                raise DataError(
                    f"{src}: content differs from its checksum {checksum} (got "
                    f"{hasher.hexdigest()}): edited in place with its modification time kept?"
                )
            index = index_file(Path(tmp))
            write_sums(tmp, index, str(index_path))
            _save(index_path, index)
            os.replace(tmp, data_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    elif not index_path.exists() or not (compressed or sums_path(index_path).exists()):
        index = index_file(data_path if compressed else src)
        if compressed:
            check_index(index, str(index_path))  # the sums were made with the copy
        else:
            write_sums(None, index, str(index_path))
        _save(index_path, index)
    return data_path, index_path


def _drop(checksum: str, compressed: bool) -> None:
    data_path, index_path = artifacts(checksum)
    drop(*([data_path] if compressed else []), index_path, sums_path(index_path))
    forget_index(str(index_path))


def sound(data_path: str | os.PathLike[str] | None, index_path: str) -> bool:
    """Whether a record index (and the copy it indexes, if any) match their sums.

    Read afresh from disk, not as remembered: another reader may have made them again since
    a read of them failed.

    Args:
        data_path: The decompressed copy (None: the index is of the shard's own bytes).
        index_path: Its record index (``<key>.index.npy``).
    """
    forget_index(index_path)
    try:
        if data_path is not None:
            check_copy(data_path, index_path)
        load_index(index_path)
    except BadEntry:
        return False
    return True


def entry_locked(checksum: str) -> contextlib.AbstractContextManager[None]:
    """The file lock ``K.lock`` of ``checksum``'s copy, record index and sums, held inside.

    Whoever writes or drops them holds it (:func:`remake`, the node cache's whole-shard
    reads): a node's processes share the cache directory.
    """
    return entry_lock(artifacts(checksum)[0].with_suffix(".lock"))


def remake(src: Path, checksum: str, compressed: bool) -> bool:
    """Drop the derived files of ``checksum`` and build them again from ``src``, if still bad.

    A process's lanes read a shard in parallel, and a node's processes share the cache
    directory, so several readers may find the same bad entry at once: they remake it one at
    a time, under the entry's file lock, and each first checks the files afresh, so that a
    copy another reader has just made again is kept, never dropped under a reader.

    Returns:
        True when the files were bad and were made again (one bad entry to count); False
        when they were found sound (made again meanwhile by another reader).

    Raises:
        DataError: As :func:`build`.
    """
    data_path, index_path = artifacts(checksum)
    with entry_locked(checksum):
        if sound(data_path if compressed else None, str(index_path)):
            return False
        _drop(checksum, compressed)
        try:
            _build(src, checksum, compressed)
        except OSError as e:
            raise _unwritable(src, e) from None
        return True
