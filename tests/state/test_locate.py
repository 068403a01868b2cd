"""A ``Loader`` state whose library state lags the consumer names the replay to call."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import zephon_nodes
from tests.state.recipes import plain_recipe
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.state import unwrap_state

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def test_a_lagging_state_names_rank_state_which_replays_it() -> None:
    raw = json.loads((FIXTURES / "loader" / "loader_state.json").read_text())
    lagging = copy.deepcopy(raw)
    lagging["root"]["steps_since_snapshot"] = 2  # the consumer took 2 more steps
    with pytest.raises(CheckpointError, match=r"zephon_nodes\.rank_state\(state, pipeline"):
        unwrap_state(lagging)
    pipeline = Pipeline(plain_recipe())
    state = zephon_nodes.rank_state(lagging, pipeline, step=17)
    assert state["step"] == 17
    got = [r.digest for r, _ in simulate(pipeline, 2, 5, num_workers=0, resume_state=state)]
    assert got == EXPECTED["plain"][17:]
