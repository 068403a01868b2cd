"""OrderedParallelMap: run a stateless operator on the rank's worker pool, in order."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import WorkerError, ZephonError
from zephon_nodes.core.flush import is_flush
from zephon_nodes.core.operator import operator_name
from zephon_nodes.engine.metrics import OperatorClock, TimedCall
from zephon_nodes.engine.pool import WorkerPool

__all__ = ["OrderedParallelMap", "prime_lanes", "replaying", "reset_lanes", "run_together"]


def _describe(item: Any) -> str:
    describe = getattr(item, "describe", None)
    if callable(describe):
        return str(describe())
    source = getattr(item, "source", None)  # a batch between two operator stages
    return source if isinstance(source, str) and source else f"item {type(item).__name__}"


class OrderedParallelMap(BaseNode[Any]):
    """Map ``fn`` over the items of ``source`` on a shared pool; results come back in order.

    Items are numbered work groups (e.g. work items of a few dozen documents), submitted up
    to ``lookahead`` ahead and re-sequenced, so the output is the same for any number of
    workers or runner. :class:`~zephon_nodes.core.flush.Flush` markers bypass the pool and keep
    their place. The first failure (exception, timeout, dead worker process) is raised as
    :class:`~zephon_nodes.core.errors.WorkerError` naming the item, and raised again on every
    later call: the node never hangs and never skips an item.

    State: the source's state just before the next item to be yielded (a few integers for a
    lane's work source); in-flight results are recomputed on restore.

    Args:
        source: Upstream node.
        fn: Stateless, picklable (for the process runner) function of one item.
        pool: The rank's shared worker pool.
        lookahead: Items submitted ahead of the consumer. An inline pool (no workers)
            computes one item at a time: looking ahead there gains nothing and, after a
            stage on a real pool, would make the consumer wait for that stage's newest
            items instead of its oldest (a decode in processes between inline stages).
    """

    SOURCE_KEY = "source"

    def __init__(
        self,
        source: BaseNode[Any],
        fn: Callable[[Any], Any],
        pool: WorkerPool,
        lookahead: int = 4,
    ) -> None:
        super().__init__()
        if lookahead < 1:
            raise ValueError(f"{lookahead=} must be >= 1")
        self.source = source
        self.fn = fn
        self.pool = pool
        self.lookahead = lookahead
        self._depth = lookahead if pool.num_workers else 1
        self._queue: deque[tuple[dict[str, Any], Any, Any]] = deque()
        self._source_done = False
        self._error: BaseException | None = None
        self._next_state: dict[str, Any] | None = None
        self._submitted = 0  # items submitted since the last reset: the next one's priority
        self._timed = TimedCall(fn)
        self.clock = OperatorClock()  # busy time per operator, queue depth, skipped records

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning, or from the source state in ``initial_state``."""
        super().reset(initial_state)
        for _, _, fut in self._queue:
            if isinstance(fut, cf.Future):
                fut.cancel()
        self._queue.clear()
        self._submitted = 0
        self._source_done = False
        self._error = None
        self.source.reset(initial_state[self.SOURCE_KEY] if initial_state else None)
        self._next_state = None

    def _fill(self) -> None:
        while not self._source_done and len(self._queue) < self._depth:
            state = self.source.get_state()
            try:
                item = next(self.source)
            except StopIteration:
                self._source_done = True
                self._next_state = state
                break
            if is_flush(item):
                self._queue.append((state, item, None))
            else:
                try:
                    fut = self.pool.submit(self._timed, item, priority=self._submitted)
                    self._submitted += 1
                except Exception as e:  # a broken or closed pool: raised in order, wrapped
                    fut = cf.Future()
                    fut.set_exception(e)
                self._queue.append((state, item, fut))

    def limit_lookahead(self, depth: int | None) -> None:
        """Keep at most ``depth`` items queued from now on (None: the full look-ahead again).

        Items already submitted stay queued; only what :meth:`next` submits changes.
        """
        full = self.lookahead if self.pool.num_workers else 1
        self._depth = full if depth is None else max(1, min(full, depth))

    def prime(self) -> None:
        """Submit the look-ahead now (before the first ``next``): see :func:`prime_lanes`."""
        if self._error is None:
            self._fill()

    def in_flight(self) -> list[Any]:
        """Return the items submitted to the pool whose results are not ready yet, in order."""
        return [item for _, item, fut in list(self._queue) if fut is not None and not fut.done()]

    def next(self) -> Any:
        """Return the next result in source order."""
        if self._error is not None:
            raise self._error
        self._fill()
        if not self._queue:
            raise StopIteration
        self.clock.add_queue(len(self._queue), sum(1 for *_, f in self._queue if f and f.done()))
        _, item, fut = self._queue.popleft()
        if fut is None:
            return item
        try:
            if not fut.done():
                self.pool.hurry(fut)  # needed now: before other lanes' look-ahead
            out, times = fut.result(timeout=self.pool.timeout_s)
            self.clock.add(times)
            self.clock.add_skipped(getattr(out, "skipped", ()))
            return out
        except BaseException as e:
            self._error = self._wrap(e, item)
            for _, _, other in self._queue:
                if isinstance(other, cf.Future):
                    other.cancel()
            raise self._error from e

    def _wrap(self, e: BaseException, item: Any) -> BaseException:
        name = operator_name(self.fn)
        where = _describe(item)
        if isinstance(e, cf.TimeoutError):
            if self.pool.runner == "process":
                self.pool.close()  # kill the blocked worker: it would hang interpreter exit
            return WorkerError(
                f"operator {name!r} gave no result within timeout_s={self.pool.timeout_s} "
                f"for {where} (a worker is blocked or was killed)"
            )
        if isinstance(e, BrokenProcessPool):
            return WorkerError(f"a worker process died while running operator {name!r} on {where}")
        if isinstance(e, ZephonError):
            return e
        if isinstance(e, Exception):
            return WorkerError(f"operator {name!r} failed on {where}: {type(e).__name__}: {e}")
        return e

    def get_state(self) -> dict[str, Any]:
        """Return the source state just before the next item to be yielded (a copy)."""
        if self._queue:
            state = self._queue[0][0]
        elif self._next_state is not None:
            state = self._next_state
        else:
            state = self.source.get_state()
        return {self.SOURCE_KEY: state}

    def state_at_window(self, window: int) -> dict[str, Any]:
        """Return the state that starts the stream at flush window ``window``."""
        return {self.SOURCE_KEY: self.source.state_at_window(window)}  # type: ignore[attr-defined]


