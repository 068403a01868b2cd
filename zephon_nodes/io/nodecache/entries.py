"""What a node cache holds: entries named by a key, written whole by a fetch.

An entry is one whole file (a fetched shard, a decompressed shard, a token-cache record)
stored under ``root/data/`` by the file name :func:`entry_name` gives its key; a
:data:`Fetch` writes it, and a :class:`Cacheable` shard says which entry it reads through.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from zephon_nodes.core.errors import DataError

__all__ = ["CacheFullError", "Cacheable", "Fetch", "entry_name"]

Fetch = Callable[[Path], None]
"""Writes the whole entry to the given path (called with a temporary path inside the cache)."""

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


@runtime_checkable
class Cacheable(Protocol):
    """A shard read through the node cache (what :mod:`~zephon_nodes.io.nodecache.future` plans).

    Attributes:
        cache_key: Identity of the cached file (content checksum or URI + version tag); the
            same string in every process.
        cache_size: Bytes the cached file takes (or an upper bound).
    """

    cache_key: str
    cache_size: int

    def cache_fetch(self, dest: Path) -> None:
        """Write the whole cached file to ``dest``."""


class CacheFullError(DataError):
    """The node cache cannot make room for an entry within its limit."""


@functools.lru_cache(maxsize=4096)  # a plan names every upcoming access after most steps
def entry_name(key: str) -> str:
    """Return the file name for ``key`` (the key itself when safe, else a hash)."""
    if _SAFE.fullmatch(key) and not key.endswith((".tmp", ".json")):
        return key
    return "h-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]
