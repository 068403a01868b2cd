"""ZephonDataLoader.set_mixture: same batches as the simulation, DCP state, resume, agreement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.assets import Assets
from tests.integrations.mixture_assets import write_two_dataset_recipe
from tests.integrations.test_torchtitan_loader import build, dcp_load, union
from tests.integrations.test_torchtitan_torchrun import tail, torchrun
from tests.integrations.tt_helpers import rows_of, step_digest
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.errors import RecipeError
from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

SPL = 2
DECISIONS = {2: {"prose": 0.0, "code": 1.0}, 4: {"prose": 0.8, "code": 0.2}}


@pytest.fixture(scope="module")
def recipe2(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_two_dataset_recipe(tmp_path_factory.mktemp("mix") / "recipe.toml", assets)


def expected(recipe: Path, steps: int, decisions: dict[int, dict[str, float]]) -> list[str]:
    """Digests of the in-process simulation (rows without dataset_ids, as TorchTitan gets)."""
    pipeline = Pipeline(Recipe.from_toml(recipe), provenance=False)
    ups = sorted(decisions.items())
    return [r.digest for r, _ in simulate(pipeline, 1, steps, num_workers=0, mixture_updates=ups)]


def run(
    loaders: list[ZephonDataLoader],
    iters: list[Any],
    first: int,
    last: int,
    decisions: dict[int, dict[str, float]],
) -> list[str]:
    """Steps ``first+1..last`` on every rank, deciding after each step in ``decisions``."""
    out = []
    for t in range(first + 1, last + 1):
        rows = []
        for loader, it in zip(loaders, iters, strict=True):
            share = loader.pipeline.recipe.global_batch_size // loader.dp_world_size
            rank_rows = []
            for _ in range(share // loader.local_batch_size):
                rank_rows.extend(rows_of(next(it)))
            rows.append(rank_rows)
        out.append(step_digest(rows, SPL))
        if t in decisions:
            for loader in loaders:
                loader.set_mixture(decisions[t])
    return out


def test_decisions_resume_at_other_dp_and_keep_deciding(recipe2: Path) -> None:
    """dp 2 (prefetch 2) decides after steps 2 and 4, saved after 5; resumed at dp 1 and 4."""
    more = {**DECISIONS, 6: {"prose": 1.0, "code": 1.0}}
    reference = expected(recipe2, 8, more)
    first = [build(recipe2, 2, r, prefetch=2) for r in range(2)]
    iters = [iter(x) for x in first]
    assert run(first, iters, 0, 5, DECISIONS) == reference[:5]
    stored = union([x.state_dict() for x in first])
    assert stored["mixture_log"].dtype == torch.float64
    assert stored["mixture_log"].shape == (256, 3)
    assert int(stored["mixture_count"]) == 2
    for world, lbs in ((1, 4), (4, 1)):
        resumed = [build(recipe2, world, r, lbs=lbs) for r in range(world)]
        for loader in resumed:
            dcp_load(loader, stored)
            assert loader.mixture_log == first[0].mixture_log
            assert [s for s, _ in loader.mixture_log] == [2, 4]
        got = run(resumed, [iter(x) for x in resumed], 5, 8, more)
        assert got == reference[5:], world
        assert resumed[0].mixture_log[-1] == (6, {"prose": 0.5, "code": 0.5})


def test_dataset_ids_kept_aside_and_pause(recipe2: Path) -> None:
    """Batches keep TorchTitan's format; dataset_ids come from pop_dataset_ids()."""
    loader = build(recipe2, 1, 0, lbs=8)
    it = iter(loader)
    batches = [next(it) for _ in range(4)]
    assert all(set(inputs) == {"input", "positions"} for inputs, _ in batches)
    ids = torch.cat(loader.pop_dataset_ids())
    labels = torch.cat([lab for _, lab in batches])
    assert ids.shape == labels.shape and ids.dtype == torch.int64
    assert bool(((ids == -1) == (labels == -100)).all())
    assert set(ids[labels != -100].unique().tolist()) == {0, 1}
    loader.set_mixture({"prose": 0, "code": 1})
    effect = {k: v[0] for k, v in loader._state["mixture"]["effects"].items()}
    while any(w <= effect[k] for k, (w, _) in loader._state["lanes"].items()):
        next(it)  # until every lane is past its effect window
    loader.pop_dataset_ids()
    for _ in range(4):
        next(it)
    late = torch.cat(loader.pop_dataset_ids())
    assert set(late.unique().tolist()) <= {-1, 1}  # no token of the paused "prose"
    with pytest.raises(RecipeError, match="unknown dataset"):
        loader.set_mixture({"prose": 1, "code": 1, "web": 1})


def test_full_log_is_refused(recipe2: Path) -> None:
    loader = build(recipe2, 1, 0, lbs=8, max_decisions=1)
    loader.set_mixture({"prose": 1, "code": 2})
    with pytest.raises(RecipeError, match="max_decisions=1"):
        loader.set_mixture({"prose": 1, "code": 3})


@pytest.mark.slow
def test_two_ranks_that_disagree_are_detected(recipe2: Path, tmp_path: Path) -> None:
    """torchrun, 2 ranks (gloo): rank 1 decides other weights; both ranks raise, naming both."""
    out = tmp_path / "out"
    out.mkdir()
    rc = torchrun(
        2,
        "tt_mixture_agree.py",
        ["--recipe", str(recipe2), "--out", str(out)],
        tmp_path / "log.txt",
    )
    assert rc == 0, tail(tmp_path / "log.txt")
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for res in results:
        assert res["agreed"] is True, res  # the first decision is the same on both ranks
        err = res["error"]
        assert err.startswith("RecipeError: ranks disagree on mixture decision 1"), err
        assert "{'prose': 0.25, 'code': 0.75}" in err and "{'prose': 0.75, 'code': 0.25}" in err
