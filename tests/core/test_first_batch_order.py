"""The first batch's work first: pool priorities, lanes primed together, restores in parallel.

All three are physical settings: they change when work runs, never what comes out.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest
from torchdata.nodes import BaseNode

from tests.core.helpers import texts_recipe
from zephon_nodes import Pipeline, ShuffleSpec
from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.engine.parallel_map import (
    OrderedParallelMap,
    prime_lanes,
    reset_lanes,
    run_together,
)
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.replay_check import REPLAY_CHECK_SAMPLES


def test_thread_pool_runs_lowest_priority_first_and_fifo_among_equals() -> None:
    """Queued calls run by priority, submission order among equal priorities."""
    pool = WorkerPool(1, "thread")
    gate = threading.Event()
    ran: list[str] = []
    try:
        blocker = pool.submit(lambda _: gate.wait(10), None)
        futs = [
            pool.submit(ran.append, name, priority=p)
            for name, p in (("c3", 3), ("a1", 1), ("b2", 2), ("z0", 0), ("a1-second", 1))
        ]
        gate.set()
        blocker.result(10)
        for f in futs:
            f.result(10)
    finally:
        pool.close()
    assert ran == ["z0", "a1", "a1-second", "b2", "c3"]


def _lane_maps(node: Any) -> list[OrderedParallelMap]:
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        if isinstance(n, OrderedParallelMap):
            out.append(n)
        todo.extend(v for v in vars(n).values() if isinstance(v, BaseNode))
    return out


def test_prime_lanes_queues_every_lanes_work_before_the_first_next() -> None:
    """After prime_lanes, every lane has its look-ahead submitted; the output is unchanged."""
    texts = [f"document {i} " * (3 + i % 5) for i in range(64)]
    pipeline = Pipeline(texts_recipe(texts))
    pool = WorkerPool(2, "thread")
    try:
        node = pipeline.rank_node(1, 0, pool=pool)
        node.reset(None)
        lanes = list(node.lanes.values())
        assert all(len(m._queue) == 0 for lane in lanes for m in _lane_maps(lane))
        prime_lanes(lanes)
        for lane in lanes:
            maps = _lane_maps(lane)
            assert maps and all(len(m._queue) == m._depth for m in maps), lane
        primed = [next(node)["input"].tolist() for _ in range(6)]
    finally:
        pool.close()
    with Pipeline(texts_recipe(texts)).rank_node(1, 0, pool=WorkerPool(0)) as plain:
        assert [next(plain)["input"].tolist() for _ in range(6)] == primed


class _Resettable(BaseNode[int]):
    def __init__(self, fail: str | None) -> None:
        super().__init__()
        self.fail = fail
        self.got: Any = "never"
        self.thread = ""

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        self.got = initial_state
        self.thread = threading.current_thread().name
        if self.fail:
            raise ValueError(self.fail)

    def next(self) -> int:
        return 0

    def get_state(self) -> dict[str, Any]:
        return {}


def test_reset_lanes_restores_each_lane_and_raises_the_first_error_in_lane_order() -> None:
    """Every lane gets its own state (on its own thread); the lowest lane's error is raised."""
    nodes = [_Resettable(None), _Resettable("lane 1 broke"), _Resettable("lane 2 broke")]
    states = [{"w": 0}, {"w": 1}, None]
    with pytest.raises(ValueError, match="lane 1 broke"):
        reset_lanes(list(zip(nodes, states, strict=True)))
    assert [n.got for n in nodes] == states
    assert len({n.thread for n in nodes}) == 3
    assert threading.current_thread().name not in {n.thread for n in nodes}


def test_resume_with_parallel_restore_gives_the_uninterrupted_batches() -> None:
    """A rank restored mid-window (lanes replayed together) continues the same batches."""
    texts = [f"text {i} " * (2 + i % 7) for i in range(80)]
    recipe = texts_recipe(texts)
    pool = WorkerPool(2, "thread")
    try:
        node = Pipeline(recipe).rank_node(1, 0, pool=pool)
        it = iter(node)
        for _ in range(5):
            next(it)
        state = node.state_dict()
        expected = [next(it)["input"].tolist() for _ in range(5)]
        again = Pipeline(recipe).rank_node(1, 0, pool=pool)
        again.reset(state)
        got = [next(again)["input"].tolist() for _ in range(5)]
    finally:
        pool.close()
    assert got == expected


