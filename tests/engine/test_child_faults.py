"""ChildRankNode under faults and odd call orders: real child processes, no mocks.

Faults are made in the child itself (a factory that raises, a node that blocks, a SIGKILL
the child sends itself at a chosen point). Expected batches and states come from the same
node run in this process. Every test leaves no child process, file descriptor, thread or
``/dev/shm`` file behind.
"""

from __future__ import annotations

import functools
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.nodes import BaseNode

from tests.engine.test_child import build, children, mine, reference, same, stuck, within
from zephon_nodes.engine.child import ChildEngineError, ChildRankNode


def fds() -> set[str]:
    """This process's open pipes, sockets and shared memory (what a child's handle holds;
    the in-process reference node's cache files are not counted)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor
            continue
        if target.startswith(("pipe:", "socket:", "/memfd:", "/dev/shm/")):
            out.add(f"{fd} {target}")
    return out


@pytest.fixture
def tidy() -> Iterator[None]:
    """No child process, descriptor, thread or shared-memory file is left behind."""
    multiprocessing.resource_tracker.ensure_running()  # the interpreter's one, shared
    before = (mine(), children(), fds(), threading.active_count())
    yield
    deadline = time.monotonic() + 10  # a closed child may take a moment to be reaped
    while children() - before[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mine() == before[0]
    assert children() <= before[1]
    assert fds() == before[2]
    assert threading.active_count() == before[3]


class Items(BaseNode[Any]):
    """A node of ``n`` small batches; ``batch`` picks what they hold (module level)."""

    def __init__(self, n: int, batch: str = "plain") -> None:
        super().__init__()
        self.n, self.batch, self.i = n, batch, 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.i = int(initial_state["i"]) if initial_state else 0

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}

    def metrics(self) -> dict[str, Any]:
        return {"i": self.i}

    def next(self) -> Any:
        if self.i >= self.n:
            raise StopIteration
        out: dict[str, Any] = {"x": torch.full((2,), self.i)}
        if self.batch == "grow":  # 4 MB from the third batch: beyond the slot's 1 MiB
            out["x"] = torch.full((1 + (self.i >= 2) * 10**6,), self.i, dtype=torch.float32)
        if self.batch == "lock":
            out["lock"] = threading.Lock()  # does not pickle
        self.i += 1
        return out


def failing() -> Items:
    """A factory that fails in the child (a missing shard, say)."""
    raise FileNotFoundError("shard /data/web-00017.jsonl is missing")


def items(n: int, batch: str = "plain") -> Items:
    return Items(n, batch)


def killed_passing_a_grown_slot() -> Items:
    """The child SIGKILLs itself between announcing a grown slot and passing its descriptor."""
    import zephon_nodes.engine.child as child

    real = child.send_handle

    def send_handle(conn: Any, fd: int, pid: int) -> None:
        if os.fstat(fd).st_size > 1 << 20:
            os.kill(os.getpid(), signal.SIGKILL)
        real(conn, fd, pid)

    child.send_handle = send_handle  # type: ignore[assignment]
    return Items(10, "grow")


def _exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def _prefetched(node: ChildRankNode, steps: int) -> None:
    """Wait until the child's node has made ``steps`` steps (its micro-batches prefetched:
    they are sent before the reply to metrics())."""
    deadline = time.monotonic() + 60
    while node.metrics()["step"] < steps:
        assert time.monotonic() < deadline, "the child prefetched nothing"
        time.sleep(0.2)


def test_reset_none_twice_with_nothing_handed_out_starts_the_same_pass(tidy: None) -> None:
    """reset(); reset() gives the first pass's batches, as in this process. Before, the
    child's prefetch had started the pass, so the second reset(None) started pass 1: other
    batches, silently (by multiplexer.py, a recipe with [[stages]] would be refused: not
    run here)."""
    batches, states = reference(100)
    node = ChildRankNode(functools.partial(build, 100, 1, 0), prefetch=4)
    try:
        node.reset()
        _prefetched(node, 1)
        node.reset()
        got = [next(node) for _ in range(3)]
        assert all(same(a, b) for a, b in zip(got, batches, strict=False))
        assert node.state_dict() == states[2]
        node.reset()  # after batches handed out: a new pass, as in this process
        assert node.state_dict()["pass"] == 1
        here = build(100, 1, 0)
        here.reset()
        for _ in range(3):
            next(here)
        here.reset()
        assert here.state_dict() == node.state_dict()
        assert same(next(node), next(here))
        here.close()
    finally:
        node.close()


def test_factory_error_after_the_child_exited_is_the_factorys_error(tidy: None) -> None:
    """The factory fails before the first next(): the caller gets the factory's error, every
    time (a reset tries the factory again in a new child). Before, a child already gone made
    it 'exited with code 0 ... restart from the last checkpoint'."""
    node = ChildRankNode(failing, label="rank 1")
    try:
        pid = node.pid
        assert pid is not None
        deadline = time.monotonic() + 60
        while not _exited(pid):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(FileNotFoundError, match="web-00017"):
            within(60, lambda: next(node))
        with pytest.raises(FileNotFoundError, match="web-00017"):
            next(node)
        with pytest.raises(FileNotFoundError, match="web-00017"):
            within(60, node.reset)
    finally:
        node.close()


def test_killed_while_idle_hands_out_the_batches_in_flight_then_stays_an_error(
    tidy: None,
) -> None:
    """SIGKILL while the child waits with full slots: the batches in flight come out (the
    in-process ones), then ChildEngineError naming the signal, again on every next() until
    a reset, which resumes at the state of the last batch handed out. Before, the first
    next() raised and the second silently started a new child."""
    batches, states = reference(100)
    node = ChildRankNode(functools.partial(build, 100, 1, 0), prefetch=4, label="rank 4")
    try:
        assert same(next(node), batches[0])
        _prefetched(node, 1)  # micro-batches 1-3 at least are in flight
        pid = node.pid or 0
        os.kill(pid, signal.SIGKILL)
        while not _exited(pid):  # gone while the trainer was busy with its step
            time.sleep(0.05)
        got = []
        with pytest.raises(ChildEngineError, match=r"rank 4 \(pid \d+\) was killed by SIGKILL"):
            for _ in range(10):
                got.append(within(30, lambda: next(node)))
        assert 3 <= len(got) <= 4
        assert all(same(a, b) for a, b in zip(got, batches[1:], strict=False))
        assert node.state_dict() == states[len(got)]
        with pytest.raises(ChildEngineError, match="SIGKILL"):
            next(node)
        node.reset(node.state_dict())
        assert same(next(node), batches[len(got) + 1])
    finally:
        node.close()


def test_close_from_another_thread_while_next_blocks(tidy: None) -> None:
    """close() while next() waits on a stuck child: next() raises ChildEngineError saying
    the child was closed. Before, it raised ValueError('process object is closed')."""
    node = ChildRankNode(functools.partial(stuck, 100), prefetch=1, label="rank 6")
    try:
        next(node)
        next(node)  # the third blocks in the child
        closer = threading.Timer(2.0, node.close)  # next() is waiting by then
        closer.start()
        with pytest.raises(ChildEngineError, match="rank 6 was closed"):
            within(60, lambda: next(node))
        closer.join(60)
    finally:
        node.close()


def test_killed_while_passing_a_grown_slot(tidy: None) -> None:
    """The child dies between announcing a grown slot and passing its descriptor: a
    ChildEngineError naming the signal. Before, a bare EOFError reached the caller."""
    node = ChildRankNode(killed_passing_a_grown_slot, prefetch=1, label="rank 2")
    try:
        assert [int(next(node)["x"][0]) for _ in range(2)] == [0, 1]
        with pytest.raises(ChildEngineError, match=r"rank 2 \(pid \d+\) was killed by SIGKILL"):
            within(60, lambda: next(node))
    finally:
        node.close()


def test_a_value_that_does_not_pickle_is_a_named_error(tidy: None) -> None:
    """A micro-batch holding a value that does not pickle: the caller gets an error naming
    the keys and the reason, every time until a reset. Before, the child crashed (its
    traceback on stderr) and the caller read 'exited with code 1 ... restart from the last
    checkpoint', which fails the same way."""
    node = ChildRankNode(functools.partial(items, 5, "lock"), prefetch=1)
    try:
        with pytest.raises(TypeError, match=r"keys \['x', 'lock'\].*cannot pickle"):
            within(60, lambda: next(node))
        with pytest.raises(TypeError, match="cannot pickle"):
            next(node)
    finally:
        node.close()


