"""Per-operator pools (a physical setting) and pool ownership by the rank node."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import Loader, Prefetcher

from tests.core.helpers import check_random_operator_pools, digests, texts_recipe
from tests.strategies import chain_recipes
from zephon_nodes import OperatorSpec, Pipeline, Recipe, WorkerPool
from zephon_nodes.engine.operator_pools import PoolSpec, parse_operator_workers, split_stages
from zephon_nodes.errors import RecipeError
from zephon_nodes.recipe import PackSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _texts(n: int = 48) -> list[str]:
    return [(f"hello world {i} ") * (i % 7 + 1) for i in range(n)]


def _filtered_recipe(**kw: Any) -> Recipe:
    ops = (OperatorSpec("filter", "min_chars", {"n": 20}), OperatorSpec("map", "strip"))
    return texts_recipe(_texts(), operators=ops, **kw)


class TestSyntax:
    def test_parse(self) -> None:
        got = parse_operator_workers("decode=process:6, tokenize=thread:2,parse=inline,map=thread")
        assert got == {
            "decode": PoolSpec("process", 6),
            "tokenize": PoolSpec("thread", 2),
            "parse": PoolSpec("inline", 0),
            "map": PoolSpec("thread", 2),
        }
        assert [str(v) for v in got.values()] == ["process:6", "thread:2", "inline", "thread:2"]

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("decode", "must read OPERATOR=RUNNER"),
            ("decode=fork:2", "runner 'fork' must be one of"),
            ("decode=process:x", "worker count 'x' must be an integer"),
            ("decode=thread:0", "num_workers=0 must be >= 1"),
            ("decode=thread:1,decode=inline", "given a pool twice"),
        ],
    )
    def test_malformed(self, text: str, message: str) -> None:
        with pytest.raises(RecipeError, match=message):
            parse_operator_workers(text)

    def test_split_stages_groups_consecutive_operators(self) -> None:
        pipeline = Pipeline(_filtered_recipe(pack=PackSpec(mode="bestfit")))
        names = ["parse", "filter:min_chars", "map:strip", "tokenize", "long_documents"]
        assert [op.name for op in pipeline.stateless.operators] == names
        cut = split_stages(pipeline.stateless, {"filter": 1, "map": 1, "long": 2})
        assert [(c.name, k) for c, k in cut] == [
            ("parse", None),
            ("filter:min_chars", "filter"),
            ("map:strip", "map"),
            ("tokenize", None),
            ("long_documents", "long"),
        ]
        cut = split_stages(pipeline.stateless, {})
        assert [(c.name, k) for c, k in cut] == [("+".join(names), None)]

    def test_unknown_and_ambiguous_operator(self) -> None:
        pipeline = Pipeline(_filtered_recipe())
        with pytest.raises(RecipeError, match=r"'decode', which is not an operator.*'parse'"):
            pipeline.rank_node(operator_pools={"decode": "process:2"})
        with pytest.raises(RecipeError, match="both 'filter' and 'filter:min_chars'"):
            pipeline.rank_node(operator_pools={"filter": "inline", "filter:min_chars": "inline"})


@pytest.fixture(scope="module")
def pools() -> Iterator[dict[str, WorkerPool]]:
    made = {
        "inline": WorkerPool(0),
        "thread:1": WorkerPool(1, "thread"),
        "thread:2": WorkerPool(2, "thread"),
        "process:2": WorkerPool(2, "process"),
    }
    yield made
    for p in made.values():
        p.close()


@settings(max_examples=12)
@given(recipe=chain_recipes(), data=st.data())
def test_random_operator_pools_match_inline_reference(
    pools: dict[str, WorkerPool], recipe: Recipe, data: st.DataObject
) -> None:
    """Any runner/worker assignment per operator, any dp size, resumed anywhere: same bytes."""
    check_random_operator_pools(recipe, pools, data.draw, 12)


def test_spec_strings_in_simulate_are_created_and_closed() -> None:
    pipeline = Pipeline(_filtered_recipe())
    reference = digests(pipeline, 1, num_workers=0)
    before = threading.active_count()
    got = digests(pipeline, 2, operator_pools={"tokenize": "thread:2", "filter": "inline"})
    assert got == reference and len(reference) > 3
    assert _settled_threads(before) <= before


# ---------------------------------------------------------------------------- ownership


def _settled_threads(target: int, timeout_s: float = 5.0) -> int:
    """The thread count once it falls to ``target`` (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while threading.active_count() > target and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    return threading.active_count()


def _children() -> int:
    me = str(os.getpid())
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n += fields[1] == me and fields[0] != "Z"
    return n


@pytest.fixture(scope="module")
def small() -> Pipeline:
    return Pipeline(texts_recipe(_texts(24)))


class TestOwnership:
    def test_hundred_rebuilds_leave_thread_count_flat(self, small: Pipeline) -> None:
        before = threading.active_count()
        for i in range(100):
            node = small.rank_node()
            node.reset(None)
            next(node)
            assert threading.active_count() >= before + 2  # the node's own 2 threads run
            if i % 3 == 0:
                node.close()
            elif i % 3 == 1:
                with node:
                    next(node)
            del node  # the third kind: dropped, closed when garbage-collected
        assert _settled_threads(before) == before

    def test_dropped_loader_with_prefetcher_closes_the_pool(self, small: Pipeline) -> None:
        before = threading.active_count()
        loader = Loader(Prefetcher(small.rank_node(operator_pools={"tokenize": "thread:2"}), 2))
        it = iter(loader)
        next(it)
        assert threading.active_count() >= before + 4
        del it, loader
        assert _settled_threads(before) == before

    def test_a_pool_passed_in_is_not_closed(self, small: Pipeline) -> None:
        reference = digests(small, 1, num_workers=0)
        with WorkerPool(2, "thread") as pool:
            for _ in range(2):
                with small.rank_node(pool=pool, operator_pools={"parse": pool}) as node:
                    node.reset(None)
                    next(node)
            assert pool._executor is not None  # still running: the caller's
            assert digests(small, 1, pool=pool) == reference

    def test_closed_node_restarts_on_reset(self, small: Pipeline) -> None:
        reference = digests(small, 1, num_workers=0)
        node = small.rank_node()
        node.reset(None)
        start = node.state_dict()
        first = [next(node)["input"].clone() for _ in range(2)]
        node.close()
        node.reset(start)  # (a reset without a state would start the next pass)
        again = [next(node)["input"] for _ in range(2)]
        assert all((a == b).all() for a, b in zip(first, again, strict=True))
        node.close()
        assert len(reference) > 2

    def test_process_pools_are_stopped_on_every_rebuild(self, small: Pipeline) -> None:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # multiprocessing's own child, started once
        before = _children()
        for i in range(2):  # closed, then dropped
            node = small.rank_node(operator_pools={"tokenize": "process:1"})
            node.reset(None)
            next(node)
            assert _children() >= before + 1
            if i == 0:
                node.close()
            del node
            gc.collect()
            deadline = time.monotonic() + 10
            while _children() > before and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _children() == before
