"""TorchdataStage: run any torchdata ``BaseNode`` inside a lane, one flush window at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.core.flush import Flush, is_flush
from zephon_nodes.engine.windowed import WindowedNode, replay
from zephon_nodes.errors import CheckpointError

__all__ = ["TorchdataStage"]


class _WindowFeed(BaseNode[Any]):
    """The wrapped node's source: the items of one flush window, then StopIteration.

    It never resets the lane upstream (the stage positions it) and stops at the window's
    flush marker, which it keeps for the stage, so the wrapped node never sees a marker.
    Once closed (the stage moved on), it yields nothing: a reader thread of an abandoned
    torchdata iterator can no longer touch the upstream.
    """

    def __init__(self, stage: TorchdataStage) -> None:
        super().__init__()
        self._stage = stage
        self.marker: Flush | None = None
        self.after: dict[str, Any] | None = None
        self.ended = False
        self.closed = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)

    def next(self) -> Any:
        stage = self._stage
        with stage._lock:
            if self.closed or self.ended or self.marker is not None:
                raise StopIteration
            try:
                item = next(stage.source)
            except StopIteration:
                self.ended = True
                raise
            if is_flush(item):
                self.marker = item
                self.after = stage.source.get_state()
                raise StopIteration
            return item

    def get_state(self) -> dict[str, Any]:
        return {}

    def drain(self) -> None:
        """Read and drop what is left of the window (the wrapped node stopped early)."""
        while True:
            try:
                self.next()
            except StopIteration:
                return


class TorchdataStage(WindowedNode):
    """Put an arbitrary torchdata node into a lane's chain, with exact restore.

    ``make(feed)`` builds the node over ``feed``, a node yielding the items of one flush
    window. The stage builds a fresh node for every window, so the node needs no knowledge
    of windows and never sees a flush marker: the stage keeps the markers outside it and
    passes them on after the node's last output of the window. A node that stops early
    (a ``Header``-like node) has the rest of its window read and dropped.

    State is flush/replay, as for an accumulator: the upstream state at the start of the
    current window, the window and the outputs already yielded in it. The wrapped node's own
    state is never stored, so any ``BaseNode`` works (torchdata's ``Mapper``,
    ``ParallelMapper`` with ``in_order=True``, ``Batcher``, a node of your own), provided its
    output depends only on the window's items: no randomness that is not seeded from the
    items, and no ``ParallelMapper(in_order=False)`` (its output order depends on timing).

    Costs: one node built and reset per window (a thread ``ParallelMapper`` starts
    ``num_workers + 2`` threads on each reset, ~100 ms); a restore replays at most one
    window.

    Args:
        source: Upstream node of the lane (yields items and flush markers; provides
            ``state_at_window``).
        make: ``make(feed) -> BaseNode`` building the wrapped node over ``feed``.
        name: Name used in messages.
    """

    def __init__(
        self,
        source: BaseNode[Any],
        make: Callable[[BaseNode[Any]], BaseNode[Any]],
        name: str | None = None,
    ) -> None:
        super().__init__(source)
        self.make = make
        self.name = name or getattr(make, "__name__", type(make).__name__)
        self._lock = threading.Lock()
        self._feed: _WindowFeed | None = None
        self._node: BaseNode[Any] | None = None
        self._done = False
        self._error: BaseException | None = None

    def _close(self) -> None:
        if self._feed is not None:
            with self._lock:
                self._feed.closed = True
        self._feed, self._node = None, None

    def _open(self) -> None:
        """Start the wrapped node on the window starting at the upstream's position."""
        self._close()
        self._feed = _WindowFeed(self)
        node = self.make(self._feed)
        if not isinstance(node, BaseNode):
            raise TypeError(
                f"stage {self.name!r}: make(feed) returned {type(node).__name__}, expected a "
                f"torchdata BaseNode"
            )
        node.reset(None)
        self._node = node

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning, or replay to the position in ``initial_state``."""
        super().reset(initial_state)
        self._close()
        self._done, self._error = False, None
        skip = self._restart(initial_state)
        self._open()
        replay(
            self.next,
            skip,
            lambda _: (
                f"stage {self.name!r}: replay ended before {skip} outputs of window {self._window}"
            ),
            lambda _: (
                f"stage {self.name!r}: window {self._window} holds fewer than {skip} "
                f"outputs; the state does not belong to this recipe"
            ),
        )

    def next(self) -> Any:
        """Return the wrapped node's next output, or the flush marker closing its window."""
        if self._error is not None:
            raise self._error
        if self._done:
            raise StopIteration
        assert self._node is not None and self._feed is not None
        try:
            out = next(self._node)
        except StopIteration:
            feed = self._feed
            feed.drain()
            if feed.marker is None:
                self._close()
                self._done = True
                raise StopIteration from None
            marker, after = feed.marker, feed.after
            self._window = marker.window + 1
            self._window_start = after if after is not None else self.source.get_state()
            self._emitted = 0
            self._open()
            return marker
        except BaseException as e:
            # torchdata's ParallelMapper raises a source's error once, then hangs: keep it.
            self._error = e
            self._close()
            raise
        if is_flush(out):
            raise CheckpointError(
                f"stage {self.name!r}: the wrapped node yielded a flush marker; it must not "
                f"read the lane directly (build it over the feed passed to make)"
            )
        self._emitted += 1
        return out
