"""Fixtures of the TorchTitan tests: corpus, tokenizers and recipe built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.assets import Assets, build_assets, write_recipe


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    """Corpus (stdlib sources), sentencepiece model and matching hf_assets folder."""
    return build_assets(tmp_path_factory.mktemp("tt_assets"))


@pytest.fixture(scope="session")
def recipe_path(assets: Assets) -> Path:
    """The default test recipe: 4 lanes, G=8, seq_len 64, flush every 2 work items."""
    return write_recipe(assets.root / "recipe.toml", assets)
