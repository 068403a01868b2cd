"""Checkpoint state is a few integers per lane, whatever the buffers, seq_len or progress."""

from __future__ import annotations

import json

import pytest

from tests.core.helpers import texts_recipe
from zephon_nodes import Pipeline, WorkerPool
from zephon_nodes.recipe import ShuffleSpec, WorkSpec

TEXTS = [("lorem ipsum dolor sit amet " * (1 + i % 7)) for i in range(400)]


def state_after(steps: int, **recipe_kw) -> dict:
    pipeline = Pipeline(texts_recipe(TEXTS, **recipe_kw))
    with WorkerPool(0) as pool:
        node = pipeline.rank_node(1, 0, pool=pool)
        for _ in range(steps):
            next(node)
        return node.state_dict()


def sizes(state: dict) -> tuple[int, int]:
    per_lane = max(len(json.dumps({k: v})) for k, v in state["lanes"].items())
    header = len(json.dumps({k: v for k, v in state.items() if k != "lanes"}))
    return per_lane, header


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"shuffle": ShuffleSpec(64)},
        {"seq_len": 512, "global_batch_size": 4},
        {"flush_every": 50, "work": WorkSpec(chunk_size=1, epochs=None)},
    ],
)
def test_state_is_small_and_bounded(kw):
    """<= 32 bytes per lane and < 1 KiB of header, for big buffers and long runs alike."""
    for steps in (1, 5):
        state = state_after(steps, **kw)
        per_lane, header = sizes(state)
        assert per_lane <= 32, state["lanes"]
        assert header < 1024
        assert all(len(v) == 2 for v in state["lanes"].values())


def test_state_does_not_grow_with_progress():
    """The same structure after 2 steps and after 40 (positions are counters, not buffers)."""
    kw = {"work": WorkSpec(chunk_size=1, epochs=None), "shuffle": ShuffleSpec(16)}
    early, late = state_after(2, **kw), state_after(40, **kw)
    assert early["step"] == 2 and late["step"] == 40
    assert sizes(late)[0] <= sizes(early)[0] + 4
    assert early.keys() == late.keys()
