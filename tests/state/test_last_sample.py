"""Resealed states past the restore's replay check are refused by each lane's ``last_sample``.

Issue 35 item 4: a restore replays each lane from the start of its pass only while the lane
has handed out at most ``REPLAY_CHECK_SAMPLES`` (256) samples; past that, an edited state
resealed with ``encode_checked`` (a position +-1, two lanes swapped, every lane +1, ``step``
+-1) resumed with other batches. The state now carries per lane a check of the last sample
the lane handed out (``zephon_nodes/state/last_sample.py``), which the replay of the lane's
current window reproduces. The run here: 4 lanes, 8 samples per lane and step, the ``bytes``
tokenizer (tokens are the records' bytes), saved after step 35 (280 samples per lane).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.fault.common import INLINE, memory_pipeline
from zephon_nodes import CheckpointError, Pipeline, merge_states, simulate
from zephon_nodes.engine.replay_check import REPLAY_CHECK_SAMPLES
from zephon_nodes.state.codec import decode_checked, encode_checked
from zephon_nodes.state.last_sample import LAST_SAMPLE_KEY

STEP = 35
SPL = 8  # samples per lane and step: global_batch_size 32 over 4 lanes


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return memory_pipeline(n_docs=900, global_batch_size=32)


def _run(pipeline: Pipeline, steps: int, **kw: Any) -> list[tuple[int, str]]:
    """``(step, digest)`` of each step: a relabelled step counts as a change too."""
    return [(r.step, r.digest) for r, _ in simulate(pipeline, 1, steps, pool=INLINE, **kw)]


def _saved(pipeline: Pipeline, step: int) -> list[dict[str, Any]]:
    saved: list[dict[str, Any]] = []
    for _ in simulate(pipeline, 1, step, pool=INLINE, save_at=step, on_save=saved.append):
        pass
    return saved


@pytest.fixture(scope="module")
def state(pipeline: Pipeline) -> dict[str, Any]:
    (saved,) = _saved(pipeline, STEP)
    return saved


@pytest.fixture(scope="module")
def uninterrupted(pipeline: Pipeline) -> list[tuple[int, str]]:
    return _run(pipeline, STEP + 3)[STEP:]


def _resealed(state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> Any:
    raw = copy.deepcopy(state)
    edit(raw)
    return decode_checked(encode_checked(raw), "edited", allow_unchecked=False)


def _resume(pipeline: Pipeline, state: Any, steps: int = 3) -> list[tuple[int, str]]:
    return _run(pipeline, steps, resume_state=state)


def test_the_run_is_past_the_replay_check(state: dict[str, Any]) -> None:
    """The precondition of every edit below: the replay from the pass start is skipped."""
    assert memory_pipeline(n_docs=900, global_batch_size=32).recipe.samples_per_lane == SPL
    assert STEP * SPL > REPLAY_CHECK_SAMPLES
    lanes = state["lanes"]
    assert all(w > 0 and c >= 2 for w, c in lanes.values())  # +-1 stays within the bounds
    assert lanes["0"] != lanes["1"]  # a swap moves positions
    assert sorted(state[LAST_SAMPLE_KEY]) == sorted(lanes)


def test_an_unedited_state_resumes_to_the_same_batches(
    pipeline: Pipeline, state: dict[str, Any], uninterrupted: list[tuple[int, str]]
) -> None:
    assert _resume(pipeline, _resealed(state, lambda s: None)) == uninterrupted


def _lane0(d: int) -> Callable[[dict[str, Any]], None]:
    def edit(s: dict[str, Any]) -> None:
        s["lanes"]["0"][1] += d

    return edit


def _swap(s: dict[str, Any]) -> None:
    s["lanes"]["0"], s["lanes"]["1"] = s["lanes"]["1"], s["lanes"]["0"]


def _swap_all(s: dict[str, Any]) -> None:
    """Positions and their checks swapped together: the lane number is in the check."""
    _swap(s)
    last = s[LAST_SAMPLE_KEY]
    last["0"], last["1"] = last["1"], last["0"]


def _every_lane(s: dict[str, Any]) -> None:
    for pos in s["lanes"].values():
        pos[1] += 1


def _step(d: int) -> Callable[[dict[str, Any]], None]:
    def edit(s: dict[str, Any]) -> None:
        s["step"] += d

    return edit


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "lane 0 consumed +1": _lane0(1),
    "lane 0 consumed -1": _lane0(-1),
    "lanes 0 and 1 swapped": _swap,
    "lanes 0 and 1 swapped with their checks": _swap_all,
    "every lane consumed +1": _every_lane,
    "step +1": _step(1),
    "step -1": _step(-1),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_resealed_edit_is_refused_naming_the_lane(
    pipeline: Pipeline, state: dict[str, Any], name: str
) -> None:
    edited = _resealed(state, EDITS[name])
    with pytest.raises(CheckpointError, match=r"lanes\['0'\]: position .* last_sample\['0'\]"):
        _resume(pipeline, edited)


def test_a_lane_without_its_check_is_refused(pipeline: Pipeline, state: dict[str, Any]) -> None:
    """Dropping one lane's entry (to escape its check) is an edit of the section."""
    edited = _resealed(state, lambda s: s[LAST_SAMPLE_KEY].pop("2"))
    with pytest.raises(CheckpointError, match=r"lanes\['2'\].*last_sample\['2'\] is missing"):
        _resume(pipeline, edited)


