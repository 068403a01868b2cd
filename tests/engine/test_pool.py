"""The rank's worker pool started once, whatever number of threads submit to it at once."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.core.helpers import texts_recipe
from zephon_nodes import Pipeline, ShuffleSpec
from zephon_nodes.engine import pool as pool_module
from zephon_nodes.engine import shm
from zephon_nodes.engine.pool import WorkerPool


def test_concurrent_first_submits_start_one_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads submitting to a fresh pool at once share one executor of its workers.

    Lanes restored together submit from a thread each; a pool that started an executor per
    thread ran 8 x num_workers threads and leaked all but the last executor's.
    """
    started: list[Any] = []
    real_init = pool_module._DaemonThreadExecutor.__init__

    def slow_init(self: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.05)  # widens the window in which another thread sees no executor
        real_init(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(pool_module._DaemonThreadExecutor, "__init__", slow_init)
    pool = WorkerPool(2, "thread")
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def submit(k: int) -> None:
        barrier.wait()
        results.append(pool.submit(lambda x: x * 2, k).result(10))

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(results) == [2 * k for k in range(8)]
        assert len(started) == 1, f"{len(started)} executors started for one pool"
    finally:
        pool.close()
    assert not any(t.is_alive() for ex in started for t in ex._threads)


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("zephon-worker")}


def _eight_lanes_after_3_steps(docs: int) -> tuple[Pipeline, dict[str, Any]]:
    """A pipeline of 8 lanes over ``docs`` documents, and its state after 3 steps."""
    texts = [f"doc {k} " * (k % 7 + 1) for k in range(docs)]
    pipeline = Pipeline(texts_recipe(texts, num_lanes=8, shuffle=ShuffleSpec(buffer_size=4)))
    pool = WorkerPool(2, "thread")
    node = pipeline.rank_node(1, 0, pool=pool)
    try:
        it = iter(node)
        for _ in range(3):
            next(it)
        return pipeline, node.state_dict()
    finally:
        node.close()
        pool.close()


def _restore_first_batch(
    pipeline: Pipeline, state: dict[str, Any], runner: str, running: Callable[[], set[Any]]
) -> set[Any]:
    """Restore ``state`` on a 2-worker pool of ``runner``, take the first batch; return
    ``running()`` as it was then (the pool and node are closed after)."""
    pool = WorkerPool(2, runner)
    node = pipeline.rank_node(1, 0, pool=pool)
    try:
        node.reset(state)
        next(node)
        return running()
    finally:
        node.close()
        pool.close()


def test_a_restore_of_eight_lanes_runs_on_the_pools_workers_only() -> None:
    """A restore replays eight lanes on threads of their own over a pool of 2 workers: the
    pool runs 2 worker threads, and none is left once it is closed."""
    before = _workers()
    pipeline, state = _eight_lanes_after_3_steps(200)
    running = _restore_first_batch(pipeline, state, "thread", _workers)
    assert len(running - before) == 2
    assert not _workers() - before


def _live_children() -> set[int]:
    """Pids of this process's running children, read from /proc (a reaped or zombie child
    is not running; ``multiprocessing.active_children`` may still list a child that the
    executor's own thread reaped)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            out.add(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_process_runner_restore_starts_num_workers_processes() -> None:
    """Restored together, eight lanes start one process pool: 2 worker processes, none left
    after close (before the fix: 2-4 pools, 4-6 processes, one left after close)."""
    pipeline, state = _eight_lanes_after_3_steps(400)
    resource_tracker.ensure_running()  # a child of its own, started at the first pool
    before = _live_children()
    running = _restore_first_batch(pipeline, state, "process", _live_children)
    assert len(running - before) == 2
    assert not _live_children() - before


def _big(x: int) -> np.ndarray:
    return np.full(1 << 17, x, dtype=np.int64)  # 1 MiB: sent through shared memory


def _slow(x: int) -> int:
    time.sleep(1.5)
    return x


@pytest.mark.skipif(not shm.available(), reason="shared memory (Linux /dev/shm)")
def test_close_while_another_thread_starts_a_new_pool_releases_the_old_memory() -> None:
    """A lane that timed out closes the pool while another lane submits: close releases
    the shared memory of the workers it stopped (it released the new pool's instead, and
    the old arena mappings stayed for the life of the process)."""
    pool = WorkerPool(1, "process", timeout_s=60)
    try:
        assert int(pool.submit(_big, 1).result(60)[0]) == 1
        old = pool._prefix
        pool.submit(_slow, 0)  # running when close() starts: close waits in its joins
        time.sleep(0.5)
        results: list[int] = []

        def submit_meanwhile() -> None:
            time.sleep(0.2)
            results.append(int(pool.submit(_big, 2).result(60)[0]))

        threads = [threading.Thread(target=pool.close), threading.Thread(target=submit_meanwhile)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [2]
        assert pool._prefix and pool._prefix != old
    finally:
        pool.close()
    assert not [n for n in shm._ReaderArena._open if n.startswith(old)]
