"""The multiplexer's state taken from another thread than the one reading batches."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.core.helpers import texts_recipe
from zephon_nodes import Pipeline, ShuffleSpec
from zephon_nodes.engine.pool import WorkerPool


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Switch threads every microsecond, so that a state can be taken mid-commit."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_a_state_taken_during_next_is_of_one_moment(frequent_switches: None) -> None:
    """States taken by a watcher thread while batches are read: one state per step.

    Without the lock, a state caught between a step's positions and its sample checks
    carried the new checks with the old step (9-13 such steps in 160): a checkpoint its
    own resume refuses ("does not match last_sample").
    """
    texts = [f"doc {k} " * (k % 7 + 1) for k in range(600)]
    pipeline = Pipeline(texts_recipe(texts, num_lanes=4, shuffle=ShuffleSpec(buffer_size=4)))
    node = pipeline.rank_node(1, 0, pool=WorkerPool(0, "thread"))
    states: list[dict[str, object]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            states.append(node.state_dict())

    watcher = threading.Thread(target=watch)
    watcher.start()
    steps = 0
    try:
        for _ in node:
            steps += 1
            time.sleep(1e-4)  # the lock is not fair: a moment for the watcher between steps
    finally:
        done.set()
        watcher.join(30)
    by_step: dict[tuple[object, object], set[str]] = {}
    for s in states:
        by_step.setdefault((s["step"], s["micro"]), set()).add(json.dumps(s, sort_keys=True))
    assert steps > 100 and len(states) >= steps // 2
    torn = {k: len(v) for k, v in by_step.items() if len(v) > 1}
    assert not torn, f"steps with more than one state: {torn}"
