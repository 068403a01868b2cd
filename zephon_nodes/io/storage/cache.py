"""The local cache directory: record indexes and decompressed shards, written atomically."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from zephon_nodes.core.settings import current

__all__ = ["atomic_write", "cache_dir", "cache_key"]


def cache_dir() -> Path:
    """Return the directory holding record indexes and decompressed shards (created).

    The current settings' ``cache_dir`` (``ZEPHON_CACHE_DIR``, default
    ``~/.cache/zephon_nodes``; see :mod:`zephon_nodes.core.settings`).
    """
    return current().cache_root


def cache_key(path: Path) -> str:
    """Return a 32-hex-digit key for ``path`` (resolved path, size, mtime)."""
    st = path.stat()
    text = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def atomic_write(target: Path, writer: Any) -> None:
    """Write ``target`` through ``writer(file)`` into a temporary file, then rename it."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