class _CountingPool(WorkerPool):
    """A thread pool that records each work item it is given: ``(lane, position)``."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, "thread")
        self.items: list[tuple[int, int]] = []
        self.threads: set[str] = set()

    def submit(self, fn: Any, arg: Any, priority: int = 0) -> Any:
        if isinstance(arg, WorkItem):
            self.items.append((arg.lane, arg.position))
            self.threads.add(threading.current_thread().name)
        return super().submit(fn, arg, priority)


def _saved_after_seven_steps() -> tuple[Any, dict[str, Any], list[list[int]]]:
    """A 4-lane recipe, its state after 7 steps (inline) and the 4 batches that follow."""
    texts = [f"text {i} " * (2 + i % 7) for i in range(200)]
    recipe = texts_recipe(texts, shuffle=ShuffleSpec(6))
    reference = Pipeline(recipe).rank_node(1, 0, pool=WorkerPool(0))
    it = iter(reference)
    for _ in range(7):
        next(it)
    state = reference.state_dict()
    return recipe, state, [next(it)["input"].tolist() for _ in range(4)]


def test_resume_inside_the_replay_check_replays_each_work_item_once() -> None:
    """The check's replay leaves the lanes in place: no work item is computed twice."""
    recipe, state, expected = _saved_after_seven_steps()
    steps = state["step"] * recipe.samples_per_lane
    assert 0 < steps <= REPLAY_CHECK_SAMPLES  # the restore checks this state by replay
    pool = _CountingPool(2)
    try:
        node = Pipeline(recipe).rank_node(1, 0, pool=pool)
        node.reset(state)
        got = [next(node)["input"].tolist() for _ in range(4)]
    finally:
        pool.close()
    assert got == expected
    assert pool.items, "the restore replayed nothing"
    repeated = sorted({x for x in pool.items if pool.items.count(x) > 1})
    assert not repeated, f"work items (lane, position) computed twice: {repeated}"
    # The check replayed the lanes together, each on a thread of its own.
    assert len({t for t in pool.threads if t.startswith("zephon-restore-")}) == recipe.num_lanes


def test_replay_check_names_the_first_lane_refused() -> None:
    """Lanes checked together still refuse an edited state naming the lowest lane."""
    texts = [f"text {i} " * (2 + i % 7) for i in range(200)]
    recipe = texts_recipe(texts, shuffle=ShuffleSpec(6))
    node = Pipeline(recipe).rank_node(1, 0, pool=WorkerPool(0))
    it = iter(node)
    for _ in range(7):
        next(it)
    state = node.state_dict()
    lanes = state["lanes"]
    assert lanes["1"] != lanes["3"], lanes  # swapped, both positions stay plausible
    lanes["1"], lanes["3"] = lanes["3"], lanes["1"]
    with WorkerPool(2, "thread") as pool:
        again = Pipeline(recipe).rank_node(1, 0, pool=pool)
        with pytest.raises(CheckpointError, match=r"lanes\['1'\]"):
            again.reset(state)


def test_run_together_runs_every_call_and_bounds_its_threads() -> None:
    """More calls than threads: each runs once, on at most ``max_threads`` threads."""
    names: list[tuple[int, str]] = []
    lock = threading.Lock()

    def call(k: int) -> None:
        with lock:
            names.append((k, threading.current_thread().name))

    run_together([partial(call, k) for k in range(10)], max_threads=3)
    assert sorted(k for k, _ in names) == list(range(10))
    assert len({n for _, n in names}) == 3


def test_a_hurried_call_runs_next_and_only_once() -> None:
    """A queued call its reader waits for jumps the queue; it still runs exactly once."""
    pool = WorkerPool(1, "thread")
    gate = threading.Event()
    ran: list[str] = []
    try:
        blocker = pool.submit(lambda _: gate.wait(10), None)
        futs = {
            name: pool.submit(ran.append, name, priority=p)
            for name, p in (("a", 0), ("b", 1), ("c", 2))
        }
        pool.hurry(futs["c"])
        pool.hurry(futs["c"])  # hurried twice: still one run
        gate.set()
        blocker.result(10)
        for f in futs.values():
            f.result(10)
        pool.hurry(futs["a"])  # done: nothing queued again
        pool.submit(ran.append, "last").result(10)
    finally:
        pool.close()
    assert ran == ["c", "a", "b", "last"]


def _first_maps(node: Any) -> list[OrderedParallelMap]:
    return [m for lane in node.lanes.values() for m in _lane_maps(lane) if not _lane_maps(m.source)]


@pytest.mark.parametrize("path", ["replay check", "window replay"])
def test_a_restore_leaves_no_look_ahead_queued_behind_the_first_batch(path: str) -> None:
    """Replaying lanes (4 lanes, 2 workers) keep one item queued each, not their look-ahead.

    A look-ahead item started while the lanes replay is work the first batch waits behind.
    After the replay the full look-ahead is back, and the batches are the uninterrupted ones.
    """
    recipe, state, expected = _saved_after_seven_steps()
    pool = _CountingPool(2)
    try:
        node = Pipeline(recipe).rank_node(1, 0, pool=pool)
        maps = _first_maps(node)
        if path == "replay check":
            node.reset(state)
        else:  # what a restore past the replay check runs: each lane replays its window
            node.reset(None)
            reset_lanes(
                [
                    (lane, {"window": w, "consumed": c})
                    for lane, (w, c) in (
                        (node.lanes[i], state["lanes"][str(i)]) for i in node.lanes
                    )
                ]
            )
        queued = [len(m._queue) for m in maps]
        depths = [m._depth for m in maps]
        got = [next(node)["input"].tolist() for _ in range(4)] if path == "replay check" else None
    finally:
        pool.close()
    assert maps and all(q <= 1 for q in queued), f"items left queued after the replay: {queued}"
    assert all(d == m.lookahead for d, m in zip(depths, maps, strict=True)), depths
    if got is not None:
        assert got == expected
