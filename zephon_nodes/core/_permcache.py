"""Long seeded permutations, remembered in the cache directory and checked when loaded.

:func:`zephon_nodes.core.seeding.permutation` is a pure function of its length and key;
for long ones the sort is the cost, so the result is kept in ``$ZEPHON_CACHE_DIR`` with the
xxh3-128 of its bytes, and a file that does not match its checksum, length or type is
ignored (recomputed), never used.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import xxhash

__all__ = ["recall", "remember"]


def _path(n: int, key: int) -> Path:
    from zephon_nodes.io.storage.cache import cache_dir

    return cache_dir() / f"perm-{n}-{key:016x}.npy"


def recall(n: int, key: int) -> np.ndarray | None:
    """The remembered permutation of length ``n`` and ``key``, if intact; else None."""
    try:
        with open(_path(n, key), "rb") as f:
            blob = f.read()
    except OSError:
        return None
    digest, _, body = blob.partition(b"\n")
    if xxhash.xxh3_128_hexdigest(body).encode() != digest:
        return None
    try:
        perm = np.load(io.BytesIO(body), allow_pickle=False)
    except ValueError:
        return None
    if perm.dtype != np.int64 or perm.shape != (n,):
        return None
    return perm


def remember(n: int, key: int, perm: np.ndarray) -> None:
    """Keep ``perm`` for :func:`recall` (best effort: a read-only cache is fine)."""
    from zephon_nodes.io.storage.cache import atomic_write

    buf = io.BytesIO()
    np.save(buf, perm, allow_pickle=False)
    body = buf.getvalue()
    blob = xxhash.xxh3_128_hexdigest(body).encode() + b"\n" + body
    with contextlib.suppress(OSError):
        atomic_write(_path(n, key), lambda f: f.write(blob))
