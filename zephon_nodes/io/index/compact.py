"""A dataset index's shard entries kept compact in memory: one byte string, parsed on lookup.

A parsed manifest holds a dict per shard (its keys, numbers and lists as Python objects:
0.4-0.65 KB per shard), and a process that looks a shard up keeps its manifest for the rest
of its life. :class:`CompactShards` keeps the same entries as their compact JSON text in one
byte string, names sorted in another (UTF-8 byte order, which is code point order), with
int64 offsets: about the manifest's own size per shard. A lookup is a binary search over the
names and one ``json.loads`` of the entry; the entries looked up are remembered, so a change
made to one (the version tag of a local copy that was re-hashed) holds for the process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["CompactShards"]

_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


class CompactShards(Mapping[str, Any]):
    """The ``{relative name: entry}`` table of a manifest, as two byte strings.

    Args:
        shards: The parsed manifest's ``shards`` object (consumed: not kept).
    """

    def __init__(self, shards: Mapping[str, Any]) -> None:
        keys = sorted((name.encode("utf-8", "surrogatepass"), name) for name in shards)
        self._names = b"".join(k for k, _ in keys)
        self._name_ends = np.cumsum([len(k) for k, _ in keys], dtype=np.int64)
        texts = [_ENCODE(shards[name]).encode("utf-8") for _, name in keys]
        self._entries = b"".join(texts)
        self._entry_ends = np.cumsum([len(t) for t in texts], dtype=np.int64)
        self._looked_up: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._name_ends.shape[0])

    def _name(self, k: int) -> bytes:
        start = int(self._name_ends[k - 1]) if k else 0
        return self._names[start : int(self._name_ends[k])]

    def _row(self, name: str) -> int:
        """The row of ``name``, or -1."""
        key = name.encode("utf-8", "surrogatepass")
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._name(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self) and self._name(lo) == key else -1

    def __getitem__(self, name: str) -> Any:
        with self._lock:
            if name in self._looked_up:
                return self._looked_up[name]
        k = self._row(name) if isinstance(name, str) else -1
        if k < 0:
            raise KeyError(name)
        start = int(self._entry_ends[k - 1]) if k else 0
        entry = json.loads(self._entries[start : int(self._entry_ends[k])])
        with self._lock:
            return self._looked_up.setdefault(name, entry)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._looked_up or self._row(name) >= 0)

    def __iter__(self) -> Iterator[str]:
        for k in range(len(self)):
            yield self._name(k).decode("utf-8", "surrogatepass")

    def nbytes(self) -> int:
        """Bytes held (names, entries, offsets; not the entries looked up)."""
        return (
            len(self._names)
            + len(self._entries)
            + int(self._name_ends.nbytes)
            + int(self._entry_ends.nbytes)
        )
