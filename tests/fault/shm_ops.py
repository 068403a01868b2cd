"""Picklable operators for the shared-memory tests (run in spawned worker processes)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from zephon_nodes.engine import shm


def arrays(n: int) -> dict[str, np.ndarray]:
    """A large and a small array."""
    return {"big": np.arange(n, dtype=np.int32), "small": np.arange(5, dtype=np.int64)}


def export_then(arg: tuple[str, str]) -> None:
    """Leave a result's shared-memory file behind, then die (``"kill"``) or hang (``"hang"``)."""
    prefix, how = arg
    shm._export(np.zeros(200_000, dtype=np.int32), prefix)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
