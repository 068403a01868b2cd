"""Amendments chained with re-lanes (issue 24): amended twice, re-laned, amended again, ...

A change after a re-lane continues each dataset from the set of its work items no lane has
read (``zephon_nodes/engine/unread.py``). Checked from the tokens (``provenance.py``), not
from the engine's bookkeeping: no document delivered twice over the whole chain, a removed
dataset absent after its removal, and at each change after a re-lane the set the new stage
reads from is exactly the set of work items none of whose documents was delivered yet (so
nothing is skipped: every item outside it was delivered, at least in part).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.stages.conftest import batches, digests, recipe
from tests.stages.provenance import delivered, fragments
from tests.stages.test_amend_cli import BASE, _zephon
from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.engine.stages import amend_state
from zephon_nodes.engine.work import DatasetWorkSource
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.files import save_state
from zephon_nodes.state.stage import StageState

A = {"name": "a", "paths": ["a/*.jsonl"], "weight": 1.0}
B = {"name": "b", "paths": ["b/*.jsonl"], "weight": 1.0}
C = {"name": "c", "paths": ["c/*.jsonl"], "weight": 1.0}
ITEMS_PER_EPOCH = 150  # 2 shards x 300 records, 4 records per work item


def _docs(batch_list: list[dict[str, np.ndarray]]) -> set[str]:
    return {doc[0] for b in batch_list for _, doc, _ in fragments(b) if doc}


def _check_unread_is_undelivered(
    root: Path, section: Mapping[str, Any], lanes: int, got: Counter[Any]
) -> int:
    """Each dataset's unread set (from the new stage section) against the corpus.

    A work item (global index ``g`` of the dataset's stream, read here through a one-lane
    stream of the same key) is in the set exactly when none of its documents was delivered.
    Returns the number of items checked.
    """
    stage = StageState.from_state(section, lanes)
    checked = 0
    for name, unread in stage.unread.items():
        key = dict(zip(stage.names, stage.streams, strict=True))[name][0]
        one = Pipeline(recipe(root, datasets=[{"name": name, "paths": [f"{name}/*.jsonl"]}]))
        stream = DatasetWorkSource(one.datasets[0], 7, 1, None, dataset_index=key)
        for g in range(min(unread.start + 8, ITEMS_PER_EPOCH)):
            item = stream.work(0, g)
            assert item is not None
            seen = sum(1 for r in range(item.start, item.stop) if got[(name, item.shard_index, r)])
            assert (g in unread) == (seen == 0), (name, g, seen, unread)
            checked += 1
    return checked


@pytest.fixture(scope="module")
def chain(corpus: tuple[Path, Any]) -> dict[str, Any]:
    """Amended at 3 and 6, re-laned 4 -> 8 at 8, amended at 11, re-laned 8 -> 4 at 14,
    amended at 26; the batches of each leg and the states in between."""
    root, _ = corpus
    legs: list[list[dict[str, np.ndarray]]] = []
    states: dict[str, Any] = {}

    def leg(p: Pipeline, steps: int, dp: int, resume: Any, at: int) -> dict[str, Any]:
        saved: list[dict[str, Any]] = []
        legs.append(
            [b for _, _, b in batches(p, steps, dp, resume=resume, save_at=at, saved=saved)]
        )
        return saved[0]

    base = Pipeline(recipe(root))
    s = leg(base, 3, 2, None, 3)
    one = Pipeline(recipe(root, seq_len=64, datasets=[A, C]))  # remove b, add c, longer
    s = leg(one, 3, 4, amend_state(base, s, one), 6)
    two = Pipeline(recipe(root, seq_len=64, datasets=[A, {**C, "weight": 2.0}]))
    s = leg(two, 2, 2, amend_state(one, s, two), 8)
    two8 = Pipeline(recipe(root, seq_len=64, datasets=[A, {**C, "weight": 2.0}], num_lanes=8))
    s = leg(two8, 3, 4, relane_state(two, s, 8), 11)
    states["before_third"] = s
    states["delivered_third"] = delivered(b for x in legs for b in x)
    # b was removed at step 3, before the re-lane, and comes back; c's weight goes back.
    three = Pipeline(recipe(root, seq_len=48, datasets=[A, B, C], num_lanes=8))
    third = amend_state(two8, s, three)
    states["third"] = third
    s = leg(three, 3, 2, third, 14)
    three4 = Pipeline(recipe(root, seq_len=48, datasets=[A, B, C], num_lanes=4))
    s = leg(three4, 12, 2, relane_state(three, s, 4), 26)
    states["delivered_fourth"] = delivered(b for x in legs for b in x)
    four = Pipeline(recipe(root, seq_len=32, datasets=[{**A, "weight": 3.0}, B], num_lanes=4))
    fourth = amend_state(three4, s, four)
    states["fourth"] = fourth
    legs.append([b for _, _, b in batches(four, 8, 1, resume=fourth)])
    return {
        "legs": legs,
        "states": states,
        "pipelines": {"three": three, "three4": three4, "four": four, "two8": two8},
    }


def test_the_chain_delivers_no_document_twice(
    chain: dict[str, Any], corpus: tuple[Path, Any]
) -> None:
    _, lengths = corpus
    legs = chain["legs"]
    got = delivered(b for leg in legs for b in leg)
    assert got and all(n <= lengths[doc] for doc, n in got.items())
    # Removed datasets are absent after their removal, added ones present.
    assert "b" not in _docs([b for leg in legs[1:4] for b in leg])
    assert _docs(legs[1]) == {"a", "c"}
    assert _docs(legs[4]) == {"a", "b", "c"}  # b read again after the re-lane
    assert _docs(legs[6]) == {"a", "b"}  # c removed by the last change


@pytest.mark.parametrize("which", ["third", "fourth"])
def test_the_unread_sets_are_what_was_not_delivered(
    chain: dict[str, Any], corpus: tuple[Path, Any], which: str
) -> None:
    root, _ = corpus
    state = chain["states"][which]
    got = chain["states"]["delivered_" + which]
    lanes = 8 if which == "third" else 4
    section = state["stage"]
    assert set(StageState.from_state(section, lanes).unread) == {"a", "b", "c"}
    assert _check_unread_is_undelivered(root, section, lanes, got) > 60


def test_elastic_after_each_change_that_followed_a_re_lane(chain: dict[str, Any]) -> None:
    p = chain["pipelines"]
    third = chain["states"]["third"]
    ref = digests(p["three"], 4, 1, resume=third)
    assert digests(p["three"], 4, 2, resume=third) == ref
    assert digests(p["three"], 4, 8, resume=third) == ref
    fourth = chain["states"]["fourth"]
    ref = digests(p["four"], 5, 1, resume=fourth)
    assert digests(p["four"], 5, 2, resume=fourth) == ref
    assert digests(p["four"], 5, 4, resume=fourth) == ref
    assert digests(p["four"], 5, 2, resume=fourth, workers=2, runner="process") == ref
    # Across a restart in the new stage, at another dp size.
    saved: list[dict[str, Any]] = []
    list(batches(p["four"], 2, 4, resume=fourth, save_at=28, saved=saved))
    assert digests(p["four"], 3, 2, resume=saved[0]) == ref[2:]


def test_drops_are_carried_and_counted(chain: dict[str, Any]) -> None:
    third = chain["states"]["third"]["stage"]
    old = chain["states"]["before_third"]["lineage"]["stage"]
    before = sum(row[-1] for row in old["lanes"].values())
    after = sum(row[-1] for row in third["lanes"].values())
    assert len(third["lanes"]) == 8 and before > 0 and after >= before
    assert [a["step"] for a in chain["states"]["fourth"]["stage"]["amended"]] == [3, 6, 11, 26]


def test_a_later_change_without_a_re_lane_continues_the_dealt_streams(
    chain: dict[str, Any], corpus: tuple[Path, Any]
) -> None:
    root, lengths = corpus
    p = chain["pipelines"]
    third = chain["states"]["third"]
    saved: list[dict[str, Any]] = []
    run = [b for _, _, b in batches(p["three"], 2, 2, resume=third, save_at=13, saved=saved)]
    only_a = Pipeline(recipe(root, seq_len=64, datasets=[A], num_lanes=8))
    again = amend_state(p["three"], saved[0], only_a)
    assert again["stage"]["unread"] == third["stage"]["unread"]
    after = [b for _, _, b in batches(only_a, 4, 2, resume=again)]
    assert digests(only_a, 4, 4, resume=again) == digests(only_a, 4, 1, resume=again)
    got = delivered([*(b for leg in chain["legs"][:4] for b in leg), *run, *after])
    assert all(n <= lengths[doc] for doc, n in got.items())
    assert _docs(after) == {"a"}


def test_two_re_lanes_then_a_change(corpus: tuple[Path, Any]) -> None:
    """Re-laned 4 -> 8 -> 2, then amended: the unread sets are traced through both re-lanes."""
    root, lengths = corpus
    legs: list[dict[str, np.ndarray]] = []

    def leg(p: Pipeline, steps: int, dp: int, resume: Any, at: int) -> dict[str, Any]:
        saved: list[dict[str, Any]] = []
        legs.extend(b for _, _, b in batches(p, steps, dp, resume=resume, save_at=at, saved=saved))
        return saved[0]

    base = Pipeline(recipe(root))
    s = leg(base, 3, 2, None, 3)
    one = Pipeline(recipe(root, seq_len=64, datasets=[A, C]))
    s = leg(one, 5, 2, amend_state(base, s, one), 8)
    one8 = Pipeline(recipe(root, seq_len=64, datasets=[A, C], num_lanes=8))
    s = leg(one8, 6, 2, relane_state(one, s, 8), 14)
    one2 = Pipeline(recipe(root, seq_len=64, datasets=[A, C], num_lanes=2))
    s = leg(one2, 10, 1, relane_state(one8, s, 2), 24)
    assert "parent" in s["lineage"]
    new = Pipeline(recipe(root, seq_len=48, datasets=[A, B], num_lanes=2))
    amended = amend_state(one2, s, new)
    assert _check_unread_is_undelivered(root, amended["stage"], 2, delivered(legs)) > 60
    after = [b for _, _, b in batches(new, 6, 1, resume=amended)]
    assert digests(new, 6, 2, resume=amended) == digests(new, 6, 1, resume=amended)
    got = delivered([*legs, *after])
    assert all(n <= lengths[doc] for doc, n in got.items())
    assert _docs(after) == {"a", "b"}


def test_a_pending_cut_item_is_refused(corpus: tuple[Path, Any]) -> None:
    """Re-laned right after a change, a lane has not yet read the rest of the cut item."""
    root, _ = corpus
    base = Pipeline(recipe(root))
    saved: list[dict[str, Any]] = []
    list(batches(base, 4, 2, save_at=4, saved=saved))
    one = Pipeline(recipe(root, seq_len=64, datasets=[A, C]))
    amended = amend_state(base, saved[0], one)
    assert amended["stage"]["lanes"]["0"][3] == 1  # lane 0 cut a work item of a in two
    relaned = relane_state(one, amended, 2)
    one2 = Pipeline(recipe(root, seq_len=64, datasets=[A, C], num_lanes=2))
    with pytest.raises(RecipeError, match="amend at a later step"):
        amend_state(one2, relaned, Pipeline(recipe(root, datasets=[A], num_lanes=2)))


def test_the_unread_section_is_checked(chain: dict[str, Any]) -> None:
    good = chain["states"]["third"]["stage"]
    StageState.from_state(good, 8)
    cases = {
        "version": lambda u: u.update(version=2),
        "num_lanes": lambda u: u.update(num_lanes=4),
        "increasing": lambda u: u["datasets"]["a"].update(items=[5, 3]),
        "below": lambda u: u["datasets"]["a"].update(items=[u["datasets"]["a"]["from"]]),
        "not one of the names": lambda u: u["datasets"].update(z={"from": 0, "items": []}),
    }
    for match, spoil in cases.items():
        bad = copy.deepcopy(good)
        spoil(bad["unread"])
        with pytest.raises(CheckpointError, match=match):
            StageState.from_state(bad, 8)
    bad = copy.deepcopy(good)
    del bad["unread"]["datasets"]["a"]
    bad["lanes"]["0"][3:6] = [4, 0, 0]  # a head of a by global index: a has no set now
    with pytest.raises(CheckpointError, match="global index"):
        StageState.from_state(bad, 8)


PLANNED: list[dict[str, Any]] = [
    {"start_step": 3, "seq_len": 64, "remove_datasets": ["b"], "datasets": [C]},
    {"start_step": 6, "global_batch_size": 16, "weights": {"a": 3.0}},
]


def test_re_laning_a_recipe_with_stages_once_all_started(corpus: tuple[Path, Any]) -> None:
    """Every stage started: the re-laned run continues the last one (its batch, its seq_len)."""
    root, lengths = corpus
    staged = Pipeline(recipe(root, stages=PLANNED))
    saved: list[dict[str, Any]] = []
    before = [b for _, _, b in batches(staged, 8, 2, save_at=8, saved=saved)]
    assert saved[0]["stage"]["index"] == 2
    eight = Pipeline(recipe(root, stages=PLANNED, num_lanes=8))
    relaned = relane_state(staged, saved[0], 8)
    after = [b for _, _, b in batches(eight, 4, 1, resume=relaned)]
    assert all(b["input"].shape == (16, 64) for b in after)  # the last stage's batch
    ref = digests(eight, 4, 1, resume=relaned)
    assert digests(eight, 4, 2, resume=relaned) == ref == digests(eight, 4, 8, resume=relaned)
    got = delivered([*before, *after])
    assert all(n <= lengths[doc] for doc, n in got.items())
    assert _docs(after) == {"a", "c"}
    # ... and a change after it: b (removed by the first stage) is read again, continued.
    at: list[dict[str, Any]] = []
    list(batches(eight, 4, 2, resume=relaned, save_at=12, saved=at))
    new = Pipeline(recipe(root, seq_len=48, datasets=[A, B], num_lanes=8))
    amended = amend_state(eight, at[0], new)
    assert [a["step"] for a in amended["stage"]["amended"]] == [12]
    last = [b for _, _, b in batches(new, 4, 1, resume=amended)]
    assert digests(new, 4, 4, resume=amended) == digests(new, 4, 1, resume=amended)
    got = delivered([*before, *after, *last])
    assert all(n <= lengths[doc] for doc, n in got.items())
    assert _docs(last) == {"a", "b"}
    seen = delivered([*before, *after, *(b for _, _, b in batches(eight, 4, 2, resume=relaned))])
    assert _check_unread_is_undelivered(root, amended["stage"], 8, seen) > 20


@pytest.mark.parametrize("step", [5, 6])
def test_re_laning_before_a_stage_started_is_refused(corpus: tuple[Path, Any], step: int) -> None:
    """A stage still ahead (after step 6, entered when step 7 is built) refuses the re-lane."""
    root, _ = corpus
    staged = Pipeline(recipe(root, stages=PLANNED))
    saved: list[dict[str, Any]] = []
    list(batches(staged, step, 2, save_at=step, saved=saved))
    with pytest.raises(RecipeError, match=r"stages\[1\] \(start_step=6\) is still ahead"):
        relane_state(staged, saved[0], 8)


_TOML = BASE.replace("num_lanes = 4", "num_lanes = {lanes}")


def _toml(root: Path, name: str, lanes: int, seq_len: int, names: str) -> Path:
    datasets = "".join(f'[[datasets]]\nname = "{n}"\npaths = ["{n}/*.jsonl"]\n' for n in names)
    path = root / name
    path.write_text(_TOML.format(lanes=lanes, seq_len=seq_len, datasets=datasets))
    return path


def test_zephon_amend_on_a_re_laned_checkpoint(
    chain: dict[str, Any], corpus: tuple[Path, Any], tmp_path: Path
) -> None:
    root, _ = corpus
    old = _toml(root, "relaned8.toml", 8, 64, "ac")
    # The fixture's recipe gives c weight 2.0: write the checkpoint of a recipe like it.
    text = old.read_text().replace('name = "c"\n', 'name = "c"\nweight = 2.0\n')
    old.write_text(text)
    new = _toml(root, "after8.toml", 8, 48, "abc")
    ckpt = tmp_path / "ckpt"
    save_state(ckpt, chain["states"]["before_third"])
    out = tmp_path / "out"
    done = _zephon("amend", old, ckpt, new, "--output", out, "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["amendments"] == 3 and summary["datasets"] == ["a", "b", "c"]
    written = json.loads((out / "zephon_state.json").read_text())
    assert written["stage"] == chain["states"]["third"]["stage"]
    # A recipe with a fixed field changed: one line, exit 2.
    bad = _toml(root, "bad8.toml", 8, 48, "abc")
    bad.write_text(bad.read_text().replace("seed = 7", "seed = 8"))
    refused = _zephon("amend", old, ckpt, bad, "--output", tmp_path / "no", cwd=root)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_the_new_refusals_from_the_command_line(corpus: tuple[Path, Any], tmp_path: Path) -> None:
    """``zephon relane`` with a stage ahead, ``zephon amend`` with a cut item pending: exit 2."""
    root, _ = corpus
    staged = _toml(root, "staged4.toml", 4, 32, "ab")
    staged.write_text(
        staged.read_text()
        + '[[stages]]\nstart_step = 3\nseq_len = 64\nremove_datasets = ["b"]\n'
        + '[[stages.datasets]]\nname = "c"\npaths = ["c/*.jsonl"]\n'
        + "[[stages]]\nstart_step = 6\nglobal_batch_size = 16\n"
    )
    p = Pipeline(Recipe.from_toml(staged))
    saved: list[dict[str, Any]] = []
    list(batches(p, 5, 2, save_at=5, saved=saved))
    save_state(tmp_path / "at5", saved[0])
    got = _zephon(
        "relane", staged, tmp_path / "at5", "--num-lanes", 8, "--output", tmp_path / "x", cwd=root
    )
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    assert "stages[1] (start_step=6) is still ahead" in got.stderr
    # Re-laned right after a change, then amended at once: a cut item is still pending.
    base = _toml(root, "base4.toml", 4, 32, "ab")
    one = _toml(root, "one4.toml", 4, 64, "ac")
    one2 = _toml(root, "one2.toml", 2, 64, "ac")
    only_a = _toml(root, "only_a2.toml", 2, 64, "a")
    old = Pipeline(Recipe.from_toml(base))
    saved = []
    list(batches(old, 4, 2, save_at=4, saved=saved))
    amended = amend_state(old, saved[0], Pipeline(Recipe.from_toml(one)))
    save_state(tmp_path / "relaned", relane_state(Pipeline(Recipe.from_toml(one)), amended, 2))
    got = _zephon("amend", one2, tmp_path / "relaned", only_a, "--output", tmp_path / "y", cwd=root)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "amend at a later step" in got.stderr