def _maps(node: BaseNode[Any]) -> list[OrderedParallelMap]:
    """The OrderedParallelMaps ``node`` reads from (its public node attributes, recursively)."""
    out, todo, seen = [], [node], 0
    while todo and seen < 1024:
        n = todo.pop()
        seen += 1
        if isinstance(n, OrderedParallelMap):
            out.append(n)
        todo.extend(
            v for k, v in vars(n).items() if not k.startswith("_") and isinstance(v, BaseNode)
        )
    return out


# Each lane's first-stage maps, found once per lane (prime_lanes runs at every step).
_FIRST_STAGES: weakref.WeakKeyDictionary[BaseNode[Any], list[OrderedParallelMap]] = (
    weakref.WeakKeyDictionary()
)


def prime_lanes(lanes: Iterable[BaseNode[Any]]) -> None:
    """Submit every lane's look-ahead to the pool at once, before the first step is built.

    A step is built lane after lane; without this, lane ``k`` submits nothing until lanes
    ``0 .. k-1`` have delivered, and the pool spends the wait on their look-ahead. Primed,
    every lane's work is queued up front, and the pool's priorities (work item ``k`` of a
    lane at priority ``k``) run each lane's first items before anyone's look-ahead: the
    first batch waits for the work it needs, in parallel over the lanes. A physical
    setting: the items, their order in each lane and every output are unchanged. Call it
    after a reset (fresh or restored), before the first ``next`` of the lanes; the
    multiplexer's hook-up is one line at the start of building its first step.
    """
    for lane in lanes:
        for m in _first_stages(lane):
            m.prime()


def _first_stages(lane: BaseNode[Any]) -> list[OrderedParallelMap]:
    """The lane's first-stage maps (a later stage would wait for them), found once per lane."""
    first = _FIRST_STAGES.get(lane)
    if first is None:  # a lane's nodes never change: found once, not at every step
        first = [m for m in _maps(lane) if not _maps(m.source)]
        _FIRST_STAGES[lane] = first
    return first


def run_together(calls: Sequence[Callable[[], None]], max_threads: int = 64) -> None:
    """Run ``calls`` together on short-lived threads: one each, up to ``max_threads``.

    What the lanes' restores and replay checks share: every call touches one lane's nodes
    only, so running them together only changes when the shared pool gets their work.
    The first error, in call order, is raised once every call has ended (none is left
    running behind the caller).
    """
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    errors: list[BaseException | None] = [None] * len(calls)
    n = min(len(calls), max(1, max_threads))

    def work(first: int) -> None:
        for k in range(first, len(calls), n):  # one call per thread up to max_threads
            try:
                calls[k]()
            except BaseException as e:  # re-raised below, in the caller's thread
                errors[k] = e

    threads = [
        threading.Thread(target=work, args=(k,), name=f"zephon-restore-{k}", daemon=True)
        for k in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e


def reset_lanes(resets: Sequence[tuple[BaseNode[Any], dict[str, Any] | None]]) -> None:
    """Reset (restore) several lanes at once, on threads (:func:`run_together`).

    A restored lane replays the consumed part of its flush window before it can deliver;
    replayed one lane after another, the restore costs the sum of every lane's replay.
    Here the replays run together, so the shared pool works on all lanes' work items at
    once (lowest item first, see :func:`prime_lanes`). Each lane's nodes are touched by
    one thread only; the output is unchanged. The first error, in lane order, is raised
    once every reset has ended (a failed restore leaves no thread behind).
    """
    with replaying([lane for lane, state in resets if state is not None]):
        run_together([partial(lane.reset, state) for lane, state in resets])


@contextlib.contextmanager
def replaying(lanes: Sequence[BaseNode[Any]]) -> Iterator[None]:
    """While ``lanes`` replay together: no look-ahead beyond what keeps the pool busy.

    A replay takes every item its lane asks for at once (:meth:`WorkerPool.hurry`), and a
    look-ahead item a free worker started meanwhile is work the first batch waits behind:
    each lane keeps ``ceil(workers / lanes)`` items queued (one for 8 lanes on 2 workers,
    two for a lane alone), and its full look-ahead again once the replays are over. A
    physical setting: the items and every output are unchanged.
    """
    maps = [m for lane in lanes for m in _first_stages(lane)]
    workers = max((m.pool.num_workers for m in maps), default=0)
    depth = max(1, -(-workers // max(1, len(lanes))))
    for m in maps:
        m.limit_lookahead(depth)
    try:
        yield
    finally:
        for m in maps:
            m.limit_lookahead(None)
