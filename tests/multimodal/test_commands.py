"""`zephon digest`, `stats` and `verify` on the shipped multimodal example recipe."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.commands.run import zephon
from zephon_nodes.recipe import Recipe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multimodal"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe, copied next to data made by the example's own script."""
    root = tmp_path_factory.mktemp("mm-example")
    spec = importlib.util.spec_from_file_location("mm_make_data", EXAMPLE / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make(root / "data")
    shutil.copy(EXAMPLE / "recipe.toml", root / "recipe.toml")
    return root / "recipe.toml"


def digest_lines(capsys: Any, *argv: str) -> list[dict[str, Any]]:
    assert zephon("digest", *argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_example_recipe_is_multimodal(example: Path) -> None:
    recipe = Recipe.from_toml(example)
    assert recipe.image is not None and recipe.image.mode == "patches"
    assert [d.name for d in recipe.datasets] == ["photos", "captions"]


def test_digest_same_at_any_dp_and_runner_and_after_resume(
    example: Path, capsys: Any, tmp_path: Path
) -> None:
    ref = digest_lines(capsys, str(example), "--steps", "8", "--num-workers", "0")
    assert [d["step"] for d in ref] == list(range(1, 9))
    four = digest_lines(
        capsys, str(example), "--steps", "8", "--dp-world-size", "4", "--runner", "process"
    )
    assert four == ref
    ck = tmp_path / "ck"
    digest_lines(
        capsys, str(example), "--steps", "4", "--dp-world-size", "2",
        "--save-at", "4", "--checkpoint-dir", str(ck),
    )  # fmt: skip
    resumed = digest_lines(
        capsys, str(example), "--steps", "4", "--dp-world-size", "8", "--resume-from", str(ck)
    )
    assert resumed == ref[4:]


def test_stats(example: Path, capsys: Any) -> None:
    assert zephon("stats", str(example), "--steps", "6", "--json") == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["steps"] == 6
    assert set(stats["token_shares"]) == {"photos", "captions"}
    assert abs(stats["token_shares"]["photos"] - 0.7) < 0.1
    assert stats["skipped_records"] == {"photos": {}, "captions": {}}
    assert 0 <= stats["padding_fraction"] < 0.6


def test_verify(example: Path, capsys: Any) -> None:
    status = zephon(
        "verify", str(example), "--steps", "4", "--dp", "1,8", "--workers", "2",
        "--runners", "thread", "--json",
    )  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["ok"] is True
    assert len(data["settings"]) >= 4
