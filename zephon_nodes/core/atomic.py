"""Atomic file writes: a temporary file in the target's folder, renamed over the target.

The file gets the mode ``open`` would give it (0666 less the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "umask_mode"]


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
