"""ZephonDataLoader and recipes that change mid-run: staged recipes and amended checkpoints.

DCP across ranks is simulated by the union of the ranks' state dicts, as in
``test_torchtitan_loader.py`` (a key the new loader asks for must be in the checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.assets import Assets
from tests.integrations.mixture_assets import write_two_dataset_recipe
from tests.integrations.stage_assets import (
    ROOM,
    amend_dcp,
    reference,
    write_amended_pair,
    write_datasets_stage,
    write_staged,
)
from tests.integrations.test_torchtitan_loader import dcp_load, union
from tests.integrations.tt_helpers import Row, step_digest, take_steps
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.integrations.torchtitan import (
    DCP_FORMAT,
    DCP_FORMAT_STAGED,
    ZephonDataLoader,
    from_dcp_state,
)
from zephon_nodes.integrations.torchtitan.common import resolve_max_decisions
from zephon_nodes.recipe import Recipe


def build(recipe: Path, world: int, rank: int, lbs: int, seq_len: int = 64, **cfg: Any) -> Any:
    """Build the loader the way TorchTitan's trainer does (one worker)."""
    config = ZephonDataLoader.Config(recipe=str(recipe), num_workers=1, **cfg)
    return config.build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=seq_len, local_batch_size=lbs
    )


