"""TorchTitan main, finite data, dp 2 under torchrun: every rank ends after the same step,
raising ``DataloaderExhaustedError`` (what main's training loop catches), never a hang."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)

from tests.integrations.test_torchtitan_end import RECIPE, _steps_alone
from tests.integrations.test_torchtitan_torchrun import tail, torchrun
from zephon_nodes import Pipeline, Recipe

pytestmark = pytest.mark.titan_main


def test_two_ranks_raise_exhausted_after_the_same_step(tmp_path: Path) -> None:
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as f:
        for i in range(60):  # documents of very different lengths: lanes end apart
            f.write(json.dumps({"text": f"d{i} " + "word " * ((i * 7) % 23)}) + "\n")
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    pipeline = Pipeline(Recipe.from_toml(path))
    alone = [_steps_alone(pipeline, 2, r) for r in (0, 1)]
    assert alone[0] != alone[1], alone  # without agreement one rank would read on alone
    out = tmp_path / "out"
    out.mkdir()
    rc = torchrun(
        2, "tt_end_agree.py", ["--recipe", str(path), "--out", str(out)], tmp_path / "log"
    )
    assert rc == 0, tail(tmp_path / "log")
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["ended"] for g in got] == ["DataloaderExhaustedError"] * 2
    assert [g["micro_batches"] for g in got] == [min(alone) * 2] * 2  # 4 rows / 2 per batch
