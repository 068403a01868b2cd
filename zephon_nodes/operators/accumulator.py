"""Accumulators: single-threaded, order-sensitive state between two flush points."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

__all__ = ["Accumulator", "LazyAccumulator"]


class Accumulator(Protocol):
    """Single-threaded, order-sensitive state between two flush points (packing, shuffling).

    A new accumulator is made for every flush window, so nothing it holds can cross a flush.
    An accumulator may also have ``feed_lazily(item) -> Iterator``: the same outputs as
    ``feed``, computed as they are taken (a huge document is then packed a few samples at a
    time instead of all at once): a :class:`LazyAccumulator`, fed so by the engine's
    ``AccumulatorNode``.
    """

    def feed(self, item: Any) -> Iterable[Any]:
        """Take one input; return the outputs that are complete now."""
        ...

    def flush(self) -> Iterable[Any]:
        """Return everything still held (padded, drained, ...); called once per window."""
        ...


@runtime_checkable
class LazyAccumulator(Accumulator, Protocol):
    """An accumulator that can also compute ``feed``'s outputs as they are taken."""

    def feed_lazily(self, item: Any) -> Iterator[Any]:
        """The outputs of ``feed(item)``, one at a time."""
        ...
