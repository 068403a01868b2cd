"""``zephon inspect``: what a checkpoint holds, and whether a recipe can resume from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.commands.conftest import RECIPE, write_recipe
from tests.commands.run import zephon
from zephon_nodes import Pipeline, Recipe, save_state, simulate


def saved_state(recipe_path: Path, directory: Path, world: int = 2, step: int = 3) -> dict:
    """Run ``world`` ranks for ``step`` steps and save the merged state into ``directory``."""
    states: list[dict[str, Any]] = []
    pipeline = Pipeline(Recipe.from_toml(recipe_path))
    for _ in simulate(pipeline, world, step, num_workers=0, save_at=step, on_save=states.append):
        pass
    save_state(directory, states[0])
    return states[0]


class TestInspect:
    def test_prints_format_fingerprint_step_and_lane_positions(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        state = saved_state(recipe_path, tmp_path / "ckpt")
        assert zephon("inspect", str(tmp_path / "ckpt")) == 0
        out = capsys.readouterr().out
        fields = dict(line.split(":", 1) for line in out.splitlines() if not line.startswith(" "))
        assert fields["format"].strip() == "zephon-nodes/1"
        assert fields["fingerprint"].strip() == Recipe.from_toml(recipe_path).fingerprint()
        assert fields["step"].strip() == "3"
        assert fields["num_lanes"].strip() == "4 (4 in this state)"
        for lane, (w, c) in state["lanes"].items():
            assert f"  lane {lane:>4}: [{w}, {c}]" in out

    def test_json(self, recipe_path: Path, tmp_path: Path, capsys: Any) -> None:
        state = saved_state(recipe_path, tmp_path / "ckpt", world=1, step=2)
        file = tmp_path / "ckpt" / "zephon_state.json"
        assert zephon("inspect", str(file), "--json") == 0
        data = json.loads(capsys.readouterr().out)
        assert data["step"] == 2 and data["num_lanes"] == 4 and data["micro"] == 0
        assert data["lanes"] == state["lanes"]

    def test_same_recipe_can_resume(self, recipe_path: Path, tmp_path: Path, capsys: Any) -> None:
        saved_state(recipe_path, tmp_path / "ckpt")
        status = zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(recipe_path))
        out = capsys.readouterr().out
        assert status == 0
        assert "yes, at any dp size that divides num_lanes" in out

    def test_changed_recipe_names_the_fields(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        saved_state(recipe_path, tmp_path / "ckpt")
        other = tmp_path / "other"
        other.mkdir()
        changed = write_recipe(
            other, RECIPE.replace("seq_len = 64", "seq_len = 128").replace("seed = 7", "seed = 8")
        )
        status = zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(changed), "--json")
        resume = json.loads(capsys.readouterr().out)["resume"]
        assert status == 1
        assert resume["ok"] is False
        assert "different recipe" in resume["message"]
        assert "seq_len: checkpoint has 64, recipe has 128" in resume["diffs"]
        assert "seed: checkpoint has 7, recipe has 8" in resume["diffs"]
        assert len(resume["diffs"]) == 2

    def test_changed_data_is_named(self, recipe_path: Path, tmp_path: Path, capsys: Any) -> None:
        saved_state(recipe_path, tmp_path / "ckpt")
        with open(recipe_path.parent / "data.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"text": "one more document"}) + "\n")
        status = zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(recipe_path))
        out = capsys.readouterr().out
        assert status == 1
        assert "resume with" in out and ": no: " in out
        assert "  datasets: differs" in out

    def test_a_single_rank_state_resumes_only_its_lanes(
        self, recipe_path: Path, tmp_path: Path, capsys: Any
    ) -> None:
        pipeline = Pipeline(Recipe.from_toml(recipe_path))
        node = pipeline.rank_node(2, 1)
        for _ in range(2):
            next(node)
        save_state(tmp_path / "rank1", node.state_dict())
        status = zephon("inspect", str(tmp_path / "rank1"), "--recipe", str(recipe_path))
        out = capsys.readouterr().out
        assert status == 0
        assert "num_lanes:    4 (2 in this state)" in out
        assert "for the ranks owning lanes [2, 3]" in out

    def test_not_a_checkpoint(self, tmp_path: Path, capsys: Any) -> None:
        bad = tmp_path / "state.json"
        bad.write_bytes(b"\x80\x04K\x01.")  # a pickle
        assert zephon("inspect", str(bad)) == 2
        assert "not a zephon-nodes state" in capsys.readouterr().out
        assert zephon("inspect", str(tmp_path / "missing")) == 2
        assert "no checkpoint" in capsys.readouterr().out


def test_a_multi_rank_checkpoint_directory(recipe_path: Path, tmp_path: Path, capsys: Any) -> None:
    from zephon_nodes.state import commit_checkpoint, save_rank_state

    pipeline = Pipeline(Recipe.from_toml(recipe_path))
    ranks = [pipeline.rank_node(2, r) for r in range(2)]
    for _ in range(4):
        for node in ranks:
            next(node)
    for r, node in enumerate(ranks):
        save_rank_state(tmp_path / "ckpt", 4, r, node.state_dict())
    commit_checkpoint(tmp_path / "ckpt", 4, world_size=2)
    status = zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(recipe_path), "--json")
    data = json.loads(capsys.readouterr().out)
    assert status == 0
    assert data["step"] == 4
    assert sorted(data["lanes"]) == ["0", "1", "2", "3"]
    assert data["lanes"]["3"] == ranks[1].state_dict()["lanes"]["3"]
    assert data["resume"]["ok"] is True


def test_a_multi_dataset_recipe_resumes_from_its_own_checkpoint(
    tmp_path: Path, capsys: Any
) -> None:
    """Issue 27 case 9: the verdict is the resume's (the mixture's token estimate included)."""
    from tests.mixing.test_recipe_and_fingerprint import write_mixed

    recipe_path = write_mixed(tmp_path)
    saved_state(recipe_path, tmp_path / "ckpt", world=1, step=2)
    status = zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(recipe_path), "--json")
    resume = json.loads(capsys.readouterr().out)["resume"]
    assert (status, resume["ok"], resume["diffs"]) == (0, True, []), resume
