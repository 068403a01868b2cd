"""Map operators for the Ray runner tests (imported by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def _ray_node() -> str | None:
    """The Ray node id when running inside a Ray worker process, else None."""
    import sys

    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    if ctx.worker.mode != ray.WORKER_MODE:
        return None
    return str(ctx.get_node_id())


def tag_node(text: str, log_dir: str, delay: float) -> str:
    """Identity on the text; records which Ray node ran it (a file per node and pid)."""
    node = _ray_node()
    if node is not None:
        Path(log_dir, f"{node}-{os.getpid()}").touch()
    time.sleep(delay)
    return text


def die_in_ray_worker(text: str, log_dir: str, prefix: str) -> str:
    """Identity, except in a Ray worker on a text starting with ``prefix``: log, kill the worker."""
    if text.startswith(prefix) and _ray_node() is not None:
        Path(log_dir, f"attempt-{os.getpid()}").touch()
        os._exit(1)
    return text
