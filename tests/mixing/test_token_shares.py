"""Mixing by token share: the plan and the measured shares of the emitted tokens."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.mixing.helpers import (
    ALPHABETS,
    base_recipe,
    label_counts_by_alphabet,
    memory_dataset,
    run_batches,
    texts,
    two_length_recipe,
)
from zephon_nodes import Pipeline, WorkSpec
from zephon_nodes.commands.stats import compute_stats
from zephon_nodes.engine.mixing import MixingWorkSource


class TestTokenShares:
    """Non-padding token shares follow the weights; document shares do not."""

    @pytest.mark.parametrize("w_short", [0.2, 0.5, 0.8])
    def test_token_shares_within_002_of_weights(self, w_short):
        """Over ~400k tokens of 10x-different document lengths, token shares match weights."""
        recipe = two_length_recipe(w_short)
        batches = run_batches(Pipeline(recipe), 100, num_workers=2)
        counts = label_counts_by_alphabet(batches)
        assert counts.sum() > 300_000
        share_short = counts[0] / counts.sum()
        assert abs(share_short - w_short) < 0.02, share_short

    def test_document_shares_are_not_the_weights(self):
        """With equal token weights, the short dataset supplies most documents."""
        stats = compute_stats(two_length_recipe(0.5), 60)
        assert abs(stats["token_shares"]["short"] - 0.5) < 0.02
        assert stats["document_shares"]["short"] > 0.8
        assert stats["documents_per_dataset"]["short"] > 5 * stats["documents_per_dataset"]["long"]

    def test_stats_token_counts_agree_with_the_batches(self):
        """`zephon stats` counts the same per-dataset tokens as the label alphabets show."""
        recipe = two_length_recipe(0.3)
        counts = label_counts_by_alphabet(run_batches(Pipeline(recipe), 20))
        stats = compute_stats(recipe, 20, dp_world_size=2)
        assert stats["tokens_per_dataset"] == {"short": counts[0], "long": counts[1]}
        assert stats["steps"] == 20

    def test_three_datasets(self):
        """Three datasets with different lengths get their token weights."""
        weights = (0.5, 0.3, 0.2)
        specs = [
            memory_dataset(
                name, texts(ALPHABETS[k], 1500, lo, hi, k), weight=w, on_exhausted="repeat"
            )
            for k, (name, w, lo, hi) in enumerate(
                zip(("a", "b", "c"), weights, (10, 100, 300), (30, 200, 500), strict=True)
            )
        ]
        recipe = base_recipe(specs, seq_len=256, global_batch_size=16, num_lanes=8)
        counts = label_counts_by_alphabet(run_batches(Pipeline(recipe), 80), n=3)
        shares = counts / counts.sum()
        for got, want in zip(shares, weights, strict=True):
            assert abs(got - want) < 0.02, shares


def plan(weights, costs, block=64, seed=0, num_items=(1000,) * 3):
    """A MixingWorkSource over fake datasets (only item counts matter to the plan)."""
    from zephon_nodes.recipe.schedule import WeightSchedule

    class _FakeDataset:
        def __init__(self, n):
            self.num_work_items = n
            self.name = f"d{n}"

    total = sum(weights)
    schedule = WeightSchedule(((0.0, tuple(w / total for w in weights)),))
    datasets = [_FakeDataset(n) for n in num_items[: len(weights)]]
    return MixingWorkSource(
        datasets, seed, 4, None, ["repeat"] * len(weights), schedule, costs, block
    )


class TestPlan:
    """The item plan: exact counts per block, a pure function, O(1) jumps."""

    @given(
        weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4),
        costs=st.lists(st.floats(1.0, 1000.0), min_size=4, max_size=4),
        g=st.integers(0, 10**7),
    )
    def test_counts_track_the_ideal_item_shares(self, weights, costs, g):
        """Among the first g items, each dataset's count is within 2 items per block boundary."""
        costs = costs[: len(weights)]
        src = plan(weights, costs, num_items=(10**9,) * 4)
        p = [w / c for w, c in zip(weights, costs, strict=True)]
        ideal = [x / sum(p) for x in p]
        block = src.block
        seg = g // block
        before = src.items_before(seg)
        assert sum(before) == seg * block
        for d, n in enumerate(before):
            assert abs(n - ideal[d] * seg * block) <= len(weights), (d, n)

    @given(
        weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=3),
        seg=st.integers(0, 10**6),
    )
    def test_each_block_holds_consecutive_items_of_each_dataset(self, weights, seg):
        """Over a block of a lane's items, dataset d's items are exactly the next ones."""
        src = plan(weights, [1.0] * len(weights))
        block = src.block
        got = [src.locate(seg * block + r, lane=1) for r in range(block)]
        before = src.counts(1, seg * block)
        after = src.counts(1, (seg + 1) * block)
        assert sum(after) - sum(before) == block
        for d in range(len(weights)):
            ks = [k for dd, k in got if dd == d]
            assert ks == list(range(before[d], after[d]))  # in order, none missing

    def test_blocks_are_shuffled_so_lanes_see_a_mix(self):
        """With two equal datasets, each lane gets both datasets in a shuffled order."""
        src = plan([1.0, 1.0], [1.0, 1.0], block=1024)
        for lane in range(2):
            seen = Counter(src.locate(i, lane)[0] for i in range(2000))
            assert min(seen.values()) > 800, seen

    def test_jump_equals_walk(self):
        """A fresh source asked for a far item agrees with one that walked there."""
        a = plan([0.3, 0.7], [10.0, 3.0])
        b = plan([0.3, 0.7], [10.0, 3.0])
        walked = [a.locate(g) for g in range(5000)]
        assert [b.locate(g) for g in range(4999, -1, -1)] == walked[::-1]


class TestEpochs:
    """Per-dataset epochs: "end" ends the stream, "repeat" starts a new seeded order."""

    def test_end_stops_when_the_first_end_dataset_is_exhausted(self):
        """Every item of the 'end' dataset appears exactly once, then the stream ends."""
        small = memory_dataset("small", texts("abc", 40, 5, 10, 1))
        big = memory_dataset("big", texts("xyz", 400, 5, 10, 2), on_exhausted="repeat")
        recipe = base_recipe([small, big], work=WorkSpec(chunk_size=2, epochs=1))
        p = Pipeline(recipe)
        ws = p.work_source
        seen = []
        for lane in range(recipe.num_lanes):
            i = 0
            while (item := ws.work(lane, i)) is not None:
                if item.dataset_name == "small":
                    seen.append(item.item)
                i += 1
        assert sorted(seen) == list(range(20))

    def test_repeat_uses_a_new_order_each_epoch(self):
        """A repeating dataset cycles through all its items in a different order per epoch."""
        small = memory_dataset("small", texts("abc", 40, 5, 10, 1), on_exhausted="repeat")
        big = memory_dataset("big", texts("xyz", 400, 5, 10, 2), on_exhausted="repeat")
        recipe = base_recipe([small, big], work=WorkSpec(chunk_size=2, epochs=1), num_lanes=1)
        ws = Pipeline(recipe).work_source
        by_epoch: dict[int, list[int]] = {}
        i = 0
        while len(by_epoch.get(2, [])) < 20:
            item = ws.work(0, i)
            assert item is not None
            if item.dataset_name == "small":
                by_epoch.setdefault(item.epoch, []).append(item.item)
            i += 1
        assert sorted(by_epoch[0]) == sorted(by_epoch[1]) == list(range(20))
        assert by_epoch[0] != by_epoch[1]
