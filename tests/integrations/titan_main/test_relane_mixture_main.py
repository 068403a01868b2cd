"""The main adapter: a re-lane at load, and set_mixture decisions kept across a resume at
another dp size (DCP across ranks simulated by the union of the ranks' state dicts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

from tests.integrations.assets import Assets, write_recipe
from tests.integrations.mixture_assets import write_two_dataset_recipe
from tests.integrations.titan_main.helpers import (
    build,
    dcp_load,
    optimizer_steps,
    union,
)
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

pytestmark = pytest.mark.titan_main


def test_relane_at_load(assets: Assets, tmp_path: Path) -> None:
    """4 lanes on dp 2 (G = 12), checkpoint at step 3, re-laned to 6 lanes on dp 3 and 6."""
    r4 = write_recipe(tmp_path / "r4.toml", assets, num_lanes=4, global_batch_size=12)
    r6 = write_recipe(tmp_path / "r6.toml", assets, num_lanes=6, global_batch_size=12)
    first = [build(r4, 2, r, rows=2) for r in range(2)]
    optimizer_steps(first, [iter(x) for x in first], 3, 3, spl=3)
    stored = union([x.state_dict() for x in first])
    four = Pipeline(Recipe.from_toml(r4), provenance=False)
    saved: list[dict[str, Any]] = []
    for _ in simulate(four, 2, 3, num_workers=1, save_at=3, on_save=saved.append):
        pass
    six = Pipeline(Recipe.from_toml(r6), provenance=False)
    new = relane_state(four, saved[0], 6)
    want = [r.digest for r, _ in simulate(six, 1, 2, num_workers=1, resume_state=new)]
    for world in (3, 6):
        rows = 2 if world == 3 else 1
        loaders = [build(r6, world, r, rows=rows, relane_from=4) for r in range(world)]
        for loader in loaders:
            dcp_load(loader, stored)
        accum = 12 // (world * rows)
        assert optimizer_steps(loaders, [iter(x) for x in loaders], 2, accum, spl=2) == want


def test_decisions_survive_a_resume_at_another_dp(assets: Assets, tmp_path: Path) -> None:
    recipe = write_two_dataset_recipe(tmp_path / "mix.toml", assets)
    decision = {"prose": 0.25, "code": 0.75}
    pipeline = Pipeline(Recipe.from_toml(recipe), provenance=False)
    want = [
        r.digest
        for r, _ in simulate(pipeline, 1, 5, num_workers=0, mixture_updates=[(2, decision)])
    ]
    first = [build(recipe, 2, r, rows=2) for r in range(2)]
    iters = [iter(x) for x in first]
    got = optimizer_steps(first, iters, 2, 2)
    for loader in first:
        loader.set_mixture(decision)
    got += optimizer_steps(first, iters, 1, 2)
    assert got == want[:3]
    stored = union([x.state_dict() for x in first])
    assert int(stored["mixture_count"]) == 1
    for world, rows in ((1, 4), (4, 1)):
        resumed = [build(recipe, world, r, rows=rows) for r in range(world)]
        for loader in resumed:
            dcp_load(loader, stored)
            assert loader.mixture_log == [(2, decision)]
        accum = 8 // (world * rows)
        assert optimizer_steps(resumed, [iter(x) for x in resumed], 2, accum) == want[3:]
