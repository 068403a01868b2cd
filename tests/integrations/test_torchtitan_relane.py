"""ZephonDataLoader re-lanes a checkpoint at load when asked (dataloader.relane_from).

DCP across ranks is simulated by the union of the ranks' state dicts, as in
``test_torchtitan_loader.py`` (a key the new loader asks for must be in the checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.assets import Assets, write_recipe
from tests.integrations.test_torchtitan_loader import build, dcp_load, run_ranks, union
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.errors import CheckpointError
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate


@pytest.fixture(scope="module")
def recipes(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same recipe (G = 12) at 4, 6 and 2 lanes."""
    root = tmp_path_factory.mktemp("relane")
    return {
        n: write_recipe(root / f"r{n}.toml", assets, num_lanes=n, global_batch_size=12)
        for n in (4, 6, 2)
    }


def expected(recipes: dict[int, Path], steps: int) -> list[str]:
    """The engine's batches: 3 steps at 4 lanes (dp 2), re-laned to 6, then ``steps``."""
    four = Pipeline(Recipe.from_toml(recipes[4]), provenance=False)
    saved: list[dict[str, Any]] = []
    for _ in simulate(four, 2, 3, num_workers=1, save_at=3, on_save=saved.append):
        pass
    new = relane_state(four, saved[0], 6)
    six = Pipeline(Recipe.from_toml(recipes[6]), provenance=False)
    return [r.digest for r, _ in simulate(six, 1, steps, num_workers=1, resume_state=new)]


def test_relane_at_load_then_resume_after_it(
    recipes: dict[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    first = [build(recipes[4], 2, r) for r in range(2)]
    run_ranks(first, [iter(x) for x in first], 3)
    stored = union([x.state_dict() for x in first])
    # Without the opt-in, another lane count is refused, naming num_lanes and the opt-in.
    plain = build(recipes[2], 1, 0, lbs=4)
    with pytest.raises(CheckpointError, match=r"num_lanes: checkpoint has 4, recipe has 2.*"
                       r"dataloader.relane_from = 4"):  # fmt: skip
        dcp_load(plain, stored)
    # With it, every rank re-lanes alike: the same global batches at dp 3 and dp 6.
    runs = {}
    for world in (3, 6):
        loaders = [build(recipes[6], world, r, relane_from=4) for r in range(world)]
        with caplog.at_level(logging.WARNING, logger="zephon_nodes.integrations.torchtitan"):
            for loader in loaders:
                dcp_load(loader, stored)
        assert "re-laned the checkpoint of step 3 from 4 to 6 lanes" in caplog.text
        iters = [iter(x) for x in loaders]
        runs[world] = run_ranks(loaders, iters, 2)
        if world == 3:
            after = union([x.state_dict() for x in loaders])  # a checkpoint after step 5
    want = expected(recipes, 4)
    assert runs[3] == runs[6] == want[:2]
    # Later checkpoints carry the lineage: a plain loader refuses them, saying what to set.
    with pytest.raises(CheckpointError, match=r"written after a re-lane.*relaned = true"):
        dcp_load(build(recipes[6], 2, 0, lbs=6), after)
    resumed = [build(recipes[6], 2, r, lbs=3, relaned=True) for r in range(2)]
    for loader in resumed:
        dcp_load(loader, after)
    assert run_ranks(resumed, [iter(x) for x in resumed], 2) == want[2:]
    assert int(union([x.state_dict() for x in resumed])["zephon_format"]) == 3
    # A flipped bit in the lineage keys is refused, naming them.
    n = int(after["lineage_len"][0])
    for key, index, bit in [("lineage", 0, 0), ("lineage", n - 1, 3), ("lineage_len", 0, 1),
                            ("lineage_len", 1, 60), ("lineage", n + 5, 2)]:  # fmt: skip
        damaged = {k: v.clone() for k, v in after.items()}
        flat = damaged[key].view(-1)
        flat[index] = int(flat[index]) ^ (1 << bit)
        with pytest.raises(CheckpointError, match=r"dataloader\.lineage"):
            dcp_load(build(recipes[6], 1, 0, lbs=12, relaned=True), damaged)


def test_relane_from_without_a_checkpoint_is_refused(recipes: dict[int, Path]) -> None:
    loader = build(recipes[6], 1, 0, lbs=6, relane_from=4)
    with pytest.raises(CheckpointError, match="no checkpoint was loaded"):
        next(iter(loader))
