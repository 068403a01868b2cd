"""Shuffle: a seeded per-lane buffer, drained in seeded order at every flush."""

from __future__ import annotations

from typing import Any

from zephon_nodes.core.seeding import SplitMix64

__all__ = ["ShuffleBuffer"]

_SHUFFLE_TAG = 0x5348554C  # "SHUL"


class ShuffleBuffer:
    """Accumulator: hold up to ``buffer_size`` items and emit a random one per new item.

    The generator is seeded from ``(seed, lane, window)`` (SplitMix64, stable across NumPy
    versions), so a lane's order depends only on the recipe. At a flush the remaining items
    are emitted in seeded random order and the buffer is empty.

    Args:
        buffer_size: Items held (>= 1).
        seed: Recipe seed.
        lane: Lane index.
        window: Flush window index.
    """

    def __init__(self, buffer_size: int, seed: int, lane: int, window: int) -> None:
        if buffer_size < 1:
            raise ValueError(f"{buffer_size=} must be >= 1")
        self.buffer_size = buffer_size
        self._rng = SplitMix64(seed, lane, window, _SHUFFLE_TAG)
        self._buf: list[Any] = []

    def feed(self, item: Any) -> list[Any]:
        """Add ``item``; once full, return one item chosen at random."""
        if len(self._buf) < self.buffer_size:
            self._buf.append(item)
            return []
        j = self._rng.below(self.buffer_size)
        out = self._buf[j]
        self._buf[j] = item
        return [out]

    def flush(self) -> list[Any]:
        """Return every held item in seeded random order (Fisher-Yates)."""
        buf = self._buf
        for i in range(len(buf) - 1, 0, -1):
            j = self._rng.below(i + 1)
            buf[i], buf[j] = buf[j], buf[i]
        self._buf = []
        return buf
