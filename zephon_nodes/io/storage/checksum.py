"""Content checksums: what a shard *is*, independent of where it lives.

A shard's identity is the xxh3-128 of its bytes (``xxh3_128:<32 hex>``), computed while its
record index is built (which reads the file anyway) or by ``zephon index``. It keys the
local record indexes and decompressed copies in the cache and joins the recipe fingerprint,
so the same bytes in another folder or bucket are the same data, and a file whose content
changed (even at the same size, with its modification time restored) is a different one.

Hashing costs one sequential read of each local shard each time a pipeline is built
(xxh3 runs at several GB/s, so the disk is the limit). For data that is never modified in
place, ``ZEPHON_IMMUTABLE_DATA=1`` remembers each local file's checksum by path, size,
modification time and inode, and skips the re-read: a same-size in-place edit with its
modification time restored is then NOT noticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import xxhash

from zephon_nodes.core.errors import DataError, os_error_kind
from zephon_nodes.core.settings import current
from zephon_nodes.io.storage.cache import atomic_write, cache_dir

__all__ = ["PREFIX", "Hasher", "build_memo", "file_checksum", "immutable_data", "one_pass"]

PREFIX = "xxh3_128:"
_BLOCK = 8 << 20


class Hasher:
    """Incremental content checksum: ``update(bytes)`` then ``hexdigest()``."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()

    def update(self, data: bytes) -> None:
        """Add bytes."""
        self._h.update(data)

    def hexdigest(self) -> str:
        """The checksum, ``xxh3_128:<32 hex>``."""
        return PREFIX + self._h.hexdigest()


_SCOPE = threading.local()


@contextmanager
def one_pass() -> Iterator[None]:
    """Within this block, hash each local file once (building a pipeline hashes it once).

    Checksums are remembered by path, size, modification time and inode only inside the
    block, so a file edited between two pipeline builds is re-hashed.
    """
    outer = getattr(_SCOPE, "memo", None)
    if outer is None:
        _SCOPE.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _SCOPE.memo = None


def build_memo() -> dict[Any, Any] | None:
    """The memo of the current :func:`one_pass` block (``None`` outside one)."""
    memo: dict[Any, Any] | None = getattr(_SCOPE, "memo", None)
    return memo


def immutable_data() -> bool:
    """Whether the settings say local files are never edited in place.

    ``immutable_data`` of :func:`zephon_nodes.core.settings.current`
    (``ZEPHON_IMMUTABLE_DATA=1``).
    """
    return current().immutable_data


def _memo_path(path: Path, st: os.stat_result) -> Path:
    text = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    return cache_dir() / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.checksum.json"


def file_checksum(path: str | os.PathLike[str], sink: Callable[[bytes], Any] | None = None) -> str:
    """Return the content checksum of a local file, reading it once.

    ``sink`` (optional) receives every block read, so a caller can index or decompress in
    the same pass. Under ``ZEPHON_IMMUTABLE_DATA=1`` a remembered checksum is returned
    without reading (and ``sink`` is not called).

    Raises:
        DataError: If the file cannot be read.
    """
    p = Path(path)
    try:
        st = p.stat()
        scope = build_memo()
        skey = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if scope is not None and sink is None and skey in scope:
            return scope[skey]
        memo = _memo_path(p, st) if immutable_data() else None
        if memo is not None and sink is None and memo.exists():
            return str(json.loads(memo.read_text())["checksum"])
        h = Hasher()
        with open(p, "rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
                if sink is not None:
                    sink(block)
        digest = h.hexdigest()
        if scope is not None:
            scope[skey] = digest
        if memo is not None:
            blob = json.dumps({"checksum": digest}).encode()
            atomic_write(memo, lambda f: f.write(blob))
        return digest
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e}", kind=os_error_kind(e)) from None
