"""The end of finite data: every sample is delivered or counted as unused, at any dp size."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.commands.conftest import RECIPE, write_recipe
from tests.commands.run import zephon
from tests.torchdata.helpers import recipe
from zephon_nodes import DataError, Pipeline, Recipe, RecipeError, WorkerPool, WorkSpec
from zephon_nodes.engine.end_of_data import unused_samples
from zephon_nodes.verification.simulate import simulate


def _lane_totals(p: Pipeline) -> dict[int, int]:
    """Samples each lane holds, counted on the lanes alone (no multiplexer)."""
    with WorkerPool(0) as pool:
        return {lane: sum(1 for _ in p.build_lane(lane, pool)) for lane in range(p.num_lanes)}


def test_every_sample_is_delivered_or_counted() -> None:
    p = Pipeline(recipe(200))
    totals = _lane_totals(p)
    spl = p.recipe.samples_per_lane
    reports = []
    for dp, workers in ((1, 0), (2, 2), (8, 0)):
        ended: dict[str, Any] = {}
        steps = len(list(simulate(p, dp, 10_000, num_workers=workers, on_end=ended.update)))
        assert ended["step"] == steps
        unused = unused_samples(p, ended)
        assert {lane: steps * spl + n for lane, n in unused.items()} == totals, f"dp {dp}"
        reports.append(unused)
    assert reports[0] == reports[1] == reports[2]
    assert sum(reports[0].values()) > 0, "the lanes are equal: the test would not count anything"
    assert min(reports[0].values()) < spl  # the shortest lane ran dry


def test_a_rank_counts_its_own_lanes_at_the_end() -> None:
    p = Pipeline(recipe(200))
    totals = _lane_totals(p)
    with WorkerPool(0) as pool:
        node = p.rank_node(2, 1, pool=pool, local_batch_size=4)
        with pytest.raises(RuntimeError, match="only after the stream has ended"):
            node.unused_samples()
        delivered = sum(mb["input"].shape[0] for mb in node)
    unused = node.unused_samples()
    assert sorted(unused) == [4, 5, 6, 7]
    assert delivered + sum(unused.values()) == sum(totals[lane] for lane in unused)


def test_the_error_policy_refuses_to_drop_samples() -> None:
    p = Pipeline(recipe(200, work=WorkSpec(chunk_size=3, epochs=1, end_of_data="error")))
    assert p.fingerprint == Pipeline(recipe(200)).fingerprint  # the batches are the same
    with WorkerPool(0) as pool:
        node = p.rank_node(pool=pool)
        with pytest.raises(DataError, match=r"end_of_data='error'.*samples not delivered"):
            for _ in node:
                pass


def test_the_policy_is_read_from_toml_and_checked(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, RECIPE.replace("epochs = 1", 'epochs = 1\nend_of_data = "error"'))
    assert Recipe.from_toml(path).work.end_of_data == "error"
    assert Recipe.from_toml(write_recipe(tmp_path)).work.end_of_data == "drop_report"
    with pytest.raises(RecipeError, match=r"work.end_of_data='pad' must be one of"):
        WorkSpec(end_of_data="pad")


def test_digest_and_stats_report_the_unused_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_recipe(tmp_path)
    assert zephon("digest", str(path), "--steps", "100000", "--num-workers", "0") == 0
    err = capsys.readouterr().err
    m = re.search(r"end of data: (\d+) of (\d+) samples unused .*; per lane: \{(.*)\}", err)
    assert m, err
    per_lane = dict(x.split(": ") for x in m.group(3).split(", "))
    assert sum(map(int, per_lane.values())) == int(m.group(1)) and len(per_lane) == 4
    assert zephon("stats", str(path), "--steps", "100000", "--num-workers", "0", "--json") == 0
    end = json.loads(capsys.readouterr().out)["end_of_data"]
    assert end["unused_samples"] == int(m.group(1))
    assert end["delivered_samples"] + end["unused_samples"] == int(m.group(2))
    assert end["unused_per_lane"] == {k: int(v) for k, v in per_lane.items()}
    p = Pipeline(Recipe.from_toml(path))
    assert sum(_lane_totals(p).values()) == int(m.group(2))
