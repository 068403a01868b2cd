"""The local cache directory: record indexes and decompressed shards, written atomically."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

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
        from zephon_nodes.errors import DataError

        raise DataError(
            f"cache directory {current().cache_dir}: cannot create it ({e.strerror or e}); "
            "set ZEPHON_CACHE_DIR to a writable folder"
        ) from None


def cache_key(path: Path) -> str:
    """Return a 32-hex-digit key for ``path`` (resolved path, size, mtime)."""
    st = path.stat()
    text = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, for every thread)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(fd: int) -> None:
    """Give a file made by :func:`tempfile.mkstemp` (0600) the mode ``open`` would (umask)."""
    os.fchmod(fd, 0o666 & ~_umask())


def atomic_write(target: Path, writer: Any) -> None:
    """Write ``target`` through ``writer(file)`` into a temporary file, then rename it.

    The file gets the mode ``open`` would give it (0666 less the umask), not mkstemp's 0600.
    """
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        umask_mode(fd)
        with os.fdopen(fd, "wb") as f:
            writer(f)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
