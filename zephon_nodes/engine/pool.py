"""The worker pool a rank's lanes share: threads, processes, or inline.

One pool per rank, shared by all of its lanes and operators (a private pool per lane and
operator would mean hundreds of threads). The pool is a physical setting: it changes speed,
never output.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import importlib.util
import itertools
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import InSettings, Settings, activate, current
from zephon_nodes.engine import shm
from zephon_nodes.engine.ray_executor import RayExecutor
from zephon_nodes.io.nodecache.workercounts import CountedCall, collect
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["RUNNERS", "WorkerPool"]

RUNNERS = ("thread", "process", "ray")

# Longest wait, at close or interpreter exit, for a thread to finish the call it is running.
_JOIN_S = 10.0
_LIVE: weakref.WeakSet[_DaemonThreadExecutor] = weakref.WeakSet()
_POOL_IDS = itertools.count()


def _start_worker(parent: int, settings: Settings) -> None:
    """Worker-process initializer: the pool's settings, and exit when the rank is gone.

    SIGINT (a Ctrl-C reaches the whole process group) is the rank's to handle: it stops
    its workers; a worker printing its own ``KeyboardInterrupt`` would only add tracebacks.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    activate(settings)
    _watch_parent(parent)


def _watch_parent(parent: int, interval_s: float = 0.5) -> None:
    """Exit this worker process as soon as the parent (the rank) is gone.

    A rank killed with SIGKILL cannot stop its workers; without this they would live on as
    orphans (blocked on their task queue) on every preempted node. Before exiting, the
    worker removes the dead rank's shared-memory files (results never collected).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        shm.remove_segments(f"zephon-{parent}-")
        os._exit(1)

    threading.Thread(target=watch, name="zephon-parent-watch", daemon=True).start()


# Priority of the stop sentinels: after every call queued before them.
_LAST = float("inf")
# Priority of a hurried call (one its reader waits for): before every other call.
_HURRIED = float("-inf")


class _DaemonThreadExecutor(cf.Executor):
    """A fixed set of daemon threads, taking queued calls lowest priority first.

    Unlike ``ThreadPoolExecutor`` (whose threads are joined at interpreter exit), an operator
    blocked forever cannot keep the process alive after the loader has raised its timeout
    error: the job exits and can be restarted. Calls of equal priority run in submission
    order; a lane's work item ``k`` has priority ``k`` (see
    :class:`~zephon_nodes.engine.parallel_map.OrderedParallelMap`), so every lane's first
    items run before any lane's look-ahead (the first step's work first). A queued call that
    its reader now waits for can be hurried (:meth:`hurry`): it runs before every call no
    one waits for yet, so the pool never spends a free thread on look-ahead while a lane
    that needs one more item waits behind other lanes' look-ahead of the same priority.
    """

    def __init__(self, num_workers: int, prefix: str) -> None:
        self._queue: queue.PriorityQueue[Any] = queue.PriorityQueue()
        # Calls not taken yet, by their future; a queue entry names its future only, so a
        # hurried call (queued twice) runs once: whoever takes it from here first.
        self._pending: dict[cf.Future[Any], tuple[Callable[..., Any], Any, Any]] = {}
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._shutdown = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{prefix}-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for t in self._threads:
            t.start()
        _LIVE.add(self)

    def _work(self) -> None:
        while True:
            fut = self._queue.get()[2]
            if fut is None:
                return
            with self._lock:
                task = self._pending.pop(fut, None)
            if task is None or not fut.set_running_or_notify_cancel():
                continue  # the other entry of a hurried call, or a cancelled call
            fn, args, kwargs = task
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                fut.set_exception(e)
                del e
            else:
                fut.set_result(result)
            del task, fut, fn, args, kwargs

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Schedule ``fn(*args, **kwargs)`` (priority 0)."""
        return self.submit_at(0, fn, *args, **kwargs)

    def submit_at(
        self, priority: float, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> cf.Future[Any]:
        """Schedule ``fn(*args, **kwargs)`` behind queued calls of lower or equal priority."""
        fut: cf.Future[Any] = cf.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after the pool was closed")
            self._pending[fut] = (fn, args, kwargs)
            self._queue.put((priority, next(self._order), fut))
        return fut

    def hurry(self, fut: cf.Future[Any]) -> None:
        """Queue ``fut``'s call again, ahead of every call no one waits for yet.

        For a reader about to block on ``fut``: a call already taken (running, done or
        cancelled) is left alone, as is a future of another executor.
        """
        with self._lock:
            if fut in self._pending and not self._shutdown:
                self._queue.put((_HURRIED, next(self._order), fut))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once they finish their current call."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        fut = self._queue.get_nowait()[2]
                    except queue.Empty:
                        break
                    if fut is not None and self._pending.pop(fut, None) is not None:
                        fut.cancel()
            for _ in self._threads:
                self._queue.put((_LAST, next(self._order), None))
        if wait:
            for t in self._threads:
                t.join()

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` in all for the threads to finish their current call.

        A daemon thread still inside a C++ call (a tokenizer) when the interpreter exits
        aborts the process ("terminate called without an active exception"), so a closed
        pool lets running calls finish; a thread blocked forever is abandoned after the wait.
        """
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


@atexit.register
def _close_live_executors() -> None:
    for executor in list(_LIVE):
        executor.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + _JOIN_S
    for executor in list(_LIVE):
        executor.join(max(0.0, deadline - time.monotonic()))


def _via_shared_memory(inner: cf.Future[Any]) -> cf.Future[Any]:
    """A future of ``inner``'s result, its shared-memory part mapped (and unlinked) on arrival.

    A process worker's node-cache counters that came with it are collected on arrival too.

    The mapping happens as soon as the worker's result arrives, whether or not anyone reads
    it (a cancelled or abandoned result leaves no file behind).
    """
    outer: cf.Future[Any] = cf.Future()

    def arrived(f: cf.Future[Any]) -> None:
        if f.cancelled():
            outer.cancel()
            return
        exc = f.exception()
        result: Any = None
        if exc is None:
            result = collect(f.result())
            if isinstance(result, shm.ShmResult):
                try:
                    result = result.load()
                except Exception as e:
                    exc = e
        with contextlib.suppress(cf.InvalidStateError):  # the reader cancelled it
            if exc is not None:
                outer.set_exception(exc)
            else:
                outer.set_result(result)

    def cancelled(o: cf.Future[Any]) -> None:
        if o.cancelled():
            inner.cancel()

    outer.add_done_callback(cancelled)
    inner.add_done_callback(arrived)
    return outer


class WorkerPool:
    """Runs stateless operator calls on ``num_workers`` threads or processes.

    Args:
        num_workers: Workers; 0 runs every call inline in the calling thread.
        runner: ``"thread"`` (for GIL-releasing work such as tokenizers) or ``"process"``
            (spawned processes, for pure-Python operators; functions must be picklable) or
            ``"ray"`` (Ray tasks on any node of a Ray cluster, see
            :class:`~zephon_nodes.engine.ray_executor.RayExecutor`; needs the ``ray`` extra).
        timeout_s: Longest wait for one result before the lane raises
            :class:`~zephon_nodes.core.errors.WorkerError` (a blocked or killed worker never hangs
            the loader). A thread blocked forever does not keep the process from exiting
            either (the threads are daemons); process workers are stopped by :meth:`close`.
        shared_memory: Process runner: send large arrays of results (token ids, image
            patches) through shared memory instead of the pipe (see
            :mod:`zephon_nodes.engine.shm`; Linux ``/dev/shm``, else ignored).
        settings: The physical settings every call runs under, in whichever thread,
            process or Ray worker runs it (default: the submitter's
            :func:`~zephon_nodes.core.settings.current` settings, taken at each submit).
            They travel with the call: workers never read the environment for them.
    """

    def __init__(
        self,
        num_workers: int = 2,
        runner: str = "thread",
        timeout_s: float = 300.0,
        *,
        shared_memory: bool = True,
        settings: Settings | None = None,
    ):
        if runner not in RUNNERS:
            raise RecipeError(f"{runner=} must be one of {RUNNERS}")
        check_setting("num_workers", num_workers)
        if runner == "ray" and num_workers and importlib.util.find_spec("ray") is None:
            raise RecipeError("runner='ray' needs Ray: pip install 'zephon-nodes[ray]'")
        if not timeout_s > 0 or not timeout_s < float("inf"):
            raise RecipeError(f"{timeout_s=} must be > 0")
        self.num_workers = num_workers
        self.runner = runner
        self.timeout_s = float(timeout_s)
        self.shared_memory = shared_memory and runner == "process" and shm.available()
        if settings is not None and not isinstance(settings, Settings):
            raise RecipeError(f"settings must be a Settings, got {type(settings).__name__}")
        self.settings = settings
        self._prefix = ""
        self._executor: cf.Executor | None = None
        # Lanes restored together (engine.parallel_map.run_together) submit from several
        # threads at once: one executor is started, never one per thread (leaked workers).
        self._start_lock = threading.Lock()

    def _get_executor(self) -> cf.Executor | None:
        if self.num_workers == 0:
            return None
        executor = self._executor
        if executor is not None:
            return executor
        with self._start_lock:
            return self._start_executor()

    def _start_executor(self) -> cf.Executor:
        """Start the executor, or return the one another thread started meanwhile."""
        if self._executor is not None:
            return self._executor
        executor: cf.Executor
        if self.runner == "thread":
            executor = _DaemonThreadExecutor(self.num_workers, "zephon-worker")
        elif self.runner == "ray":  # the optional extra: imported only when asked for
            executor = RayExecutor(self.num_workers, settings=self.settings)
        else:
            if self.shared_memory:
                shm.remove_stale_segments()
                self._prefix = shm.pool_prefix(next(_POOL_IDS))
            executor = cf.ProcessPoolExecutor(
                self.num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(), self.settings or current()),
            )
        self._executor = executor
        return executor

    def submit(self, fn: Callable[[Any], Any], arg: Any, priority: int = 0) -> cf.Future[Any]:
        """Schedule ``fn(arg)``; inline pools run it now and return a finished future.

        The call runs inside the pool's settings, else the caller's current ones. The thread
        runner takes queued calls lowest ``priority`` first (submission order among equals);
        the other runners ignore it. A physical setting: it changes when, never what.
        """
        settings = self.settings or current()
        executor = self._get_executor()
        if executor is not None and self.runner == "process":
            # The worker's node-cache counters come back with the result (io/workercounts).

            call = shm.ShmCall(fn, self._prefix) if self._prefix else fn
            scoped = InSettings(CountedCall(call), settings)
            return _via_shared_memory(executor.submit(scoped, arg))
        if executor is not None and self.runner == "ray":
            assert isinstance(executor, RayExecutor)
            return executor.submit_in(settings, fn, arg)  # fn itself: cached per Ray worker
        if isinstance(executor, _DaemonThreadExecutor):
            return executor.submit_at(priority, InSettings(fn, settings), arg)
        if executor is not None:
            return executor.submit(InSettings(fn, settings), arg)
        fut: cf.Future[Any] = cf.Future()
        try:
            fut.set_result(InSettings(fn, settings)(arg))
        except BaseException as e:
            fut.set_exception(e)
        return fut

    def hurry(self, fut: cf.Future[Any]) -> None:
        """Run ``fut``'s call (from :meth:`submit`) next, if it is still queued: its reader waits.

        The thread runner only (the others take calls in their own order). A physical
        setting, like the priorities: it changes when a call runs, never what it returns.
        """
        if isinstance(self._executor, _DaemonThreadExecutor):
            self._executor.hurry(fut)

    def close(self) -> None:
        """Stop the workers (pending calls are cancelled; worker processes are killed).

        Worker processes are killed rather than awaited: one blocked in an operator would
        otherwise keep the interpreter from exiting. A later :meth:`submit` starts new ones.
        """
        with self._start_lock:  # a submit meanwhile starts a new executor of its own prefix
            executor, self._executor = self._executor, None
            prefix, self._prefix = self._prefix, ""
        if executor is None:
            return
        processes = getattr(executor, "_processes", None) or {}
        procs = list(processes.values())
        executor.shutdown(wait=False, cancel_futures=True)
        if isinstance(executor, _DaemonThreadExecutor):
            executor.join(min(self.timeout_s, _JOIN_S))
        # Running calls may finish (bounded) so that no worker dies halfway through sending
        # a result: the executor's manager thread would wait forever for the rest of that
        # message, and the interpreter joins it at exit. Blocked workers are then killed.
        deadline = time.monotonic() + min(self.timeout_s, _JOIN_S)
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
        if prefix:  # results a killed worker never sent
            shm.remove_segments(prefix)
            shm.forget(prefix)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WorkerPool(num_workers={self.num_workers}, runner={self.runner!r})"
