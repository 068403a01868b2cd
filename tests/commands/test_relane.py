"""``zephon relane``: re-lane a checkpoint, resume it at any dp size; lineage in inspect/lanes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.commands.conftest import RECIPE, write_recipe
from tests.commands.run import zephon
from zephon_nodes import cli


def _digests(capsys: Any, *argv: str) -> list[str]:
    capsys.readouterr()
    assert zephon("digest", *argv) == 0
    return [json.loads(line)["digest"] for line in capsys.readouterr().out.splitlines()]


@pytest.fixture
def relaned(tmp_path: Path, capsys: Any) -> dict[str, Path]:
    """A 4-lane checkpoint after step 3 (dp 2) re-laned to 6 lanes, and both recipes."""
    text = RECIPE.replace("global_batch_size = 8", "global_batch_size = 12")
    recipe = write_recipe(tmp_path, text)
    six = tmp_path / "recipe6.toml"
    six.write_text(text.replace("num_lanes = 4", "num_lanes = 6"), encoding="utf-8")
    ck = tmp_path / "ck"
    assert zephon("digest", str(recipe), "--steps", "3", "--dp-world-size", "2",
                  "--save-at", "3", "--checkpoint-dir", str(ck)) == 0  # fmt: skip
    out = tmp_path / "ck6"
    capsys.readouterr()
    assert zephon("relane", str(recipe), str(ck), "--num-lanes", "6", "--output", str(out)) == 0
    printed = capsys.readouterr().out
    assert "re-laned the checkpoint of step 3 from 4 to 6 lanes" in printed
    args = ["relane", str(recipe), str(ck), "--num-lanes", "6", "--output", str(out), "--json"]
    assert zephon(*args) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["step"], data["from_lanes"], data["num_lanes"], data["relanes"]) == (3, 4, 6, 1)
    return {"recipe": recipe, "six": six, "ck": ck, "out": out}


def test_relaned_checkpoint_resumes_identically_at_every_dp(
    relaned: dict[str, Path], capsys: Any
) -> None:
    six, out = str(relaned["six"]), str(relaned["out"])
    runs = {
        dp: _digests(capsys, six, "--steps", "4", "--resume-from", out, "--dp-world-size", str(dp))
        for dp in (1, 2, 3, 6)
    }
    assert len(runs[1]) == 4
    assert all(r == runs[1] for r in runs.values())
    # A restart after the re-lane, at another dp size, continues the same batches.
    mid = str(relaned["ck"].parent / "mid")
    first = _digests(capsys, six, "--steps", "2", "--resume-from", out, "--dp-world-size", "3",
                     "--save-at", "5", "--checkpoint-dir", mid)  # fmt: skip
    assert first == runs[1][:2]
    rest = _digests(capsys, six, "--steps", "2", "--resume-from", mid, "--dp-world-size", "2")
    assert rest == runs[1][2:]
    # Re-laning twice (6 -> 3, the recipe at either lane count) also resumes.
    three = relaned["ck"].parent / "recipe3.toml"
    three.write_text(six_text(relaned).replace("num_lanes = 6", "num_lanes = 3"), "utf-8")
    assert zephon("relane", six, mid, "--num-lanes", "3", "--output", mid + "3") == 0
    again = [
        _digests(
            capsys, str(three), "--steps", "2", "--resume-from", mid + "3", "--dp-world-size", d
        )
        for d in ("1", "3")
    ]
    assert again[0] == again[1] and len(again[0]) == 2


def six_text(relaned: dict[str, Path]) -> str:
    return relaned["six"].read_text(encoding="utf-8")


def test_refusals_are_one_line_with_exit_2(
    relaned: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    recipe, ck, out = str(relaned["recipe"]), str(relaned["ck"]), str(relaned["out"])
    capsys.readouterr()
    # The new lane count must divide the global batch.
    bad = str(tmp_path / "x")
    assert cli.main(["relane", recipe, ck, "--num-lanes", "5", "--output", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "num_lanes=5: global_batch_size=12 must be a multiple of it" in err
    # A recipe changed in anything but num_lanes is refused, naming the field.
    changed = tmp_path / "changed.toml"
    changed.write_text(six_text(relaned).replace("seq_len = 64", "seq_len = 32"), "utf-8")
    assert cli.main(["relane", str(changed), ck, "--num-lanes", "6", "--output", out + "b"]) == 2
    assert "seq_len: checkpoint has 64, recipe has 32" in capsys.readouterr().err
    assert cli.main(["digest", str(changed), "--steps", "1", "--resume-from", out]) == 2
    assert "seq_len: checkpoint has 64, recipe has 32" in capsys.readouterr().err
    # Resuming the re-laned checkpoint with the old lane count names num_lanes.
    assert cli.main(["digest", recipe, "--steps", "1", "--resume-from", out]) == 2
    assert "num_lanes: checkpoint has 6, recipe has 4" in capsys.readouterr().err


def test_inspect_and_lanes_show_the_lineage(relaned: dict[str, Path], capsys: Any) -> None:
    out = str(relaned["out"])
    capsys.readouterr()
    assert zephon("inspect", out) == 0
    text = capsys.readouterr().out
    assert "lineage:      re-laned after step 3 from 4 lanes" in text
    assert "num_lanes:    6 (6 in this state)" in text
    assert zephon("inspect", out, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lineage"]["num_lanes"] == 4 and data["lineage"]["step"] == 3
    assert len(data["lineage"]["lanes"]) == 4
    assert zephon("inspect", out, "--recipe", str(relaned["six"])) == 0
    assert "yes, at any dp size" in capsys.readouterr().out
    assert zephon("lanes", "--checkpoint", out) == 0
    text = capsys.readouterr().out
    assert "num_lanes=6 at step 3" in text and "re-laned after step 3 from 4 lanes" in text
    # With --dp, the lane counts the checkpoint can be re-laned to (G = 12 from it).
    assert zephon("lanes", "--checkpoint", str(relaned["ck"]), "--dp", "3", "--json") == 0
    options = json.loads(capsys.readouterr().out)
    assert [o["num_lanes"] for o in options] == [3, 6, 12]
    assert zephon("lanes", "--checkpoint", str(relaned["ck"])) == 0
    assert "(never re-laned)" in capsys.readouterr().out


def test_relane_warns_about_lanes_without_untouched_items(
    relaned: dict[str, Path], tmp_path: Path, capsys: Any
) -> None:
    """Late in finite data, more new lanes than untouched items: said on stderr and in --json."""
    recipe = str(relaned["recipe"])
    # The fixture's early re-lane (step 3, 4 -> 6 lanes) leaves every new lane some work.
    capsys.readouterr()
    args = ["--num-lanes", "6", "--output", str(tmp_path / "early"), "--json"]
    assert zephon("relane", recipe, str(relaned["ck"]), *args) == 0
    early = capsys.readouterr()
    assert "warning" not in early.err
    assert "lanes_without_untouched_items" not in json.loads(early.out)
    # After step 12 of this recipe few work items remain untouched: 12 lanes are too many.
    late = tmp_path / "late"
    assert zephon("digest", recipe, "--steps", "12", "--save-at", "12",
                  "--checkpoint-dir", str(late)) == 0  # fmt: skip
    capsys.readouterr()
    args = ["--num-lanes", "12", "--output", str(tmp_path / "o12"), "--json"]
    assert zephon("relane", recipe, str(late), *args) == 0
    got = capsys.readouterr()
    starved = json.loads(got.out)["lanes_without_untouched_items"]
    assert starved and all(0 <= lane < 12 for lane in starved)
    assert f"warning: {len(starved)} of 12 new lanes get no untouched work item" in got.err
    assert "the other lanes' samples go unused" in got.err
    # At the last step every work item was touched: every new lane is starved, and the
    # warning does not speak of other lanes.
    last = tmp_path / "last"
    assert zephon("digest", recipe, "--steps", "38", "--save-at", "38",
                  "--checkpoint-dir", str(last)) == 0  # fmt: skip
    capsys.readouterr()
    args = ["--num-lanes", "2", "--output", str(tmp_path / "o2"), "--json"]
    assert zephon("relane", recipe, str(last), *args) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["lanes_without_untouched_items"] == [0, 1]
    assert "warning: 2 of 2 new lanes get no untouched work item" in got.err
    assert "other lanes" not in got.err
