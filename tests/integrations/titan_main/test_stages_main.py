"""The main adapter and recipes that change mid-run: an amended checkpoint, a staged recipe
saved and resumed across its stage (DCP across ranks simulated by the union of the ranks'
state dicts)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

from tests.integrations.assets import Assets
from tests.integrations.stage_assets import (
    amend_dcp,
    reference,
    write_amended_pair,
    write_datasets_stage,
    write_staged,
)
from tests.integrations.titan_main.helpers import build, dcp_load, optimizer_steps, union
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.integrations.torchtitan import DCP_FORMAT_STAGED

pytestmark = pytest.mark.titan_main


def test_an_amended_checkpoint_resumes_at_dp_1_and_2(assets: Assets, tmp_path: Path) -> None:
    """Saved at step 3 on dp 2, amended to seq_len 128 and G 16 with new data."""
    old, new = write_amended_pair(tmp_path, assets)
    first = [build(old, 2, r, rows=2) for r in range(2)]
    optimizer_steps(first, [iter(x) for x in first], 3, 2)
    stored, state = amend_dcp(union([x.state_dict() for x in first]), old, new, world=2, lbs=2)
    want = reference(new, 4, state)
    with pytest.raises(CheckpointError, match=r"recipe change.*dataloader\.amended = true"):
        dcp_load(build(new, 1, 0, rows=8, seq=128), stored)
    for world, rows in ((1, 8), (2, 4)):
        loaders = [build(new, world, r, rows=rows, seq=128, amended=True) for r in range(world)]
        for loader in loaders:
            dcp_load(loader, stored)
        iters = [iter(x) for x in loaders]
        assert optimizer_steps(loaders, iters, 2, 2, spl=4, seq=128) == want[:2]
    after = union([x.state_dict() for x in loaders])
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED
    resumed = build(new, 1, 0, rows=16, seq=128, amended=True)
    dcp_load(resumed, after)
    assert optimizer_steps([resumed], [iter(resumed)], 2, 1, spl=4, seq=128) == want[2:]


def test_a_staged_recipe_resumes_across_its_stage(assets: Assets, tmp_path: Path) -> None:
    staged = write_datasets_stage(tmp_path / "staged.toml", assets)
    want = reference(staged, 6)
    first = [build(staged, 2, r, rows=2) for r in range(2)]
    assert optimizer_steps(first, [iter(x) for x in first], 2, 2) == want[:2]
    loader = build(staged, 1, 0, rows=4)
    dcp_load(loader, union([x.state_dict() for x in first]))
    assert optimizer_steps([loader], [iter(loader)], 2, 2) == want[2:4]  # into the stage
    after = union([loader.state_dict()])
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED
    resumed = [build(staged, 4, r, rows=1) for r in range(4)]
    for x in resumed:
        dcp_load(x, after)
    assert optimizer_steps(resumed, [iter(x) for x in resumed], 2, 2) == want[4:]


def test_a_stage_changing_seq_len_is_refused(assets: Assets, tmp_path: Path) -> None:
    longer = write_staged(tmp_path / "longer.toml", assets, "start_step = 4\nseq_len = 128\n")
    with pytest.raises(
        RecipeError,
        match=r"stages\[0\] \(start_step=4\) changes seq_len from 64 to 128.*"
        r"num_tokens_per_microbatch_per_dp_rank.*end the job after step 4",
    ):
        build(longer, 1, 0, rows=8)


def test_amend_at_load_at_dp_1_and_2(assets: Assets, tmp_path: Path) -> None:
    """The old recipe's checkpoint (step 3, dp 2) amended at load (dataloader.amend_from)."""
    old, new = write_amended_pair(tmp_path, assets)
    first = [build(old, 2, r, rows=2) for r in range(2)]
    optimizer_steps(first, [iter(x) for x in first], 3, 2)
    stored = union([x.state_dict() for x in first])
    _, state = amend_dcp(stored, old, new, world=2, lbs=2)
    want = reference(new, 4, state)
    for world, rows in ((1, 8), (2, 4)):
        loaders = [
            build(new, world, r, rows=rows, seq=128, amend_from=str(old)) for r in range(world)
        ]
        for loader in loaders:
            dcp_load(loader, stored)
        iters = [iter(x) for x in loaders]
        assert optimizer_steps(loaders, iters, 2, 2, spl=4, seq=128) == want[:2]
    after = union([x.state_dict() for x in loaders])
    assert int(after["zephon_format"]) == DCP_FORMAT_STAGED
    with pytest.raises(CheckpointError, match=r"amend_from unset and dataloader\.amended = true"):
        dcp_load(build(new, 1, 0, rows=16, seq=128, amend_from=str(old), amended=True), after)
    resumed = build(new, 1, 0, rows=16, seq=128, amended=True)
    dcp_load(resumed, after)
    assert optimizer_steps([resumed], [iter(resumed)], 2, 1, spl=4, seq=128) == want[2:]
    alone = build(new, 1, 0, rows=16, seq=128, amend_from=str(old))
    with pytest.raises(CheckpointError, match=r"amend_from=.* no checkpoint was loaded"):
        next(iter(alone))
