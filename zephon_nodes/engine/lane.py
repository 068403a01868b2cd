"""A lane: one ordered stream of work items through the operator chain, with flush points."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.flush import Flush, is_flush
from zephon_nodes.engine.windowed import replay
from zephon_nodes.engine.work import WorkItem, WorkSource

__all__ = [
    "Lane",
    "LaneNodes",
    "WindowRestorable",
    "WorkItemNode",
    "chain_nodes",
    "check_window_restore",
]


@runtime_checkable
class WindowRestorable(Protocol):
    """A node that can restart its stream at a flush window (every node inside a lane)."""

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state that starts the stream at flush window ``window``."""
        ...


def _children(node: BaseNode[Any]) -> list[BaseNode[Any]]:
    """The nodes ``node`` reads from: its public attributes that are nodes."""
    return [v for k, v in vars(node).items() if not k.startswith("_") and isinstance(v, BaseNode)]


def chain_nodes(node: BaseNode[Any]) -> list[BaseNode[Any]]:
    """``node`` and every node it reads from, nearest first (a lane's chain, end to start)."""
    out: list[BaseNode[Any]] = []
    todo = [node]
    while todo and len(out) < 1024:
        n = todo.pop()
        out.append(n)
        todo.extend(reversed(_children(n)))
    return out