@pytest.mark.parametrize("bad", [{"0": -1}, {"0": 2**62}, {"0": "12"}, {"9": 1}, [1, 2]])
def test_a_malformed_section_is_refused(
    pipeline: Pipeline, state: dict[str, Any], bad: Any
) -> None:
    edited = _resealed(state, lambda s: s.update({LAST_SAMPLE_KEY: bad}))
    with pytest.raises(CheckpointError, match="last_sample"):
        _resume(pipeline, edited)


def test_a_state_without_the_section_is_checked_as_an_older_one(
    pipeline: Pipeline, state: dict[str, Any], uninterrupted: list[tuple[int, str]]
) -> None:
    """No section: a state written before it existed; it resumes, with the older checks."""
    without = _resealed(state, lambda s: s.pop(LAST_SAMPLE_KEY))
    assert _resume(pipeline, without) == uninterrupted
    (early,) = _saved(pipeline, 10)  # 80 samples per lane: the replay check applies
    edited = _resealed(early, lambda s: (s.pop(LAST_SAMPLE_KEY), _lane0(1)(s)))
    with pytest.raises(CheckpointError, match=r"lanes\['0'\].* not reachable at step=10"):
        _resume(pipeline, edited)


def test_rank_states_merge_with_their_checks(
    pipeline: Pipeline, uninterrupted: list[tuple[int, str]]
) -> None:
    """Two ranks' states merged: each lane's check kept, so the merge resumes at dp 1 and an
    edit of the merged state is refused; a rank state without the section drops it."""
    ranks = []
    for rank in (0, 1):
        node = pipeline.rank_node(2, rank, pool=INLINE)
        node.reset()
        for _ in range(STEP):  # one micro-batch per step
            next(node)
        ranks.append(node.get_state())
    assert [sorted(r[LAST_SAMPLE_KEY]) for r in ranks] == [["0", "1"], ["2", "3"]]
    merged = merge_states(ranks)
    assert sorted(merged[LAST_SAMPLE_KEY]) == ["0", "1", "2", "3"]
    assert _resume(pipeline, merged) == uninterrupted
    with pytest.raises(CheckpointError, match=r"lanes\['3'\].*last_sample\['3'\]"):
        _resume(pipeline, _resealed(merged, lambda s: s["lanes"]["3"].__setitem__(1, 1)))
    older = copy.deepcopy(ranks)
    older[1].pop(LAST_SAMPLE_KEY)
    assert LAST_SAMPLE_KEY not in merge_states(older)


def test_a_mid_step_state_keeps_the_check_of_its_committed_positions(
    pipeline: Pipeline,
) -> None:
    """A state taken after a micro-batch: positions (and checks) as of the step's start."""
    node = pipeline.rank_node(1, 0, local_batch_size=8, pool=INLINE)
    node.reset()
    for _ in range(STEP * 4 + 1):  # 4 micro-batches per step: one into step STEP + 1
        next(node)
    state = node.get_state()
    assert state["micro"] == 1
    rest = [next(node)["input"].tolist() for _ in range(6)]
    again = pipeline.rank_node(1, 0, local_batch_size=8, pool=INLINE)
    again.reset(_resealed(state, lambda s: None))
    assert [next(again)["input"].tolist() for _ in range(6)] == rest
    with pytest.raises(CheckpointError, match=r"lanes\['1'\].*last_sample\['1'\]"):
        pipeline.rank_node(1, 0, local_batch_size=8, pool=INLINE).reset(
            _resealed(state, lambda s: s["lanes"]["1"].__setitem__(1, s["lanes"]["1"][1] + 1))
        )
