"""``zephon lanes``: lane counts that fit every planned dp size, and their replay cost."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.commands.run import zephon
from zephon_nodes.commands.lanes import suggest_lanes
from zephon_nodes.core.errors import RecipeError


class TestSuggestLanes:
    def test_common_multiples_that_divide_the_global_batch(self) -> None:
        options = suggest_lanes([8, 16, 32], 512)
        assert [o.num_lanes for o in options] == [32, 64, 128, 256, 512]
        o = options[0]
        assert o.samples_per_lane == 16
        assert o.lanes_per_rank == {8: 4, 16: 2, 32: 1}
        assert o.replay_items_per_lane == 8
        assert o.replay_records_per_lane == 8 * 64
        assert o.replay_items_per_rank == {8: 32, 16: 16, 32: 8}

    def test_non_power_of_two_sizes(self) -> None:
        assert [o.num_lanes for o in suggest_lanes([2, 3], 36)] == [6, 12, 18, 36]

    def test_no_fit(self) -> None:
        assert suggest_lanes([3, 4], 512) == []

    def test_bad_arguments(self) -> None:
        with pytest.raises(RecipeError, match="global_batch_size=0"):
            suggest_lanes([2], 0)
        with pytest.raises(RecipeError, match="dp sizes"):
            suggest_lanes([0], 8)


class TestLanesCommand:
    def test_table_and_suggestion(self, capsys: Any) -> None:
        status = zephon("lanes", "--dp", "8,16,32", "--global-batch", "512", "--flush-every", "4")
        out = capsys.readouterr().out
        assert status == 0
        rows = [line.split() for line in out.splitlines()[2:7]]
        assert [r[0] for r in rows] == ["32", "64", "128", "256", "512"]
        assert rows[0][:5] == ["32", "16", "4", "2", "1"]
        assert "suggested: num_lanes=32" in out
        assert "--flush-every=4 work items per lane" in out

    def test_json(self, capsys: Any) -> None:
        assert zephon("lanes", "--dp", "2,4", "--global-batch", "16", "--json") == 0
        data = json.loads(capsys.readouterr().out)
        assert [d["num_lanes"] for d in data] == [4, 8, 16]
        assert data[1]["replay_items_per_rank"] == {"2": 32, "4": 16}

    def test_no_fit_exits_1(self, capsys: Any) -> None:
        assert zephon("lanes", "--dp", "3,4", "--global-batch", "512") == 1
        assert "multiple of lcm(3,4)=12" in capsys.readouterr().out

    def test_bad_dp_list(self, capsys: Any) -> None:
        assert zephon("lanes", "--dp", "8,x", "--global-batch", "512") == 2
        assert "must be integers" in capsys.readouterr().out
