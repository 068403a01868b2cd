"""Epochs through a Loader: a second ``iter()`` reads the recipe's next pass, in its own
seeded order; never a byte-for-byte repeat. Pass states resume at other dp sizes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from torchdata.nodes import Loader, Prefetcher

from tests.torchdata.helpers import recipe, texts
from zephon_nodes import (
    CheckpointError,
    DatasetSpec,
    Pipeline,
    WorkerPool,
    WorkSpec,
    merge_states,
)
from zephon_nodes.engine.lane import WorkItemNode
from zephon_nodes.testing import ListWorkSource, assert_save_load_state
from zephon_nodes.verification.digest import digest_microbatches


def _digests(batches: list[dict[str, Any]]) -> list[str]:
    return [digest_microbatches([b]) for b in batches]


def _items(ws: Any, lanes: int) -> list[tuple[int, int]]:
    """(item, epoch) of every work item of every lane."""
    out = []
    for lane in range(lanes):
        i = 0
        while (w := ws.work(lane, i)) is not None:
            out.append((w.item, w.epoch))
            i += 1
    return out


@pytest.mark.parametrize("epochs", [1, 2])
def test_each_pass_reads_every_item_in_a_new_order(epochs: int) -> None:
    p = Pipeline(recipe(work=WorkSpec(chunk_size=3, epochs=epochs)))
    n = p.datasets[0].num_work_items
    passes = [_items(p.work_source.for_pass(k), 8) for k in range(3)]
    for k, items in enumerate(passes):
        # every item exactly `epochs` times, in data epochs k*epochs .. (k+1)*epochs - 1
        assert Counter(i for i, _ in items) == Counter({i: epochs for i in range(n)})
        assert {e for _, e in items} == set(range(k * epochs, (k + 1) * epochs))
    assert passes[0] != passes[1] and passes[1] != passes[2]


def test_a_second_iter_continues_with_the_next_pass() -> None:
    p = Pipeline(recipe(60))
    with WorkerPool(0) as pool:
        node = p.rank_node(pool=pool)
        loader = Loader(node)
        runs = [_digests(list(loader)) for _ in range(3)]
        assert node.pass_index == 2
    assert all(len(r) > 3 for r in runs)
    assert runs[0] != runs[1] and runs[1] != runs[2] and runs[0] != runs[2]
    assert not set(runs[0]) & set(runs[1]), "a global batch of pass 0 repeats in pass 1"
    # a fresh rank node starts at pass 0 again: the passes are a function of the recipe
    with WorkerPool(0) as pool:
        assert _digests(list(Loader(p.rank_node(pool=pool)))) == runs[0]


def test_torchdata_save_load_scenarios_across_passes() -> None:
    """Mid-epoch, next epoch, end of epoch, through a Loader and a Prefetcher."""
    p = Pipeline(recipe(60))
    with WorkerPool(2) as pool:
        assert_save_load_state(p.rank_node(2, 1, pool=pool, local_batch_size=4), 3)
        assert_save_load_state(Prefetcher(p.rank_node(4, 0, pool=pool), 2), 2)


def test_a_state_in_the_second_pass_resumes_at_other_dp_sizes() -> None:
    p = Pipeline(recipe(60))
    with WorkerPool(0) as pool:
        ref = Loader(p.rank_node(pool=pool))
        list(ref)
        second = _digests(list(ref))
        states = []
        for rank in range(2):
            loader = Loader(p.rank_node(2, rank, pool=pool))
            list(loader)
            it = iter(loader)
            for _ in range(2):
                next(it)
            states.append(json.loads(json.dumps(loader.state_dict())))
        merged = merge_states(states)
        assert merged["pass"] == 1 and merged["step"] == 2
        for dp in (1, 4):
            per_rank = []
            for rank in range(dp):
                node = p.rank_node(dp, rank, pool=pool)
                node.reset(merged)
                per_rank.append([next(node) for _ in range(2)])
            got = [digest_microbatches([r[s] for r in per_rank]) for s in range(2)]
            assert got == second[2:4], f"dp {dp}"


def test_ranks_in_different_passes_are_not_merged() -> None:
    p = Pipeline(recipe(60))
    with WorkerPool(0) as pool:
        a, b = p.rank_node(2, 0, pool=pool), p.rank_node(2, 1, pool=pool)
        list(Loader(a))
        a.reset(None)
        b.reset(None)
        with pytest.raises(CheckpointError, match="ranks disagree on pass: 1 vs None"):
            merge_states([a.get_state(), b.get_state()])


def test_an_endless_recipe_starts_a_fresh_stream_on_a_new_pass() -> None:
    p = Pipeline(recipe(60, work=WorkSpec(chunk_size=3, epochs=None)))
    second = p.work_source.for_pass(1)
    assert second is not None
    assert second.work(0, 0).epoch == 1 << 32  # type: ignore[union-attr]
    with WorkerPool(0) as pool:
        node = p.rank_node(pool=pool)
        node.reset(None)
        first = [digest_microbatches([next(node)]) for _ in range(3)]
        node.reset(None)
        again = [digest_microbatches([next(node)]) for _ in range(3)]
    assert node.pass_index == 1 and first != again


def test_mixing_passes_have_their_own_order() -> None:
    p = Pipeline(
        recipe(
            60,
            datasets=(
                DatasetSpec("a", records=tuple({"text": t} for t in texts(40)), weight=1.0),
                DatasetSpec("b", records=tuple({"text": t} for t in texts(40, 5)), weight=1.0),
            ),
        )
    )
    one, two = _items(p.work_source, 8), _items(p.work_source.for_pass(1), 8)
    assert one and two and one != two
    assert min(e for _, e in two) >= 1


def test_a_work_source_without_passes_ends_after_one() -> None:
    node = WorkItemNode(ListWorkSource([1, 2, 3]), 0, 2)
    node.reset({"index": 0, "flushed": True, "pass": 1})
    assert list(node) == []
    node.reset(None)
    assert [x for x in node if isinstance(x, int)] == [1, 2, 3]


def test_the_torchtitan_layout_refuses_a_later_pass() -> None:
    pytest.importorskip("torchtitan")
    from zephon_nodes.integrations.torchtitan import to_dcp_state

    p = Pipeline(recipe(60))
    with WorkerPool(0) as pool:
        node = p.rank_node(pool=pool)
        list(Loader(node))
        node.reset(None)
        state = node.get_state()
    assert state["pass"] == 1
    with pytest.raises(CheckpointError, match="stores pass 0 only"):
        to_dcp_state(state, dp_world_size=1, local_batch_size=16)


def _mixed() -> Pipeline:
    return Pipeline(
        recipe(
            60,
            datasets=(
                DatasetSpec("a", records=tuple({"text": t} for t in texts(60)), weight=1.0),
                DatasetSpec("b", records=tuple({"text": t} for t in texts(60, 5)), weight=1.0),
            ),
        )
    )


def test_decisions_belong_to_their_pass() -> None:
    """A second pass starts with the recipe's weights and an empty decision log.

    The reference is a rank node that never decided: its second pass is what any node's
    second pass must be. Decisions made in pass 1 then work, and a state in pass 1 with its
    log resumes at another dp size.
    """
    p = _mixed()
    with WorkerPool(0) as pool:
        plain = Loader(p.rank_node(pool=pool))
        first_plain = _digests(list(plain))
        second_plain = _digests(list(plain))
        node = p.rank_node(pool=pool)
        node.reset(None)
        head = _digests([next(node) for _ in range(3)])
        node.set_mixture({"a": 0.0, "b": 1.0})  # keeps the pass and the step
        decided = _digests(list(node))
        assert head == first_plain[:3] and head + decided != first_plain
        assert node.mixture_log == [(3, {"a": 0.0, "b": 1.0})]
        node.reset(None)  # the next pass
        assert node.pass_index == 1 and node.mixture_log == []
        second = [digest_microbatches([b]) for b in node]
        assert second == second_plain and second != first_plain[: len(second)]
        # deciding in pass 1, saved on dp 2 and resumed on dp 4
        node.reset(None)  # pass 2 on this node; pass 1 again on fresh ranks below
        ranks = [p.rank_node(2, r, pool=pool) for r in range(2)]
        for r in ranks:
            r.reset(None)
            list(r)  # through pass 0
            r.reset(None)
            for _ in range(2):
                next(r)
            r.set_mixture({"a": 1.0, "b": 0.0})
        saved = merge_states([r.get_state() for r in ranks])
        assert saved["pass"] == 1 and saved["mixture"]["log"][0]["step"] == 2
        ref = _steps(ranks)
        resumed = [p.rank_node(4, r, pool=pool) for r in range(4)]
        for r in resumed:
            r.reset(saved)
        assert _steps(resumed) == ref
        assert ref != second_plain[2:]  # the decision changed pass 1's batches


def _steps(ranks: list[Any]) -> list[str]:
    """Digests of the global batches the ranks yield until the data ends."""
    out = []
    while True:
        try:
            out.append(digest_microbatches([next(r) for r in ranks]))
        except StopIteration:
            return out