def _work_item_nodes(node: BaseNode[Any]) -> list[WorkItemNode]:
    """The WorkItemNodes a chain starts from."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        if isinstance(n, WorkItemNode):
            out.append(n)
        else:
            todo.extend(_children(n))
    return out


def check_window_restore(node: BaseNode[Any], where: str = "a lane") -> None:
    """Refuse a chain that cannot restore at a flush window.

    A lane restores by asking its chain for the state at the start of a window
    (``state_at_window``); every node between the lane's work items and the lane must
    provide it. Nodes that do not (torchdata's own ``Mapper``, ``Batcher``, a node written
    like torchdata's examples) go into a lane wrapped in
    :class:`~zephon_nodes.engine.torchdata_stage.TorchdataStage`.

    Raises:
        RecipeError: Naming the first node without window restore and what to do.
    """
    path: list[str] = []
    todo = [node]
    while todo:
        n = todo.pop()
        path.append(type(n).__name__)
        if not isinstance(n, WindowRestorable):
            chain = " <- ".join(path)
            raise RecipeError(
                f"{type(n).__name__} cannot be restored inside {where} (chain: {chain}): it has "
                f"no state_at_window(window), so a checkpoint could not replay its flush window; "
                f"wrap it in zephon_nodes.TorchdataStage(source, lambda feed: "
                f"{type(n).__name__}(feed, ...))"
            )
        if isinstance(n, WorkItemNode):
            continue
        todo.extend(_children(n))


class WorkItemNode(BaseNode[WorkItem | Flush]):
    """Source of a lane: work items ``work(lane, 0), work(lane, 1), ...`` with flush markers.

    After every ``flush_every`` items (and after the last item of a finite stream) it yields
    ``Flush(window)``. State: the next item index (a single integer), and the pass (see
    :meth:`~zephon_nodes.engine.work.WorkSource.for_pass`; a reset without a state is pass 0).

    Args:
        work_source: The recipe's work source.
        lane: Lane index.
        flush_every: Work items per flush window (``K``).
    """

    INDEX_KEY = "index"
    FLUSHED_KEY = "flushed"
    PASS_KEY = "pass"

    def __init__(self, work_source: WorkSource, lane: int, flush_every: int) -> None:
        super().__init__()
        if not 0 <= lane < work_source.num_lanes:
            raise ValueError(f"{lane=} must be in [0, {work_source.num_lanes})")
        self.work_source = work_source
        self.lane = lane
        self.flush_every = flush_every
        self._index = 0
        self._flushed = True
        self._pass = 0
        self._source: WorkSource | None = work_source

    def set_pass(self, p: int) -> None:
        """Read pass ``p`` of the work source from now on (states then carry it)."""
        if p < 0:
            raise CheckpointError(f"lane {self.lane}: pass={p} must be >= 0")
        self._pass = p
        self._source = self.work_source.for_pass(p)

    @property
    def pass_index(self) -> int:
        """The pass being read."""
        return self._pass

    @property
    def next_index(self) -> int:
        """Index of the next work item this node will yield."""
        return self._index

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start at item 0 of pass 0, or at the item index and pass in ``initial_state``."""
        super().reset(initial_state)
        if initial_state is None:
            self._index, self._flushed = 0, True
            self.set_pass(0)
        else:
            self._index = int(initial_state[self.INDEX_KEY])
            self._flushed = bool(initial_state[self.FLUSHED_KEY])
            self.set_pass(int(initial_state.get(self.PASS_KEY, 0)))

    def next(self) -> WorkItem | Flush:
        """Return the next work item, or the flush marker that closes a window."""
        k = self.flush_every
        if self._index % k == 0 and not self._flushed:
            self._flushed = True
            return Flush(self._index // k - 1)
        item = self._source.work(self.lane, self._index) if self._source is not None else None
        if item is None:
            if not self._flushed:
                self._flushed = True
                return Flush(self._index // k)
            raise StopIteration
        self._index += 1
        self._flushed = False
        return item

    def get_state(self) -> dict[str, Any]:
        """Return the next item index, whether its window boundary was flushed, the pass."""
        return {self.INDEX_KEY: self._index, self.FLUSHED_KEY: self._flushed, "pass": self._pass}

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state at the first item of flush window ``window`` (current pass)."""
        return {
            self.INDEX_KEY: window * self.flush_every,
            self.FLUSHED_KEY: True,
            "pass": self._pass,
        }


class Lane(BaseNode[dict[str, Any]]):
    """A lane's samples in order, with a checkpoint of two integers.

    Wraps the end of a lane's operator chain (whose nodes all provide ``state_at_window``;
    a chain without it is refused here, see :func:`check_window_restore`),
    drops the flush markers and counts them. State: ``{"window": w, "consumed": c}``, the
    flush window holding the next sample and how many of its samples were already taken.
    Restore replays window ``w`` from its first work item and drops ``c`` samples.

    Args:
        source: Last node of the lane's operator chain.
        lane: Lane index.
    """

    WINDOW_KEY = "window"
    CONSUMED_KEY = "consumed"
    PASS_KEY = "pass"

    def __init__(self, source: BaseNode[Any], lane: int) -> None:
        super().__init__()
        check_window_restore(source, f"lane {lane}")
        self.source = source
        self.lane = lane
        self._items = _work_item_nodes(source)
        self._pass = 0
        self._window = 0
        self._consumed = 0
        self._last: Any = None

    @property
    def last_sample(self) -> Any:
        """The sample the lane handed out last (or replayed last in a restore), or None.

        ``None`` when the lane has handed out no sample of its current window (after a
        reset to ``[w, 0]``). A reference, not a copy: the state's check of it
        (:mod:`zephon_nodes.state.last_sample`) is computed only when a state is taken.
        """
        return self._last

    def _take(self) -> Any:
        """The source's next output (a restore's replay): remembered as the last sample."""
        self._last = item = next(self.source)
        return item

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start the lane's stream, or replay to the position in ``initial_state``."""
        super().reset(initial_state)
        self._last = None
        if initial_state is None:
            self.source.reset(None)
            self._window, self._consumed, self._pass = 0, 0, 0
            return
        window = int(initial_state[self.WINDOW_KEY])
        consumed = int(initial_state[self.CONSUMED_KEY])
        p = int(initial_state.get(self.PASS_KEY, 0))
        if window < 0 or consumed < 0 or p < 0:
            raise CheckpointError(
                f"lane {self.lane}: {window=}, {consumed=} and pass={p} must be >= 0"
            )
        if p and not self._items:
            raise CheckpointError(
                f"lane {self.lane}: pass {p} asked, but the lane's chain has no WorkItemNode"
            )
        for items in self._items:
            items.set_pass(p)
        self._pass = p
        assert isinstance(self.source, WindowRestorable)  # checked when the lane was built
        self.source.reset(self.source.state_at_window(window))
        self._window, self._consumed = window, 0
        replay(
            self._take,
            consumed,
            lambda _: (
                f"lane {self.lane}: the checkpoint says {consumed} samples of window "
                f"{window} were consumed, but the stream ends before that"
            ),
            lambda k: (
                f"lane {self.lane}: the checkpoint says {consumed} samples of window "
                f"{window} were consumed, but the window holds only {k}"
            ),
        )
        self._consumed = consumed

    def next(self) -> dict[str, Any]:
        """Return the lane's next sample."""
        while True:
            item = next(self.source)
            if is_flush(item):
                self._window = item.window + 1
                self._consumed = 0
                self._enter_window()
                continue
            self._consumed += 1
            self._last = item
            return item

    def _enter_window(self) -> None:
        """Called when the lane enters a new flush window (a re-laned lane drops samples)."""

    def get_state(self) -> dict[str, Any]:
        """Return ``{"window": w, "consumed": c}`` (and ``"pass"`` after the first pass)."""
        state = {self.WINDOW_KEY: self._window, self.CONSUMED_KEY: self._consumed}
        if self._pass:
            state[self.PASS_KEY] = self._pass
        return state


class LaneNodes(ABC):
    """A work source that builds its lanes' first and last nodes itself (a re-laned stream).

    :meth:`~zephon_nodes.Pipeline.build_lane` uses these instead of :class:`WorkItemNode`,
    :class:`Lane` and the recipe's ``(seed, lane, window)`` shuffle seeds.
    """

    @abstractmethod
    def item_node(self, lane: int, flush_every: int) -> WorkItemNode:
        """The source node of lane ``lane``."""

    @abstractmethod
    def lane_node(self, source: BaseNode[Any], lane: int) -> Lane:
        """The lane node over the end of lane ``lane``'s chain."""

    @abstractmethod
    def lane_seed(self, lane: int, items: WorkItemNode, window: int) -> tuple[int, int, int]:
        """Shuffle seed parts of ``window`` of ``lane`` in the pass ``items`` is reading."""
