"""The nodes of a re-laned lane: its work items with flush markers, and its lane node."""

from __future__ import annotations

from typing import Any, Protocol

from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.core.flush import Flush
from zephon_nodes.engine.lane import Lane, WorkItemNode
from zephon_nodes.engine.windowed import replay
from zephon_nodes.engine.work import WorkItem, WorkSource


class RelanedWindows(Protocol):
    """What a re-laned lane's nodes read of their work source (its windows and drops)."""

    def window_bounds(self, lane: int, window: int) -> tuple[int, int]: ...

    def has_window(self, lane: int, window: int) -> bool: ...

    def leftovers(self, lane: int) -> int: ...

    def leftover_drop(self, lane: int, window: int) -> int: ...

    def work(self, lane: int, i: int) -> WorkItem | None: ...


__all__ = ["RelanedLane", "RelanedWorkItemNode"]


class RelanedWorkItemNode(WorkItemNode):
    """Source of a re-laned lane: its work items with a flush marker after every window.

    In the re-laned pass the windows are the leftovers (whatever their size, even empty),
    then ``K`` items each (see :class:`RelanedWindows`); later passes are plain lanes.
    State adds ``"window"`` (several empty windows may start at the same position).
    """

    WINDOW_KEY = "window"

    def __init__(self, work_source: WorkSource, lane: int, flush_every: int) -> None:
        super().__init__(work_source, lane, flush_every)
        self.relaned: RelanedWindows = work_source  # type: ignore[assignment]
        self._w = 0
        self._start, self._stop = self.relaned.window_bounds(lane, 0)

    def _enter(self, window: int) -> None:
        self._w = window
        self._start, self._stop = self.relaned.window_bounds(self.lane, window)

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at window 0 of pass 0, or at the position in ``initial_state``."""
        super().reset(initial_state)
        if self._pass:
            return
        if initial_state is not None and self.WINDOW_KEY in initial_state:
            window = int(initial_state[self.WINDOW_KEY])
        elif initial_state is None:
            window = 0
        else:  # a plain index state: the window holding it
            window = 0
            while self.relaned.window_bounds(self.lane, window)[1] <= self._index:
                if not self.relaned.has_window(self.lane, window):
                    break
                window += 1
        self._enter(window)
        if not self._start <= self._index <= max(self._stop, self._start):
            raise CheckpointError(
                f"re-laned lane {self.lane}: work item {self._index} is not in window {window} "
                f"[{self._start}, {self._stop})"
            )

    def next(self) -> WorkItem | Flush:
        """Return the next work item, or the flush marker that closes a window."""
        if self._pass:
            return super().next()
        while True:
            if self._index >= self._stop:
                w = self._w
                if w < self.relaned.leftovers(self.lane) or self._index > self._start:
                    self._enter(w + 1)
                    self._index = self._start
                    self._flushed = True
                    return Flush(w)
                raise StopIteration
            item = self.relaned.work(self.lane, self._index)
            if item is None:  # pragma: no cover - the geometry says it exists
                self._stop = self._index
                continue
            self._index += 1
            self._flushed = False
            return item

    def get_state(self) -> dict[str, Any]:
        """Return the next item index, its window and the pass."""
        state = super().get_state()
        if not self._pass:
            state[self.WINDOW_KEY] = self._w
        return state

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state at the first item of flush window ``window`` (current pass)."""
        if self._pass:
            return super().state_at_window(window)
        start = self.relaned.window_bounds(self.lane, window)[0]
        return {
            self.INDEX_KEY: start,
            self.FLUSHED_KEY: True,
            self.PASS_KEY: self._pass,
            self.WINDOW_KEY: window,
        }


class RelanedLane(Lane):
    """A re-laned lane: drops the samples its old lane had consumed of each leftover window.

    Positions count the dropped samples as consumed: ``[w, c]`` replays window ``w`` and
    drops ``max(c, dropped(w))`` samples.
    """

    def __init__(self, source: BaseNode[Any], lane: int, relaned: RelanedWindows) -> None:
        super().__init__(source, lane)
        self.relaned = relaned

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at the re-lane point (window 0), or replay to ``initial_state``."""
        state = dict(initial_state) if initial_state is not None else {}
        window = int(state.get(self.WINDOW_KEY, 0))
        p = int(state.get(self.PASS_KEY, 0))
        if initial_state is not None and p:
            super().reset(initial_state)
            return
        consumed = int(state.get(self.CONSUMED_KEY, 0))
        state[self.WINDOW_KEY] = window
        state[self.CONSUMED_KEY] = max(consumed, self.relaned.leftover_drop(self.lane, window))
        state[self.PASS_KEY] = p
        super().reset(state)

    def _enter_window(self) -> None:
        """In the re-laned pass, drop what the old lane had consumed of a leftover window."""
        if self._pass:
            return
        n = self.relaned.leftover_drop(self.lane, self._window)

        def short(k: int) -> str:
            return (
                f"re-laned lane {self.lane}: the lineage says {n} samples of window "
                f"{self._window} were consumed before the re-lane, but the window holds "
                f"only {self._consumed + k}"
            )

        replay(lambda: next(self.source), n, short, short)
        self._consumed += n
