"""RayExecutor: operator calls as Ray tasks on any node of a Ray cluster.

The executor behind ``WorkerPool(runner="ray")``. Each call ``fn(item)`` becomes one Ray task
(one CPU); the lane re-sequences the results, so the output is the thread runner's, byte for
byte. ``RAY_ADDRESS`` (or ``address=``) joins an existing cluster; otherwise a small local one
is started (``num_workers`` CPUs, no dashboard) and shut down when the last executor using it
closes. A cluster the caller started with ``ray.init`` is used and left running.

A task whose worker process or node is lost is run again elsewhere by Ray, up to
``max_retries`` times (Ray also re-runs a finished task whose result was stored on the lost
node); after that the call fails with :class:`RayTaskLost`, which the lane raises as a
:class:`~zephon_nodes.errors.WorkerError` naming the operator and the work item. An exception
raised by the operator itself is never retried (operators are deterministic: it would fail
again) and reaches the lane unchanged.

Tasks are never cancelled through Ray (``ray.cancel``): in Ray 2.60 a cancel that races with
the reply of a task being pushed to its worker fails a ``RAY_CHECK`` in the driver
(``task_manager.cc``: "Tried to complete task that was not pending"), which ends the whole
process with exit status 1 and no Python traceback. A future the lane gives up on (a reset, an
error) is only dropped: its task finishes on the cluster and its result is released.
:meth:`RayExecutor.shutdown` waits (bounded) for the tasks in flight, so that no ``ObjectRef``
outlives the connection.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from zephon_nodes.core.settings import Settings, current, using

__all__ = ["RayExecutor", "RayTaskLost"]

DEFAULT_OBJECT_STORE_MB = 128  # a local cluster's object store (Ray's minimum is ~75 MB)
DRAIN_S = 10.0  # at shutdown, how long the tasks in flight may take to finish

_lock = threading.Lock()
_users = 0  # live executors on the current Ray connection
_owned = False  # whether the connection was opened by an executor (and so is closed by one)

# Per Ray worker process: operators fetched from the object store, by object id, so that a
# large operator (a tokenizer) is deserialized once per worker and not once per call.
_FN_CACHE: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()
_FN_CACHE_SIZE = 8


class RayTaskLost(RuntimeError):
    """A Ray task lost its worker or node more than ``max_retries`` times."""


def _call(
    fn_box: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any], settings: Settings
) -> Any:
    """Body of every Ray task: look up the operator (cached per worker) and call it.

    The call runs inside the settings of the work that submitted it (sent with the task).
    """
    import ray

    ref = fn_box[0]
    key = ref.binary()
    fn = _FN_CACHE.get(key)
    if fn is None:
        fn = ray.get(ref)
        _FN_CACHE[key] = fn
        while len(_FN_CACHE) > _FN_CACHE_SIZE:
            _FN_CACHE.popitem(last=False)
    with using(settings):
        return fn(*args, **kwargs)


def _connect(num_cpus: int, address: str | None, object_store_mb: int) -> None:
    """Join or start a Ray cluster for one more executor (reference counted)."""
    global _users, _owned
    import ray

    with _lock:
        if _users == 0 and not ray.is_initialized():
            address = address or current().ray_address or None
            common: dict[str, Any] = {
                "logging_level": logging.WARNING,
                "ignore_reinit_error": True,
            }
            if address:
                ray.init(address=address, **common)
            else:
                ray.init(
                    address="local",
                    num_cpus=max(1, num_cpus),
                    include_dashboard=False,
                    object_store_memory=object_store_mb * 1024 * 1024,
                    # Ray 2.60 leaks a metrics reader thread per ray.init; once the local
                    # cluster is shut down it logs failed exports, and a log during process
                    # exit segfaults (exit status 139 after a successful run).
                    _system_config={"enable_open_telemetry": False},
                    **common,
                )
            _owned = True
        elif _users == 0:
            _owned = False  # the caller's own ray.init: use it, never shut it down
        _users += 1


def _disconnect() -> None:
    """One executor fewer; the last one shuts down a connection an executor opened."""
    global _users, _owned
    import ray

    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _owned:
            _owned = False
            ray.shutdown()


class RayExecutor(cf.Executor):
    """Runs ``fn(*args)`` as Ray tasks; futures settle in any order, lanes re-sequence them.

    Args:
        num_workers: CPUs of the local cluster started when none is joined (ignored when
            joining one: Ray schedules on every CPU of the cluster).
        address: Cluster to join (default: the settings' ``ray_address``, ``RAY_ADDRESS``;
            none starts a local cluster).
        max_retries: Times a task is re-run after its worker or node is lost (default: the
            settings' ``ray_max_retries``, ``ZEPHON_RAY_MAX_RETRIES``, else 3).
        settings: The settings of its tasks when :meth:`submit` is not given others
            (default: the current ones when it is made).
        object_store_mb: Object store of a local cluster, in MiB.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        address: str | None = None,
        max_retries: int | None = None,
        object_store_mb: int = DEFAULT_OBJECT_STORE_MB,
        settings: Settings | None = None,
    ) -> None:
        import ray

        self.settings = settings or current()
        if max_retries is None:
            max_retries = self.settings.ray_max_retries
        if max_retries < 0:
            raise ValueError(f"{max_retries=} must be >= 0")
        _connect(num_workers, address or self.settings.ray_address, object_store_mb)
        self.max_retries = max_retries
        self._ray = ray
        self._task = ray.remote(_call).options(
            num_cpus=1, max_retries=max_retries, retry_exceptions=False
        )
        self._fns: dict[int, tuple[Callable[..., Any], Any]] = {}
        self._pending: dict[int, tuple[Any, cf.Future[Any]]] = {}
        self._keys = itertools.count()
        self._guard = threading.Lock()
        self._idle = threading.Condition(self._guard)  # notified when nothing is in flight
        self._closed = False

    def _fn_ref(self, fn: Callable[..., Any]) -> Any:
        entry = self._fns.get(id(fn))
        if entry is None or entry[0] is not fn:
            entry = (fn, self._ray.put(fn))
            self._fns[id(fn)] = entry
        return entry[1]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` as a Ray task; return a future of its result."""
        return self.submit_in(self.settings, fn, *args, **kwargs)

    def submit_in(
        self, settings: Settings, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> cf.Future[Any]:
        """Run ``fn(*args, **kwargs)`` as a Ray task inside ``settings``."""
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after the pool was closed")
            ref = self._task.remote([self._fn_ref(fn)], args, kwargs, settings)
            out: cf.Future[Any] = cf.Future()
            key = next(self._keys)  # never reused (an id() would be, once out is freed)
            self._pending[key] = (ref, out)
        # Only the executor's table holds the ObjectRef (cleared at shutdown), never the
        # futures the lanes keep: Ray reuses object ids in a later session of the same
        # process, and a stale ObjectRef freed then would release the new session's object.
        # A future the lane cancels (reset, error) is not cancelled in Ray (see the module
        # docstring): its task runs to the end and _settle drops the result.
        ref.future().add_done_callback(lambda f: self._settle(key, f))
        return out

    def _settle(self, key: int, done: cf.Future[Any]) -> None:
        with self._guard:
            entry = self._pending.pop(key, None)
            if not self._pending:
                self._idle.notify_all()
        if entry is None or entry[1].done():
            return
        out = entry[1]
        del entry
        from ray.exceptions import RayError, RayTaskError

        try:
            result = done.result()
        except RayTaskError as e:  # the operator raised: its own exception, unchanged
            error: BaseException = e.cause if isinstance(e.cause, BaseException) else e
        except RayError as e:
            error = RayTaskLost(
                f"the Ray task lost its worker or node and max_retries={self.max_retries} "
                f"re-runs did not finish it ({type(e).__name__}: {e})"
            )
        except BaseException as e:
            error = e
        else:
            with contextlib.suppress(cf.InvalidStateError):
                out.set_result(result)
            return
        with contextlib.suppress(cf.InvalidStateError):
            out.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Leave the cluster (shut down if an executor started it) once the tasks in flight end.

        Pending futures are cancelled; their tasks are not (see the module docstring). The
        tasks in flight are given up to ``DRAIN_S`` seconds in all to finish, whatever
        ``wait`` says, so that no ``ObjectRef`` outlives the connection; a task still running
        then is left to the cluster (a connection an executor opened stops it with the rest).
        """
        with self._guard:
            if self._closed:
                return
            self._closed = True
            futures = [fut for _, fut in self._pending.values()]
            self._fns.clear()
        for fut in futures:
            fut.cancel()
        del futures
        deadline = time.monotonic() + DRAIN_S
        with self._guard:
            while self._pending and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            self._pending.clear()  # no ObjectRef may outlive the session (see submit)
        _disconnect()
