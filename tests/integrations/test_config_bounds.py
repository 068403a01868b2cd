"""Every ``ZephonDataLoader.Config`` field is checked when the config is made, against the one
bounds table (``recipe/bounds.py`` SETTINGS, ``core/bounds.py`` PHYSICAL), naming the field.

Issue 35's probe: ``max_decisions=10**12`` was accepted and the first ``state_dict()`` died
allocating 24 TB; a directory as the recipe ended in a raw ``IsADirectoryError``; a missing
``amend_from`` did not name ``dataloader.amend_from``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan import ZephonDataLoader
from zephon_nodes.recipe.bounds import SETTINGS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_decisions", 10**12),
        ("max_decisions", -2),
        ("max_lineage_bytes", 10**12),
        ("max_stage_bytes", 10**12),
        ("max_stage_datasets", 10**9),
        ("relane_from", 10**9),
        ("num_workers", 10**6),
        ("prefetch", 10**9),
        ("lookahead", 0),
        ("worker_timeout_s", 0.0),
        ("cache_limit", 0),
        ("token_cache_limit", 2**70),
    ],
)
def test_out_of_bounds_is_refused_when_the_config_is_made(field: str, value: Any) -> None:
    assert field in SETTINGS  # the one table holds every field's bound
    with pytest.raises(RecipeError, match=rf"^dataloader\.{field}={value!r} must be "):
        ZephonDataLoader.Config(recipe="r.toml", **{field: value})


def test_the_defaults_are_in_bounds() -> None:
    config = ZephonDataLoader.Config(recipe="r.toml")
    assert config.max_decisions == -1 and config.max_stage_datasets == 32


def test_a_directory_as_the_recipe_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"dataloader\.recipe=.* is a directory"):
        ZephonDataLoader.Config(recipe=str(tmp_path))


def test_a_missing_amend_from_names_the_field(tmp_path: Path) -> None:
    missing = tmp_path / "old.toml"
    with pytest.raises(RecipeError, match=r"dataloader\.amend_from=.*old\.toml.*: not found"):
        ZephonDataLoader.Config(recipe="r.toml", amend_from=str(missing))
