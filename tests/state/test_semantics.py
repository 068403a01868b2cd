"""Resealed checkpoints (edited, then checksummed again) that no run produces are refused.

Issue 27, case 5: a checksum only proves that the bytes were written by someone. Each edit
below is resealed with the codec's own checksum (``encode_checked``), so the file passes
the checksum; the resume must still refuse it, naming the field. The states are taken after
step 15 of ``plain_recipe`` (lanes in window 1, 2 samples per lane and step) and of
``mixed_recipe`` with decisions after steps 1 and 3.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.state.recipes import mixed_recipe, plain_recipe
from zephon_nodes import CheckpointError, Pipeline, simulate
from zephon_nodes.state import encode_checked, load_state
from zephon_nodes.state.files import STATE_FILE

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def plain() -> Pipeline:
    return Pipeline(plain_recipe())


@pytest.fixture(scope="module")
def mixed() -> Pipeline:
    return Pipeline(mixed_recipe())


def reseal(tmp_path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Write ``state`` with a correct checksum and load it back (the checksum passes)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / STATE_FILE).write_bytes(encode_checked(state))
    return load_state(tmp_path)


def resume(pipeline: Pipeline, state: dict[str, Any], dp: int = 1) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, dp, 2, num_workers=0, resume_state=state)]


def edited(name: str, edit: Any) -> dict[str, Any]:
    state = copy.deepcopy(json.loads((FIXTURES / name / STATE_FILE).read_text()))
    del state["checksum"]
    edit(state)
    return state


def test_the_unedited_states_resume(tmp_path: Path, plain: Pipeline, mixed: Pipeline) -> None:
    """The control: the same states, resealed unedited, resume (at dp 1 and 2)."""
    for name, pipeline in (("single", plain), ("mixture", mixed)):
        state = reseal(tmp_path / name, edited(name, lambda s: None))
        assert resume(pipeline, state, 1) == resume(pipeline, state, 2)


@pytest.mark.parametrize("step", [14, 16, 10, 12])
def test_step_relabelled(tmp_path: Path, plain: Pipeline, step: int) -> None:
    """``step`` 15 -> 14/16/10/12: every lane is in window 1, within the step's bounds."""
    state = reseal(tmp_path, edited("single", lambda s: s.update(step=step)))
    with pytest.raises(CheckpointError, match=rf"lanes\['0'\].* not reachable at step={step}"):
        resume(plain, state)


@pytest.mark.parametrize("position", [[1, 8], [1, 6], [1, 1], [2, 7], [0, 30]])
def test_lane_position_moved(tmp_path: Path, plain: Pipeline, position: list[int]) -> None:
    """Lane 0's ``[1, 7]`` moved: in its window, to the next window, back to window 0."""
    state = reseal(tmp_path, edited("single", lambda s: s["lanes"].update({"0": position})))
    with pytest.raises(CheckpointError, match=r"lanes\['0'\].* not reachable at step=15"):
        resume(plain, state, dp=2)


@pytest.mark.parametrize("pair", [("0", "1"), ("2", "3"), ("0", "3")])
def test_lanes_swapped(tmp_path: Path, plain: Pipeline, pair: tuple[str, str]) -> None:
    a, b = pair

    def swap(s: dict[str, Any]) -> None:
        s["lanes"][a], s["lanes"][b] = s["lanes"][b], s["lanes"][a]

    state = reseal(tmp_path, edited("single", swap))
    with pytest.raises(CheckpointError, match=rf"lanes\['{a}'\].* not reachable"):
        resume(plain, state)


def test_mixture_state_step_relabelled(tmp_path: Path, mixed: Pipeline) -> None:
    state = reseal(tmp_path, edited("mixture", lambda s: s.update(step=14)))
    with pytest.raises(CheckpointError, match=r"lanes\['\d'\].* not reachable at step=14"):
        resume(mixed, state)


class TestForgedDecisions:
    """The decision log and its effect windows against the lane positions."""

    def test_effect_window_moved(self, tmp_path: Path, mixed: Pipeline) -> None:
        """Lane 1 (at [1, 14], 16 samples before window 1) was in window 0 at step 3."""
        state = reseal(
            tmp_path, edited("mixture", lambda s: s["mixture"]["effects"].update({"1": [1, 2]}))
        )
        with pytest.raises(CheckpointError, match=r"effects\['1'\]\[1\] is window 2.*window 1"):
            resume(mixed, state)

    def test_decision_before_the_first_step_starts_at_window_1(
        self, tmp_path: Path, mixed: Pipeline
    ) -> None:
        def forge(s: dict[str, Any]) -> None:
            s["mixture"]["log"][0]["step"] = 0
            s["mixture"]["effects"]["0"][0] = 2

        state = reseal(tmp_path, edited("mixture", forge))
        with pytest.raises(CheckpointError, match=r"effects\['0'\]\[0\].*after step 0.*window 1"):
            resume(mixed, state)

    def test_decision_at_the_saved_step_starts_after_the_current_window(
        self, tmp_path: Path, mixed: Pipeline
    ) -> None:
        """A forged decision appended after step 15 must start at each lane's window + 1."""

        def forge(s: dict[str, Any]) -> None:
            s["mixture"]["log"].append({"step": 15, "weights": {"long": 1.0, "short": 0.0}})
            for lane, (w, _) in s["lanes"].items():
                s["mixture"]["effects"][lane].append(w + (2 if lane == "2" else 1))

        state = reseal(tmp_path, edited("mixture", forge))
        with pytest.raises(CheckpointError, match=r"effects\['2'\]\[2\] is window 5.*window 4"):
            resume(mixed, state)

    def test_forged_weights_change_what_the_lanes_replay(
        self, tmp_path: Path, mixed: Pipeline
    ) -> None:
        """A decision's weights edited: the replayed lanes do not reach the saved positions."""

        def forge(s: dict[str, Any]) -> None:
            s["mixture"]["log"][0]["weights"] = {"long": 0.9, "short": 0.1}

        state = reseal(tmp_path, edited("mixture", forge))
        with pytest.raises(CheckpointError, match=r"lanes\['\d'\].* not reachable at step=15"):
            resume(mixed, state)

    def test_a_consistent_appended_decision_is_accepted(
        self, tmp_path: Path, mixed: Pipeline
    ) -> None:
        """The control: appending exactly what ``set_mixture`` after step 15 records."""

        def forge(s: dict[str, Any]) -> None:
            s["mixture"]["log"].append({"step": 15, "weights": {"long": 1.0, "short": 0.0}})
            for lane, (w, _) in s["lanes"].items():
                s["mixture"]["effects"][lane].append(w + 1)

        state = reseal(tmp_path, edited("mixture", forge))
        assert len(resume(mixed, state)) == 2
