"""Recipes that change mid-run over the TorchTitan test assets, and amended DCP checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.integrations.assets import Assets
from tests.integrations.mixture_assets import write_two_dataset_recipe
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.integrations.torchtitan.common import from_dcp_state, resolve_max_decisions
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.dcp import to_dcp_state

ROOM = (16384, 32)  # the defaults of dataloader.max_stage_bytes and max_stage_datasets


def extra_dataset(assets: Assets, table: str) -> str:
    """A dataset added by a change (a ``[[table]]``): the whole corpus under a new name."""
    path = json.dumps(str(assets.corpus))
    return f'[[{table}]]\nname = "extra"\npaths = [{path}]\nweight = 1.0\n'


def write_staged(path: Path, assets: Assets, stage: str) -> Path:
    """The two-dataset recipe (prose, code) with ``stage`` as its one [[stages]] table."""
    write_two_dataset_recipe(path, assets)
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n[[stages]]\n" + stage)
    return path


def write_datasets_stage(path: Path, assets: Assets) -> Path:
    """A datasets-only stage after step 3: code removed, extra added, new weights."""
    stage = 'start_step = 3\nremove_datasets = ["code"]\nweights = {prose = 2.0}\n'
    return write_staged(path, assets, stage + extra_dataset(assets, "stages.datasets"))


def write_amended_pair(root: Path, assets: Assets) -> tuple[Path, Path]:
    """The two-dataset recipe and the one it is amended to: code replaced by extra, seq_len
    64 -> 128, global_batch_size 8 -> 16."""
    old = write_two_dataset_recipe(root / "old.toml", assets)
    text = old.read_text(encoding="utf-8")
    text = text.replace("global_batch_size = 8", "global_batch_size = 16")
    text = text.replace("seq_len = 64", "seq_len = 128")
    code = text.index('[[datasets]]\nname = "code"')
    text = text[:code] + extra_dataset(assets, "datasets") + text[text.index("[work]") - 1 :]
    new = root / "new.toml"
    new.write_text(text, encoding="utf-8")
    return old, new


def amend_dcp(
    stored: dict[str, torch.Tensor], old: Path, new: Path, *, world: int, lbs: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Amend a loader checkpoint of ``old`` (every lane, saved at ``world`` x ``lbs``) to ``new``.

    The DCP keys are read back as one state, amended with ``amend_state`` (what ``zephon
    amend`` does) and stored as the DCP keys a loader of ``new`` reads; returns those keys
    and the amended state.
    """
    old_p = Pipeline(Recipe.from_toml(old), provenance=False)
    saved = from_dcp_state(
        stored,
        old_p,
        list(range(old_p.num_lanes)),
        dp_world_size=world,
        local_batch_size=lbs,
        max_decisions=resolve_max_decisions(-1, old_p.recipe),
    )
    new_p = Pipeline(Recipe.from_toml(new), provenance=False)
    state = amend_state(old_p, saved, new_p)
    sd = to_dcp_state(
        state,
        dp_world_size=1,
        local_batch_size=new_p.recipe.global_batch_size,
        dataset_names=[d.name for d in new_p.recipe.datasets],
        max_decisions=resolve_max_decisions(-1, new_p.recipe),
        stage_room=ROOM,
    )
    return sd, state


def reference(recipe: Path, steps: int, state: dict[str, Any] | None = None) -> list[str]:
    """``zephon digest`` of the recipe (from ``state``): the engine's global batches."""
    from zephon_nodes.verification.simulate import simulate

    pipeline = Pipeline(Recipe.from_toml(recipe), provenance=False)  # TorchTitan rows: no ids
    return [r.digest for r, _ in simulate(pipeline, 2, steps, num_workers=1, resume_state=state)]
