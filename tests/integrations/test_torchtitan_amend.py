"""ZephonDataLoader amends a checkpoint at load when asked (dataloader.amend_from).

DCP across ranks is simulated by the union of the ranks' state dicts, as in
``test_torchtitan_loader.py`` (a key the new loader asks for must be in the checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.integrations.assets import Assets
from tests.integrations.stage_assets import amend_dcp, reference, write_amended_pair
from tests.integrations.test_torchtitan_loader import dcp_load, union
from tests.integrations.test_torchtitan_stages import build, resume, run
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.integrations.torchtitan import DCP_FORMAT, DCP_FORMAT_STAGED

LOGGER = "zephon_nodes.integrations.torchtitan"


@pytest.fixture(scope="module")
def recipes(assets: Assets, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The two-dataset recipe and its amendment: code replaced by extra, seq_len 64 -> 128,
    global_batch_size 8 -> 16."""
    return write_amended_pair(tmp_path_factory.mktemp("tt_amend"), assets)


def test_amend_at_load_then_resume_after_it(
    recipes: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    old, new = recipes
    first = [build(old, 2, r, lbs=2) for r in range(2)]
    run(first, [iter(x) for x in first], 3)
    stored = union([x.state_dict() for x in first])  # the old recipe's checkpoint of step 3
    assert int(stored["zephon_format"]) == DCP_FORMAT
    # The engine's batches: the JSON state amended with amend_state (zephon amend's move).
    _, state = amend_dcp(stored, old, new, world=2, lbs=2)
    want = reference(new, 4, state)
    # Every rank amends alike: the new recipe's batches (seq_len 128, G 16) at dp 1 and 2.
    for world, lbs in ((1, 8), (2, 4)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            loaders = resume(new, stored, world, lbs=lbs, seq_len=128, amend_from=str(old))
        lines = [r.getMessage() for r in caplog.records if "amended the checkpoint" in r.message]
        assert len(lines) == world, lines
        assert f"amended the checkpoint of step 3 from recipe {old} to {new}" in lines[0]
        assert "dataloader.amend_from unset and dataloader.amended = true" in lines[0]
        assert run(loaders, [iter(x) for x in loaders], 2) == want[:2], world
        if world == 2:
            after = union([x.state_dict() for x in loaders])  # a checkpoint after step 5
    # Later checkpoints carry the stage section: a plain loader refuses them, naming the
    # setting, and so does one that still names amend_from.
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED and int(after["step"]) == 5
    with pytest.raises(CheckpointError, match=r"recipe change.*dataloader\.amended = true"):
        resume(new, after, 1, lbs=16, seq_len=128)
    for amended in (False, True):
        with pytest.raises(
            CheckpointError, match=r"amend_from unset and dataloader\.amended = true"
        ):
            resume(new, after, 1, lbs=16, seq_len=128, amend_from=str(old), amended=amended)
    resumed = resume(new, after, 1, lbs=16, seq_len=128, amended=True)
    assert run(resumed, [iter(x) for x in resumed], 2) == want[2:]


def test_amend_from_without_a_checkpoint_is_refused(recipes: tuple[Path, Path]) -> None:
    old, new = recipes
    loader = build(new, 1, 0, lbs=16, seq_len=128, amend_from=str(old))
    with pytest.raises(CheckpointError, match=r"amend_from=.* no checkpoint was loaded"):
        next(iter(loader))


def test_amend_from_with_relane_from_is_refused(recipes: tuple[Path, Path]) -> None:
    old, new = recipes
    with pytest.raises(RecipeError, match=r"amend_from=.* and dataloader\.relane_from=2"):
        build(new, 1, 0, lbs=16, seq_len=128, amend_from=str(old), relane_from=2)


def _at_lanes(recipe: Path, lanes: int) -> Path:
    text = recipe.read_text(encoding="utf-8")
    assert text.count("num_lanes = 4") == 1
    out = recipe.with_name(f"{recipe.stem}{lanes}.toml")
    out.write_text(text.replace("num_lanes = 4", f"num_lanes = {lanes}"), encoding="utf-8")
    return out


def _engine_after_relane_and_amend(old4: Path, old8: Path, new8: Path) -> list[str]:
    """The engine's batches: 3 steps at 4 lanes, re-laned to 8, 2 steps, amended, 3 steps."""
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.engine.relane import relane_state
    from zephon_nodes.engine.stages import amend_state
    from zephon_nodes.recipe import Recipe
    from zephon_nodes.verification.simulate import simulate

    def pipe(p: Path) -> Pipeline:
        return Pipeline(Recipe.from_toml(p), provenance=False)

    four, eight, new = pipe(old4), pipe(old8), pipe(new8)
    saved: list[dict] = []
    for _ in simulate(four, 2, 3, num_workers=1, save_at=3, on_save=saved.append):
        pass
    relaned = relane_state(four, saved[0], 8)
    later: list[dict] = []
    for _ in simulate(eight, 2, 2, num_workers=1, resume_state=relaned, save_at=5,
                      on_save=later.append):  # fmt: skip
        pass
    amended = amend_state(eight, later[0], new)
    return [r.digest for r, _ in simulate(new, 2, 3, num_workers=1, resume_state=amended)]


def test_amend_at_load_after_a_relane(recipes: tuple[Path, Path]) -> None:
    """Re-laned 4 -> 8 at load, then amended at load (dataloader.relaned + amend_from): the
    engine's batches (zephon relane then zephon amend) at dp 1 and 2."""
    old4, new4 = recipes
    old8, new8 = _at_lanes(old4, 8), _at_lanes(new4, 8)
    first = [build(old4, 2, r, lbs=2) for r in range(2)]
    run(first, [iter(x) for x in first], 3)
    stored = union([x.state_dict() for x in first])
    relaned = [build(old8, 2, r, lbs=4, relane_from=4) for r in range(2)]
    for loader in relaned:
        dcp_load(loader, stored)
    run(relaned, [iter(x) for x in relaned], 2)
    after = union([x.state_dict() for x in relaned])  # step 5, with the re-lane's lineage
    assert int(after["step"]) == 5
    want = _engine_after_relane_and_amend(old4, old8, new8)
    for world, lbs in ((1, 16), (2, 8)):
        loaders = resume(
            new8, after, world, lbs=lbs, seq_len=128, amend_from=str(old8), relaned=True
        )
        assert run(loaders, [iter(x) for x in loaders], 2) == want[:2], world
    # The checkpoint after the amendment resumes as any amended one does.
    later = union([x.state_dict() for x in loaders])
    resumed = resume(new8, later, 1, lbs=16, seq_len=128, amended=True)
    assert run(resumed, [iter(x) for x in resumed], 1) == want[2:]