def test_next_after_a_failed_reset_raises_instead_of_waiting(tidy: None) -> None:
    """reset() with a state the child's node refuses raises its error; a next() after it
    raises it again. Before, that next() waited for stall_s (15 minutes by default), then
    called the idle child stuck."""
    node = ChildRankNode(functools.partial(items, 5))
    try:
        assert int(next(node)["x"][0]) == 0
        with pytest.raises(ValueError, match="invalid literal"):
            within(60, lambda: node.reset({"i": "three"}))
        with pytest.raises(ValueError, match="invalid literal"):
            within(30, lambda: next(node))
        node.reset({"i": 3})
        assert int(next(node)["x"][0]) == 3
    finally:
        node.close()


def test_metrics_after_close_or_death_is_an_error_not_a_new_child(tidy: None) -> None:
    """metrics() of a closed node, or of one whose child died, raises ChildEngineError and
    starts nothing. Before, it started a new child (in a trainer: a whole pipeline and
    worker pool) and returned a fresh node's metrics: {'i': 0} after a batch was read."""
    node = ChildRankNode(functools.partial(items, 100))
    try:
        assert int(next(node)["x"][0]) == 0
        assert node.metrics()["i"] >= 1  # prefetch included
        node.close()
        with pytest.raises(ChildEngineError, match="is closed"):
            node.metrics()
        assert node.pid is None
        node.reset({"i": 1})  # a new child, as documented
        os.kill(node.pid or 0, signal.SIGKILL)

        def drain() -> None:  # the batches it sent before it died come first
            for _ in range(10):
                next(node)

        with pytest.raises(ChildEngineError, match="SIGKILL"):
            within(30, drain)
        with pytest.raises(ChildEngineError, match="SIGKILL"):
            node.metrics()
        assert node.pid is None
    finally:
        node.close()


def test_a_factory_the_child_cannot_load_is_named(tidy: None) -> None:
    """A factory that pickles here but cannot be loaded in the child (its module exists only
    in this process, as a function of a notebook's or ``python -c``'s ``__main__``): a
    TypeError naming the factory and the reason. Before, the child died while starting and
    the caller read 'exited with code 1; ... restart from the last checkpoint'."""
    here = types.ModuleType("zephon_only_in_the_parent")
    exec("def factory():\n    return None\n", here.__dict__)
    sys.modules[here.__name__] = here
    node = ChildRankNode(here.factory, label="rank 0")
    try:
        with pytest.raises(
            TypeError,
            match=r"cannot load its factory <function factory .*No module named "
            r"'zephon_only_in_the_parent'.*module-level function",
        ):
            within(60, lambda: next(node))
    finally:
        node.close()
        del sys.modules[here.__name__]
