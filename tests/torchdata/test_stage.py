"""torchdata nodes inside lanes: TorchdataStage, the refusal of a chain without window
restore, the kit catching such a node, and random chains checked against a reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import BaseNode, Mapper

from tests.torchdata.helpers import STAGE_KINDS, WindowNumbered, recipe, reference
from zephon_nodes import AccumulatorNode, Pipeline, RecipeError, TorchdataStage, WorkerPool
from zephon_nodes.engine.lane import Lane, WorkItemNode
from zephon_nodes.operators import ShuffleBuffer
from zephon_nodes.testing import assert_save_load_state, assert_state_roundtrip, list_source
from zephon_nodes.verification.simulate import simulate


def staged(kind: str) -> Callable[[], BaseNode[Any]]:
    return lambda: TorchdataStage(list_source(list(range(11)), 3), STAGE_KINDS[kind])


# -- the stage on its own ---------------------------------------------------------------------


def test_the_stage_keeps_markers_outside_and_restarts_the_node_per_window() -> None:
    items = [{"v": v} for v in (10, 20, 30, 40, 50)]
    node = TorchdataStage(list_source(items, 2), WindowNumbered)
    node.reset(None)
    out = list(node)
    assert [type(x).__name__ for x in out] == [
        "dict", "dict", "Flush", "dict", "dict", "Flush", "dict", "Flush"
    ]  # fmt: skip
    assert [(x["v"], x["n"].item()) for x in out if isinstance(x, dict)] == [
        (10, 1), (20, 2), (30, 1), (40, 2), (50, 1)
    ]  # fmt: skip


@pytest.mark.parametrize("kind", list(STAGE_KINDS))
def test_stage_state_roundtrip_and_window_restore(kind: str) -> None:
    if kind in ("Mapper", "ParallelMapper"):
        make = lambda feed: Mapper(feed, lambda x: x * 3)  # noqa: E731
        if kind == "ParallelMapper":
            from torchdata.nodes import ParallelMapper

            make = lambda feed: ParallelMapper(feed, lambda x: x * 3, 2)  # noqa: E731
        factory = lambda: TorchdataStage(list_source(list(range(11)), 3), make)  # noqa: E731
    else:
        factory = lambda: TorchdataStage(  # noqa: E731
            list_source([{"input": i} for i in range(11)], 3), STAGE_KINDS[kind]
        )
    assert_state_roundtrip(factory, json_safe=True, max_positions=20)


# -- refusal and the kit -----------------------------------------------------------------------


def test_a_lane_refuses_a_torchdata_node_without_window_restore() -> None:
    with pytest.raises(RecipeError, match=r"cannot be restored inside lane 0.*TorchdataStage"):
        Lane(Mapper(list_source(list(range(5)), 2), lambda x: x), 0)
    with pytest.raises(RecipeError, match=r"WindowNumbered cannot be restored"):
        Lane(AccumulatorNode(WindowNumbered(list_source([], 2)), lambda w: None), 0)  # type: ignore[arg-type]


def test_a_pipeline_with_a_raw_node_in_its_lanes_is_refused_when_built() -> None:
    class Raw(Pipeline):
        def build_lane(self, lane: int, pool: WorkerPool, lookahead: int = 4) -> Lane:
            inner = super().build_lane(lane, pool, lookahead)
            return Lane(WindowNumbered(inner.source), lane)

    with pytest.raises(RecipeError, match="WindowNumbered cannot be restored inside lane 0"):
        Raw(recipe()).rank_node(1, 0, pool=WorkerPool(0))


def test_the_kit_catches_a_node_without_window_restore() -> None:
    with pytest.raises(AssertionError, match="has no state_at_window"):
        assert_state_roundtrip(lambda: Mapper(list_source(list(range(7)), 2), lambda x: x))


def test_the_kit_catches_a_wrong_window_restore() -> None:
    class Off(WorkItemNode):
        def state_at_window(self, window: int) -> dict[str, Any]:
            return super().state_at_window(max(0, window - 1))

    with pytest.raises(AssertionError, match=r"state_at_window\(1\) does not restore"):
        assert_state_roundtrip(lambda: Off(list_source([1, 2, 3, 4, 5], 2).work_source, 0, 2))


# -- whole lanes and rank nodes: torchdata's save/load scenarios -------------------------------


@pytest.mark.parametrize("kind", ["Mapper", "user node"])
def test_save_load_scenarios_with_a_torchdata_node_in_the_lanes(kind: str) -> None:
    p = Pipeline(recipe(60), stages=[STAGE_KINDS[kind]])
    with WorkerPool(2, "thread") as pool:
        assert_save_load_state(p.build_lane(3, pool), 4)
        assert_save_load_state(p.rank_node(2, 1, pool=pool, local_batch_size=4), 3)


def test_stages_change_the_batches_as_written() -> None:
    """The stage is not a no-op: the shifted inputs are the plain ones plus one."""
    plain, shifted = Pipeline(recipe(60)), Pipeline(recipe(60), stages=[STAGE_KINDS["Mapper"]])
    with WorkerPool(0) as pool:
        a, b = next(plain.rank_node(pool=pool)), next(shifted.rank_node(pool=pool))
    assert (b["input"] == a["input"] + 1).all() and (b["labels"] == a["labels"]).all()


# -- random chains: library accumulators and adapted torchdata nodes ---------------------------


class ChainPipeline(Pipeline):
    """Lanes ending in a chain of adapted torchdata nodes and library shuffle buffers."""

    def __init__(self, chain: tuple[str, ...], **kw: Any) -> None:
        super().__init__(recipe(**kw))
        self.chain = chain

    def build_lane(self, lane: int, pool: WorkerPool, lookahead: int = 4) -> Lane:
        node: BaseNode[Any] = super().build_lane(lane, pool, lookahead).source
        for k, kind in enumerate(self.chain):
            if kind == "shuffle":
                seed = self.recipe.seed + k
                node = AccumulatorNode(node, lambda w, s=seed: ShuffleBuffer(3, s, lane, w))
            else:
                node = TorchdataStage(node, STAGE_KINDS[kind], name=kind)
        return Lane(node, lane)


@settings(max_examples=6)
@given(
    chain=st.lists(
        st.sampled_from(["shuffle", "Mapper", "Batcher+Unbatcher", "user node"]),
        min_size=1,
        max_size=3,
    ),
    dp=st.sampled_from([2, 4, 8]),
    workers=st.sampled_from([0, 2]),
    save_at=st.integers(1, 4),
    resume_dp=st.sampled_from([1, 2, 4, 8]),
)
def test_random_chains_are_elastic(
    chain: list[str], dp: int, workers: int, save_at: int, resume_dp: int
) -> None:
    steps = 6
    p = ChainPipeline(tuple(chain), n=120)
    ref = reference(p, steps)
    assert len(ref) == steps
    saved: list[dict[str, Any]] = []
    first = [
        r.digest
        for r, _ in simulate(
            p, dp, save_at, num_workers=workers, save_at=save_at, on_save=saved.append
        )
    ]
    rest = [r.digest for r, _ in simulate(p, resume_dp, steps - save_at, resume_state=saved[0])]
    assert first + rest == ref, f"{chain=} {dp=} {workers=} {save_at=} {resume_dp=}"


def test_a_parallel_mapper_stage_is_elastic() -> None:
    """ParallelMapper (thread workers, in order) inside every lane, resumed at dp 4."""
    p = ChainPipeline(("ParallelMapper", "shuffle"), n=80)
    ref = reference(p, 4)
    saved: list[dict[str, Any]] = []
    first = [r.digest for r, _ in simulate(p, 2, 2, save_at=2, on_save=saved.append)]
    rest = [r.digest for r, _ in simulate(p, 4, 2, resume_state=saved[0])]
    assert first + rest == ref
