"""The local cache directory: record indexes and decompressed shards, written atomically."""

from __future__ import annotations

import hashlib
from pathlib import Path

from zephon_nodes.core.atomic import atomic_write, umask_mode
from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import current

__all__ = ["atomic_write", "cache_dir", "cache_key", "umask_mode"]


def cache_dir() -> Path:
    """Return the directory holding record indexes and decompressed shards (created).

    The current settings' ``cache_dir`` (``ZEPHON_CACHE_DIR``, default
    ``~/.cache/zephon_nodes``; see :mod:`zephon_nodes.core.settings`).

    Raises:
        DataError: It cannot be created (naming it).
    """
    try:
        return current().cache_root
    except OSError as e:
        raise DataError(
            f"cache directory {current().cache_dir}: cannot create it ({e.strerror or e}); "
            "set ZEPHON_CACHE_DIR to a writable folder"
        ) from None


def cache_key(path: Path) -> str:
    """Return a 32-hex-digit key for ``path`` (resolved path, size, mtime)."""
    st = path.stat()
    text = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
