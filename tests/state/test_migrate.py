"""Checkpoints written by the code before the state package still load and resume exactly.

The fixtures (``tests/state/fixtures``, see its README) were written by commit 7750181 with
the recipes of ``tests/state/recipes.py``; ``expected.json`` holds that code's digests of
the uninterrupted runs. Each form is loaded with today's code and resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.state.recipes import mixed_recipe, plain_recipe
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.engine.relane import for_state
from zephon_nodes.state import (
    FORMAT,
    RankState,
    load_checkpoint,
    load_state,
    save_state,
    unwrap_state,
)
from zephon_nodes.state.migrate import upgrade

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
SAVED_AT = 15


@pytest.fixture(scope="module")
def plain() -> Pipeline:
    return Pipeline(plain_recipe())


def resumed(pipeline: Pipeline, state: dict, dp: int, steps: int) -> list[str]:
    run = simulate(for_state(pipeline, state), dp, steps, num_workers=0, resume_state=state)
    return [r.digest for r, _ in run]


def test_the_recipes_are_the_fixtures_recipes(plain: Pipeline) -> None:
    """The rebuilt recipe has the fingerprint the fixtures were written with."""
    single = json.loads((FIXTURES / "single" / "zephon_state.json").read_text())
    assert single["fingerprint"] == plain.fingerprint
    assert [r.digest for r, _ in simulate(plain, 1, 22, num_workers=0)] == EXPECTED["plain"]


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_single_file(plain: Pipeline, dp: int) -> None:
    state = load_state(FIXTURES / "single")
    assert RankState.from_dict(state).step == SAVED_AT
    assert resumed(plain, state, dp, 7) == EXPECTED["plain"][SAVED_AT:]


def test_unchecked_single_file(plain: Pipeline, tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"carries no checksum.*write it again with save_state"
    ):
        load_state(FIXTURES / "unchecked")
    state = load_state(FIXTURES / "unchecked", allow_unchecked=True)
    assert state == load_state(FIXTURES / "single")
    again = save_state(tmp_path, state)  # what the message says: then the commands read it
    assert load_state(again) == state
    assert resumed(plain, state, 2, 7) == EXPECTED["plain"][SAVED_AT:]


@pytest.mark.parametrize("path", ["multirank", "multirank/step_0000000015"])
def test_multi_rank(plain: Pipeline, path: str) -> None:
    state = load_checkpoint(FIXTURES / path)
    assert sorted(state["lanes"]) == ["0", "1", "2", "3"]
    assert resumed(plain, state, 1, 7) == EXPECTED["plain"][SAVED_AT:]
    assert resumed(plain, state, 4, 7) == EXPECTED["plain"][SAVED_AT:]


def test_loader_state(plain: Pipeline) -> None:
    """A whole ``Loader`` state (Prefetcher over the rank node) gives the state inside it."""
    raw = json.loads((FIXTURES / "loader" / "loader_state.json").read_text())
    assert "format" not in raw
    state = upgrade(raw, "loader_state.json")
    assert state == unwrap_state(raw)
    assert state["format"] == FORMAT and state["step"] == SAVED_AT
    assert resumed(plain, state, 2, 7) == EXPECTED["plain"][SAVED_AT:]


def test_relaned(plain: Pipeline) -> None:
    state = load_state(FIXTURES / "relaned")
    assert state["lineage"]["num_lanes"] == 4
    two = Pipeline(plain_recipe(2))
    assert resumed(two, state, 1, 4) == EXPECTED["relaned"]
    assert resumed(two, state, 2, 4) == EXPECTED["relaned"]


def test_mixture() -> None:
    state = load_state(FIXTURES / "mixture")
    assert [e["step"] for e in state["mixture"]["log"]] == [1, 3]
    mixed = Pipeline(mixed_recipe())
    assert resumed(mixed, state, 2, 7) == EXPECTED["mixture"][SAVED_AT:]


def test_a_newer_format_is_refused_naming_it() -> None:
    state = load_state(FIXTURES / "single")
    state["format"] = "zephon-nodes/7"
    with pytest.raises(CheckpointError, match=r"zephon-nodes/7.*newer zephon-nodes"):
        upgrade(state, "x.json")
    with pytest.raises(CheckpointError, match="unsupported checkpoint format 'zephon-nodes/7'"):
        RankState.from_dict(state)
