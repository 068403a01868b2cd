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


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("operator_workers", 2, "must be a string, got int"),
        ("amend_from", 1.5, "must be a string, got float"),
        ("dump_batches", ["x"], "must be a string, got list"),
        ("check_tokenizer", "maybe", "must be true or false"),
        ("relaned", 1, "must be true or false, got int"),
        ("amended", None, "must be true or false, got NoneType"),
        ("token_cache", 5, "must be true/false or a storage URI, got int"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_field(
    field: str, value: Any, message: str
) -> None:
    """Round three of the hostile table: these ended in AttributeError or TypeError, or
    were taken by truthiness (``check_tokenizer="false"`` was on)."""
    with pytest.raises(RecipeError, match=rf"^dataloader\.{field}=.* {message}"):
        ZephonDataLoader.Config(recipe="r.toml", **{field: value})


def test_switches_given_as_text_and_paths_given_as_paths_are_read(tmp_path: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text("")
    config = ZephonDataLoader.Config(
        recipe=tmp_path / "r.toml",  # type: ignore[arg-type]
        check_tokenizer="false",  # type: ignore[arg-type]
        amended="on",  # type: ignore[arg-type]
        amend_from=old,  # type: ignore[arg-type]
    )
    assert config.check_tokenizer is False and config.amended is True
    assert config.recipe == str(tmp_path / "r.toml") and config.amend_from == str(old)
