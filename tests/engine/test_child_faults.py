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
import threading
import time
from collections.abc import Iterator

import pytest

from tests.engine.test_child import build, children, mine, reference, same
from zephon_nodes.engine.child import ChildRankNode


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
    batches, silently (a recipe with [[stages]] refused it)."""
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
    finally:
        node.close()
