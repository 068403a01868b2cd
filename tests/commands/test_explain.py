"""``zephon explain``: each rank's lanes, the lane chain, pools and checkpoint size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.commands.run import zephon
from zephon_nodes import Pipeline, Recipe


class TestExplain:
    def test_json(self, recipe_path: Path, capsys: Any) -> None:
        assert zephon("explain", str(recipe_path), "--dp-world-size", "2", "--json") == 0
        info = json.loads(capsys.readouterr().out)
        assert [r["lanes"] for r in info["ranks"]] == [[0, 1], [2, 3]]
        assert [r["samples_per_step"] for r in info["ranks"]] == [4, 4]
        assert info["ranks"][0]["in_flight_work_items"] == 2 * 4
        assert [n["operator"] for n in info["lane_chain"]] == [
            "work items + flush markers",
            "parse+tokenize",
            "ConcatPacker",
            "ShuffleBuffer",
        ]
        (d,) = info["datasets"]
        assert d["records"] == 300 and d["work_items"] == 300 // 8 + 1

    def test_checkpoint_size_is_the_real_state_size(self, recipe_path: Path, capsys: Any):
        zephon("explain", str(recipe_path), "--dp-world-size", "2", "--json")
        info = json.loads(capsys.readouterr().out)
        node = Pipeline(Recipe.from_toml(recipe_path)).rank_node(2, 0)
        node.reset(None)
        size = len(json.dumps(node.get_state()).encode())
        assert info["ranks"][0]["checkpoint_bytes"] == size
        for _ in range(11):  # later states grow (two-digit step), up to the bound
            next(node)
        later = len(json.dumps(node.get_state()).encode())
        assert size < later <= info["ranks"][0]["checkpoint_bytes_max"]

    def test_text(self, recipe_path: Path, capsys: Any) -> None:
        assert zephon("explain", str(recipe_path), "--dp-world-size", "4") == 0
        out = capsys.readouterr().out
        assert "rank 3: lanes 3 (1), 2 samples per step, pool 2 thread worker(s)" in out
        assert "2. parse+tokenize  [OrderedParallelMap, worker pool]" in out

    def test_lanes_that_do_not_divide(self, recipe_path: Path, capsys: Any) -> None:
        assert zephon("explain", str(recipe_path), "--dp-world-size", "3") == 2
        assert "num_lanes=4 must be a multiple of --dp-world-size=3" in capsys.readouterr().out

    def test_first_batch_tokens_and_time(self, recipe_path: Path, capsys: Any) -> None:
        """Each rank's first batch waits for every lane's shuffle buffer plus one step."""
        r = Recipe.from_toml(recipe_path)
        assert r.shuffle.buffer_size > 0
        args = ("explain", str(recipe_path), "--dp-world-size", "2", "--json")
        assert zephon(*args, "--tokens-per-s", "1000") == 0
        slow = json.loads(capsys.readouterr().out)["ranks"][0]["first_batch"]
        assert slow["tokens"] == 2 * (r.shuffle.buffer_size + r.samples_per_lane) * r.seq_len
        assert slow["seconds"] == slow["tokens"] / (1000 * 2)  # two workers
        assert zephon(*args, "--tokens-per-s", "2000", "--workers", "1") == 0
        fast = json.loads(capsys.readouterr().out)["ranks"][0]["first_batch"]
        assert fast["seconds"] == slow["seconds"]
        assert zephon("explain", str(recipe_path)) == 0
        assert "first batch: 4 lane(s) x" in capsys.readouterr().out
