"""AccumulatorNode: the node that runs an accumulator between flush points."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.core.flush import Flush, is_flush
from zephon_nodes.engine.metrics import OperatorClock
from zephon_nodes.engine.windowed import WindowedNode, replay
from zephon_nodes.operators.accumulator import Accumulator, LazyAccumulator

__all__ = ["AccumulatorNode"]


_DONE = object()


class _Boundary:
    """A flush marker queued behind the flushed outputs, with the next window's start."""

    __slots__ = ("marker", "start")

    def __init__(self, marker: Flush, start: dict[str, Any]) -> None:
        self.marker = marker
        self.start = start


class AccumulatorNode(WindowedNode):
    """Run an accumulator over ``source``, flushing it at every :class:`Flush` marker.

    State is flush/replay: the source's state at the start of the current window, the window
    index and the number of outputs already yielded in it. Restore resets the source there,
    runs a fresh accumulator and drops that many outputs, so the state never holds buffered
    data, whatever the buffer size.

    Args:
        source: Upstream node yielding items and :class:`Flush` markers.
        make: ``make(window) -> Accumulator``; seed any randomness from the window (and lane).
    """

    def __init__(self, source: BaseNode[Any], make: Callable[[int], Accumulator]) -> None:
        super().__init__(source)
        self.make = make
        self._out: deque[Any] = deque()
        self._acc: Accumulator
        self._lazy: LazyAccumulator | None = None  # _acc, if it can feed lazily
        self._name = ""  # the clock's operator name: _acc's class
        self._new_accumulator()  # window 0's
        self._source_done = False
        self.clock = OperatorClock()  # busy time of the accumulator (feed and flush)
        self._feeding: Iterator[Any] | None = None

    def _new_accumulator(self) -> None:
        """Make the accumulator of the current window (and note once if it feeds lazily)."""
        self._acc = self.make(self._window)
        # Checked once per window, not per item: a runtime protocol check costs ~10-30 us.
        self._lazy = self._acc if isinstance(self._acc, LazyAccumulator) else None
        self._name = type(self._acc).__name__

    def _feed(self, item: Any) -> None:
        if self._lazy is not None:
            self._feeding = iter(self._lazy.feed_lazily(item))
        else:
            self._out.extend(self._timed(self._acc.feed, item))

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning, or replay to the position in ``initial_state``."""
        super().reset(initial_state)
        self._out.clear()
        self._feeding = None
        self._source_done = False
        skip = self._restart(initial_state)
        self._new_accumulator()
        replay(
            self.next,
            skip,
            lambda _: f"replay ended before {skip} outputs of window {self._window}",
            lambda _: (
                f"window {self._window} holds fewer than {skip} outputs; the state does "
                f"not belong to this recipe"
            ),
        )

    def next(self) -> Any:
        """Return the next output or :class:`Flush` marker."""
        while not self._out:
            if self._feeding is not None:
                t0 = time.perf_counter()
                out = next(self._feeding, _DONE)
                self.clock.add_one(self._name, time.perf_counter() - t0)
                if out is not _DONE:
                    self._out.append(out)
                    break
                self._feeding = None
            if self._source_done:
                raise StopIteration
            try:
                item = next(self.source)
            except StopIteration:
                self._source_done = True
                self._out.extend(self._timed(self._acc.flush))
                continue
            if is_flush(item):
                self._out.extend(self._timed(self._acc.flush))
                self._out.append(_Boundary(item, self.source.get_state()))
            else:
                self._feed(item)
                del item  # a huge document's tokens: held by the lazy feed only
        out = self._out.popleft()
        if type(out) is _Boundary:
            self._window = out.marker.window + 1
            self._window_start = out.start
            self._emitted = 0
            self._new_accumulator()
            return out.marker
        self._emitted += 1
        return out

    def _timed(self, fn: Callable[..., Iterable[Any]], *args: Any) -> Iterable[Any]:
        t0 = time.perf_counter()
        out = list(fn(*args))
        self.clock.add_one(self._name, time.perf_counter() - t0)
        return out
