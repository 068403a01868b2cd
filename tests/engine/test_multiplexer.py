"""The multiplexer's state taken from another thread than the one reading batches."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.core.helpers import texts_recipe
from zephon_nodes import Pipeline, ShuffleSpec
from zephon_nodes.engine import multiplexer
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


def test_set_mixture_from_another_thread_acts_between_two_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A controller thread's set_mixture lands between two steps: the run then equals one
    where the same decision was made, in the reader's thread, after the logged step.

    The decision is slowed down (50 ms between taking the state and restoring it): without
    the lock the reader went on meanwhile, and the restore rewound it by a step.
    """
    from tests.mixing.test_dynamic import mixed_recipe

    real = multiplexer.with_decision

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(multiplexer, "with_decision", slow)

    pipeline = Pipeline(mixed_recipe(2))
    weights = {"d0": 0.2, "d1": 0.8}

    def node() -> Any:
        return pipeline.rank_node(1, 0, pool=WorkerPool(0, "thread"))

    threaded, seen = node(), []
    it = iter(threaded)
    controller = threading.Thread(
        target=lambda: (_wait_for_step(threaded, 3), threaded.set_mixture(weights))
    )
    controller.start()
    try:
        for _ in range(12):
            seen.append(next(it))
            time.sleep(0.01)  # a trainer's step: the controller decides meanwhile
    finally:
        controller.join(30)
    [(step, _)] = threaded.mixture_log
    assert step < 10
    reference, expected = node(), []
    it = iter(reference)
    for k in range(12):
        if k == step:
            reference.set_mixture(weights)
        expected.append(next(it))
    for k, (a, b) in enumerate(zip(seen, expected, strict=True)):
        assert all(torch.equal(a[f], b[f]) for f in b), f"batch {k} differs (decision at {step})"


def _wait_for_step(node: Any, step: int) -> None:
    while node.step < step:
        time.sleep(1e-4)


def test_the_error_policy_ends_when_a_paused_lane_never_would() -> None:
    """``work.end_of_data = "error"``: the data ends where one lane runs dry while the
    others, their ``"end"`` dataset paused by a decision, read a repeating one for ever.
    Counting what they hold drained them without end: the training loop hung at the end of
    the data. The error names the lanes that never end (red: killed after 60 s)."""
    from tests.commands.test_stats import _paused_end_dataset, _within
    from zephon_nodes import WorkSpec
    from zephon_nodes.core.errors import DataError

    recipe, updates = _paused_end_dataset()
    recipe = recipe.replace(work=WorkSpec(chunk_size=2, epochs=1, end_of_data="error"))

    def run() -> str:
        with WorkerPool(0, "thread") as pool:
            node = Pipeline(recipe).rank_node(1, 0, pool=pool)
            node.reset(None)
            try:
                for step in range(100):
                    for at, weights in updates:
                        if at == step:
                            node.set_mixture(weights)
                    next(node)
            except DataError as e:
                return str(e)
            finally:
                node.close()
        return "no error"

    message = _within(60, run)
    assert "after step 3" in message and "lanes [0, 1, 2] never end" in message, message
