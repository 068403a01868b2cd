"""A lane: one ordered stream of work items through the operator chain, with flush points."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.engine.flush import Flush, is_flush
from zephon_nodes.engine.work import WorkItem, WorkSource
from zephon_nodes.errors import CheckpointError

__all__ = ["Lane", "WorkItemNode"]


class WorkItemNode(BaseNode[WorkItem | Flush]):
    """Source of a lane: work items ``work(lane, 0), work(lane, 1), ...`` with flush markers.

    After every ``flush_every`` items (and after the last item of a finite stream) it yields
    ``Flush(window)``. State: the next item index (a single integer).

    Args:
        work_source: The recipe's work source.
        lane: Lane index.
        flush_every: Work items per flush window (``K``).
    """

    INDEX_KEY = "index"
    FLUSHED_KEY = "flushed"

    def __init__(self, work_source: WorkSource, lane: int, flush_every: int) -> None:
        super().__init__()
        if not 0 <= lane < work_source.num_lanes:
            raise ValueError(f"{lane=} must be in [0, {work_source.num_lanes})")
        self.work_source = work_source
        self.lane = lane
        self.flush_every = flush_every
        self._index = 0
        self._flushed = True

    @property
    def next_index(self) -> int:
        """Index of the next work item this node will yield."""
        return self._index

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at item 0, or at the item index in ``initial_state``."""
        super().reset(initial_state)
        if initial_state is None:
            self._index, self._flushed = 0, True
        else:
            self._index = int(initial_state[self.INDEX_KEY])
            self._flushed = bool(initial_state[self.FLUSHED_KEY])

    def next(self) -> WorkItem | Flush:
        """Return the next work item, or the flush marker that closes a window."""
        k = self.flush_every
        if self._index % k == 0 and not self._flushed:
            self._flushed = True
            return Flush(self._index // k - 1)
        item = self.work_source.work(self.lane, self._index)
        if item is None:
            if not self._flushed:
                self._flushed = True
                return Flush(self._index // k)
            raise StopIteration
        self._index += 1
        self._flushed = False
        return item

    def get_state(self) -> dict[str, Any]:
        """Return the next item index and whether its window boundary was flushed."""
        return {self.INDEX_KEY: self._index, self.FLUSHED_KEY: self._flushed}

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state at the first item of flush window ``window``."""
        return {self.INDEX_KEY: window * self.flush_every, self.FLUSHED_KEY: True}


class Lane(BaseNode[dict[str, Any]]):
    """A lane's samples in order, with a checkpoint of two integers.

    Wraps the end of a lane's operator chain (whose nodes all provide ``state_at_window``),
    drops the flush markers and counts them. State: ``{"window": w, "consumed": c}``, the
    flush window holding the next sample and how many of its samples were already taken.
    Restore replays window ``w`` from its first work item and drops ``c`` samples.

    Args:
        source: Last node of the lane's operator chain.
        lane: Lane index.
    """

    WINDOW_KEY = "window"
    CONSUMED_KEY = "consumed"

    def __init__(self, source: BaseNode[Any], lane: int) -> None:
        super().__init__()
        self.source = source
        self.lane = lane
        self._window = 0
        self._consumed = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start the lane's stream, or replay to the position in ``initial_state``."""
        super().reset(initial_state)
        if initial_state is None:
            self.source.reset(None)
            self._window, self._consumed = 0, 0
            return
        window = int(initial_state[self.WINDOW_KEY])
        consumed = int(initial_state[self.CONSUMED_KEY])
        if window < 0 or consumed < 0:
            raise CheckpointError(f"lane {self.lane}: {window=} and {consumed=} must be >= 0")
        self.source.reset(self.source.state_at_window(window))  # type: ignore[attr-defined]
        self._window, self._consumed = window, 0
        for _ in range(consumed):
            try:
                item = next(self.source)
            except StopIteration:
                raise CheckpointError(
                    f"lane {self.lane}: the checkpoint says {consumed} samples of window "
                    f"{window} were consumed, but the stream ends before that"
                ) from None
            if is_flush(item):
                raise CheckpointError(
                    f"lane {self.lane}: the checkpoint says {consumed} samples of window "
                    f"{window} were consumed, but the window holds only {self._consumed}"
                )
            self._consumed += 1

    def next(self) -> dict[str, Any]:
        """Return the lane's next sample."""
        while True:
            item = next(self.source)
            if is_flush(item):
                self._window = item.window + 1
                self._consumed = 0
                continue
            self._consumed += 1
            return item

    def get_state(self) -> dict[str, Any]:
        """Return ``{"window": w, "consumed": c}``."""
        return {self.WINDOW_KEY: self._window, self.CONSUMED_KEY: self._consumed}
