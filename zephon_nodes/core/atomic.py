"""Atomic file writes: a temporary file in the target's folder, renamed over the target."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write"]


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