def run(loaders: list[Any], iters: list[Any], steps: int) -> list[str]:
    """Digest ``steps`` global batches taken from every rank (rank order)."""
    recipe = loaders[0].pipeline.recipe
    spl = recipe.samples_per_lane
    per_rank: list[list[list[Row]]] = []
    for loader, it in zip(loaders, iters, strict=True):
        share = recipe.global_batch_size // loader.dp_world_size
        per_rank.append(take_steps(it, steps, share // loader.local_batch_size))
    return [step_digest([rr[t] for rr in per_rank], spl) for t in range(steps)]


def resume(recipe: Path, stored: dict[str, torch.Tensor], world: int, **kw: Any) -> list[Any]:
    loaders = [build(recipe, world, r, **kw) for r in range(world)]
    for loader in loaders:
        dcp_load(loader, stored)
    return loaders


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tt_stages")


@pytest.fixture(scope="module")
def staged(assets: Assets, root: Path) -> Path:
    return write_datasets_stage(root / "staged.toml", assets)


@pytest.fixture(scope="module")
def amended_recipes(assets: Assets, root: Path) -> tuple[Path, Path]:
    return write_amended_pair(root, assets)


def amended_checkpoint(old: Path, new: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A loader checkpoint of ``old`` at step 3 (dp 2), amended to ``new`` after step 3."""
    first = [build(old, 2, r, lbs=2) for r in range(2)]
    run(first, [iter(x) for x in first], 3)
    return amend_dcp(union([x.state_dict() for x in first]), old, new, world=2, lbs=2)


def _flip(tensor: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    t = tensor.clone().reshape(-1)
    t[index] = int(t[index]) ^ (1 << bit)
    return t.reshape(tensor.shape)


def test_an_amended_checkpoint_resumes_at_dp_1_and_2(amended_recipes: tuple[Path, Path]) -> None:
    old, new = amended_recipes
    stored, state = amended_checkpoint(old, new)
    assert int(stored["zephon_format"]) == DCP_FORMAT_STAGED
    want = reference(new, 4, state)
    # Without the opt-in, the loader refuses it, naming the setting.
    with pytest.raises(CheckpointError, match=r"recipe change.*dataloader\.amended = true"):
        resume(new, stored, 1, lbs=16, seq_len=128)
    # With it, the new recipe's batches (seq_len 128, G 16) at dp 1 and dp 2.
    for world, lbs in ((1, 8), (2, 4)):
        loaders = resume(new, stored, world, lbs=lbs, seq_len=128, amended=True)
        got = run(loaders, [iter(x) for x in loaders], 2)
        assert got == want[:2], world
        if world == 2:
            after = union([x.state_dict() for x in loaders])  # a checkpoint after step 5
            with pytest.raises(RecipeError, match="not supported after a recipe change"):
                loaders[0].set_mixture({"prose": 1.0, "extra": 1.0})
    # Its later checkpoints keep the stage section: a resume at dp 1 continues the batches.
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED and int(after["step"]) == 5
    resumed = resume(new, after, 1, lbs=16, seq_len=128, amended=True)
    assert run(resumed, [iter(x) for x in resumed], 2) == want[2:]


def test_a_damaged_stage_key_is_refused(amended_recipes: tuple[Path, Path]) -> None:
    old, new = amended_recipes
    stored, _ = amended_checkpoint(old, new)
    n = int(stored["stage_len"][0])
    names = 3  # prose, code, extra: every dataset the run has read
    cases = [
        ("stage", 0, 0, r"dataloader\.stage: check value"),
        ("stage", n - 1, 5, r"dataloader\.stage: check value"),
        ("stage", n + 3, 1, r"dataloader\.stage: check value"),
        ("stage_len", 0, 2, r"dataloader\.stage(_len)?:"),
        ("stage_len", 1, 40, r"dataloader\.stage: check value"),
        ("stage_lane_00002", 0, 0, r"dataloader\.stage_lane_00002: check value"),
        ("stage_lane_00001", names + 4, 3, r"dataloader\.stage_lane_00001: check value"),
        ("stage_lane_00000", names + 6, 1, r"dataloader\.stage_lane_00000: .*padding"),
        ("stage_lane_00003", 32 + 5, 7, r"dataloader\.stage_lane_00003: check value"),
    ]
    for key, index, bit, match in cases:
        damaged = dict(stored)
        damaged[key] = _flip(stored[key], index, bit)
        loader = build(new, 1, 0, lbs=16, seq_len=128, amended=True)
        with pytest.raises(CheckpointError, match=match):
            dcp_load(loader, damaged)
    # Rows of two lanes swapped are refused too (each row's check covers its lane).
    swapped = dict(stored)
    swapped["stage_lane_00000"], swapped["stage_lane_00001"] = (
        stored["stage_lane_00001"],
        stored["stage_lane_00000"],
    )
    with pytest.raises(CheckpointError, match=r"stage_lane_0000[01]: check value"):
        dcp_load(build(new, 1, 0, lbs=16, seq_len=128, amended=True), swapped)


def test_a_staged_recipe_is_saved_and_resumed_across_its_stage(
    assets: Assets, root: Path, staged: Path
) -> None:
    want = reference(staged, 7)
    base = reference(write_two_dataset_recipe(root / "base.toml", assets), 4)
    assert want[:3] == base[:3] and want[3] != base[3]  # the stage starts after step 3
    first = [build(staged, 2, r, lbs=2) for r in range(2)]
    assert run(first, [iter(x) for x in first], 2) == want[:2]
    before = union([x.state_dict() for x in first])
    # Before the stage: layout 2, the stage keys reserved (empty) by the recipe's stages.
    assert int(before["zephon_format"]) == DCP_FORMAT and int(before["stage_len"][0]) == 0
    loaders = resume(staged, before, 1, lbs=4)  # no setting needed: the recipe has stages
    assert run(loaders, [iter(x) for x in loaders], 3) == want[2:5]  # steps 3-5: the stage
    after = union([x.state_dict() for x in loaders])
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED and int(after["step"]) == 5
    for world, lbs in ((2, 2), (4, 1)):
        resumed = resume(staged, after, world, lbs=lbs)
        assert run(resumed, [iter(x) for x in resumed], 2) == want[5:]


def test_a_stage_changing_seq_len_is_refused_at_construction(assets: Assets, root: Path) -> None:
    longer = write_staged(root / "longer.toml", assets, "start_step = 4\nseq_len = 128\n")
    with pytest.raises(
        RecipeError,
        match=r"stages\[0\] \(start_step=4\) changes seq_len from 64 to 128.*"
        r"training\.seq_len.*end the job after step 4.*dataloader\.amend_from",
    ):
        build(longer, 1, 0, lbs=8)
    bigger = write_staged(root / "bigger.toml", assets, "start_step = 2\nglobal_batch_size = 16\n")
    with pytest.raises(RecipeError, match=r"stages\[0\] .*changes global_batch_size from 8 to 16"):
        build(bigger, 1, 0, lbs=8)


def test_every_single_bit_flip_of_the_stage_keys_is_refused(
    amended_recipes: tuple[Path, Path],
) -> None:
    """Every bit of stage_len, of the used stage bytes and of every lane's stage row (its
    values, padding and check); the codec alone (no loader), every lane at once."""
    old, new = amended_recipes
    stored, state = amended_checkpoint(old, new)
    pipeline = Pipeline(Recipe.from_toml(new), provenance=False)
    decisions = resolve_max_decisions(-1, pipeline.recipe)

    def load(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
        return from_dcp_state(
            sd,
            pipeline,
            list(range(4)),
            dp_world_size=1,
            local_batch_size=16,
            max_decisions=decisions,
            stage_room=ROOM,
        )

    assert load(stored)["stage"] == state["stage"]  # control: the section round-trips
    n = int(stored["stage_len"][0])
    keys = {"stage_len": (2, 63), "stage": (n + 8, 8)}  # used bytes and a few padding ones
    keys.update({f"stage_lane_0000{lane}": (ROOM[1] + 6, 63) for lane in range(4)})
    total = refused = named = 0
    for key, (count, bits) in keys.items():
        for index in range(count):
            for bit in range(bits):
                flipped = dict(stored)
                flipped[key] = _flip(stored[key], index, bit)
                total += 1
                try:
                    load(flipped)
                except CheckpointError as e:
                    refused += 1
                    named += f"dataloader.{key}" in str(e) or "dataloader.stage:" in str(e)
    print(f"stage keys: {total} single-bit flips, {refused} refused")
    assert refused == named == total > 10000
