"""Resealed states (issue 35, item 4): a real checkpoint of a staged run, edited and resealed
with ``encode_checked``, is refused naming the field when its ``stage`` section's values
cannot have been written together (``state/invariants.py``); the unedited control resumes."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.stages.conftest import digests, recipe
from tests.stages.provenance import write_corpus
from tests.stages.test_stages import STAGES
from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.state.codec import encode_checked
from zephon_nodes.state.files import STATE_FILE, load_state, save_state

SAVE_AT = 5  # one step into stage 1 (it starts after step 4)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, dict[str, Any], list[str]]:
    """The staged pipeline, its state saved after step 5 and the digests of steps 6-8."""
    root = tmp_path_factory.mktemp("resealed")
    write_corpus(root, "abc", records=300)
    pipeline = Pipeline(recipe(root, stages=STAGES))
    saved: list[dict[str, Any]] = []
    from tests.stages.conftest import batches

    list(batches(pipeline, SAVE_AT, 1, save_at=SAVE_AT, saved=saved))
    after = digests(pipeline, SAVE_AT + 3, 1)[SAVE_AT:]
    return pipeline, saved[0], after


def reseal(tmp_path: Path, state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> Any:
    """Write ``state``, edit its file's JSON, recompute the checksum, load it back."""
    save_state(tmp_path, state)
    path = tmp_path / STATE_FILE
    raw = json.loads(path.read_bytes())
    raw.pop("checksum")
    edit(raw)
    path.write_bytes(encode_checked(raw))
    return load_state(tmp_path)  # the seal holds: the edit is not damage


def _head_lane(state: dict[str, Any]) -> tuple[str, int, int]:
    """A lane whose head names its dataset by position: (lane key, dataset index, width)."""
    stage = state["stage"]
    n = len(stage["names"])
    for key, row in stage["lanes"].items():
        if 1 <= row[n] <= n:
            return key, row[n] - 1, n
    raise AssertionError("no lane with a head in the saved state")


def test_the_unedited_state_resumes(
    tmp_path: Path, run: tuple[Pipeline, dict[str, Any], list[str]]
) -> None:
    pipeline, state, after = run
    resumed = reseal(tmp_path, state, lambda raw: None)
    assert digests(pipeline, 3, 1, resume=resumed) == after


def _edit_count(state: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    lane, d, _ = _head_lane(state)

    def edit(raw: dict[str, Any]) -> None:
        raw["stage"]["lanes"][lane][d] += 1

    return edit


def _edit_head_count(state: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    lane, _, n = _head_lane(state)

    def edit(raw: dict[str, Any]) -> None:
        raw["stage"]["lanes"][lane][n + 1] += 1

    return edit


def _drop_head(state: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    lane, _, n = _head_lane(state)

    def edit(raw: dict[str, Any]) -> None:
        raw["stage"]["lanes"][lane][n] = 0

    return edit


def _amended_later(state: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        raw["stage"]["amended"] = [{"fingerprint": "0" * 64, "step": SAVE_AT + 1}]

    return edit


@pytest.mark.parametrize(
    ("make_edit", "message"),
    [
        (_edit_count, r"lanes\['\d+'\]: the head is work item \d+ of dataset '\w+', but the lane"),
        (_edit_head_count, r"lanes\['\d+'\]: the head is work item"),
        (_drop_head, r"lanes\['\d+'\]: no head \(head=0\) but head count"),
        (_amended_later, r"amended after step 6, later than the step the stage started after"),
    ],
    ids=["t of the head's dataset +1", "head count +1", "head removed", "amended later"],
)
def test_an_edited_stage_row_is_refused(
    tmp_path: Path,
    run: tuple[Pipeline, dict[str, Any], list[str]],
    make_edit: Callable[[dict[str, Any]], Callable[[dict[str, Any]], None]],
    message: str,
) -> None:
    pipeline, state, _ = run
    resumed = reseal(tmp_path, copy.deepcopy(state), make_edit(state))
    with pytest.raises(CheckpointError, match=r"checkpoint 'stage'.*" + message):
        digests(pipeline, 1, 1, resume=resumed)


def _sampled_lane(state: dict[str, Any]) -> tuple[str, int, int]:
    """A lane with a ``last_sample`` entry and a head: (lane key, head dataset, width)."""
    stage = state["stage"]
    n = len(stage["names"])
    for key, row in stage["lanes"].items():
        if key in state["last_sample"] and 1 <= row[n] <= n:
            return key, row[n] - 1, n
    raise AssertionError("no lane with a last sample and a head in the saved state")


def _row_edit(pick: Callable[[int, int], int]) -> Callable[[dict[str, Any]], Any]:
    """An edit of one value of a sampled lane's row: ``pick(head dataset, width)`` its index."""

    def make(state: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        lane, d, n = _sampled_lane(state)

        def edit(raw: dict[str, Any]) -> None:
            raw["stage"]["lanes"][lane][pick(d, n)] += 1

        return edit

    return make


@pytest.mark.parametrize(
    "make_edit",
    [
        _row_edit(lambda d, n: (d + 1) % n),  # t of a dataset that is not the head's
        _row_edit(lambda d, n: n + 2),  # the head's first record
        _row_edit(lambda d, n: n + 3),  # dropped samples
        _row_edit(lambda d, n: n + 4),  # dropped tokens
    ],
    ids=["t of another dataset +1", "head record +1", "dropped samples +1", "dropped tokens +1"],
)
def test_a_stage_value_no_invariant_ties_is_refused_by_the_last_sample_check(
    tmp_path: Path,
    run: tuple[Pipeline, dict[str, Any], list[str]],
    make_edit: Callable[[dict[str, Any]], Callable[[dict[str, Any]], None]],
) -> None:
    """The lane's stage row is in its ``last_sample`` check: an edit of it is refused.

    Before, the counts of other datasets and the drop counters were checked by nothing
    (resumed with other batches; the counters printed as recorded); the head record was
    caught only because the replayed window reads from it.
    """
    pipeline, state, _ = run
    resumed = reseal(tmp_path, copy.deepcopy(state), make_edit(state))
    with pytest.raises(CheckpointError, match=r"lanes\['\d+'\].*does not match last_sample"):
        digests(pipeline, 1, 1, resume=resumed)


def test_a_state_checked_without_its_stage_row_still_resumes(
    tmp_path: Path,
    run: tuple[Pipeline, dict[str, Any], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A staged state written before the row was in the check (2026-12-03) resumes as then."""
    from tests.stages.conftest import batches
    from zephon_nodes.engine import multiplexer
    from zephon_nodes.state.last_sample import sample_check

    pipeline, state, after = run
    with monkeypatch.context() as patch:
        patch.setattr(multiplexer, "sample_check", lambda *a, stage=None: sample_check(*a))
        saved: list[dict[str, Any]] = []
        list(batches(pipeline, SAVE_AT, 1, save_at=SAVE_AT, saved=saved))
    old = saved[0]
    assert old["last_sample"] and old["last_sample"] != state["last_sample"]
    assert digests(pipeline, 3, 1, resume=reseal(tmp_path, old, lambda raw: None)) == after
