"""torchdata's save/load contract for every node the library exports.

The same scenarios torchdata checks on its own nodes (restore mid-epoch, in the next epoch,
from the start and from the end of an epoch, through a ``Loader``), via
:func:`zephon_nodes.testing.assert_save_load_state`, plus the kit's state round trip from
every position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torchdata.nodes import BaseNode

from zephon_nodes import (
    AccumulatorNode,
    DatasetSpec,
    Lane,
    Multiplexer,
    OrderedParallelMap,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkerPool,
    WorkItemNode,
    WorkSpec,
)
from zephon_nodes.operators import ConcatPacker
from zephon_nodes.testing import assert_save_load_state, assert_state_roundtrip


def recipe() -> Recipe:
    texts = [f"doc {i}: " + "zephon lanes " * (i % 5) for i in range(60)]
    return Recipe(
        datasets=(DatasetSpec("m", records=tuple({"text": t} for t in texts)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=5,
        num_lanes=4,
        global_batch_size=8,
        seq_len=16,
        flush_every=2,
        work=WorkSpec(chunk_size=3, epochs=1),
        shuffle=ShuffleSpec(3),
    )


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline(recipe())


@pytest.fixture(params=[0, 2], ids=["inline", "threads"])
def pool(request: pytest.FixtureRequest) -> Iterator[WorkerPool]:
    with WorkerPool(request.param, "thread") as p:
        yield p


def work_items(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    return WorkItemNode(p.work_source, 1, p.recipe.flush_every)


def parallel_map(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    return OrderedParallelMap(work_items(p, pool), p.stateless, pool, lookahead=3)


def accumulator(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    return AccumulatorNode(parallel_map(p, pool), lambda w: ConcatPacker(16, p.pad_id))


def lane(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    return p.build_lane(1, pool)


def multiplexer(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    return p.rank_node(2, 1, pool=pool)


def multiplexer_micro(p: Pipeline, pool: WorkerPool) -> BaseNode[Any]:
    # two micro-batches per step: the midpoint falls inside a step
    return p.rank_node(2, 0, pool=pool, local_batch_size=2)


NODES: dict[str, tuple[Callable[[Pipeline, WorkerPool], BaseNode[Any]], type, int]] = {
    "WorkItemNode": (work_items, WorkItemNode, 3),
    "OrderedParallelMap": (parallel_map, OrderedParallelMap, 4),
    "AccumulatorNode": (accumulator, AccumulatorNode, 5),
    "Lane": (lane, Lane, 4),
    "Multiplexer": (multiplexer, Multiplexer, 2),
    "Multiplexer-mid-step": (multiplexer_micro, Multiplexer, 3),
}


@pytest.mark.parametrize("name", list(NODES))
def test_save_load_state(name: str, pipeline: Pipeline, pool: WorkerPool) -> None:
    build, cls, midpoint = NODES[name]
    node = build(pipeline, pool)
    assert type(node) is cls
    assert_save_load_state(node, midpoint)


@pytest.mark.parametrize("name", list(NODES))
def test_state_roundtrip_from_every_position(
    name: str, pipeline: Pipeline, pool: WorkerPool
) -> None:
    build, _, _ = NODES[name]
    assert_state_roundtrip(lambda: build(pipeline, pool), max_positions=40)


def test_the_contract_check_catches_a_node_that_restarts_on_restore() -> None:
    """The save/load check is not vacuous: a node that ignores its state fails it."""

    class Forgetful(WorkItemNode):
        def reset(self, initial_state: dict[str, Any] | None = None) -> None:
            super().reset(None)

    node = Forgetful(Pipeline(recipe()).work_source, 0, 2)
    with pytest.raises(AssertionError, match="restore at the midpoint of epoch 0"):
        assert_save_load_state(node, 3)
