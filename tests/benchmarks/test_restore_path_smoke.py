"""Smoke test of ``benchmarks/restore_path.py``: the four kinds of state, counted.

No file-count threshold here (the count is reported in the closing notes and issue 32);
what is checked is that the count sees the restore at all and tells it from a fresh start.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.restore_path import measure


def test_each_kind_of_state_is_counted(tmp_path: Path) -> None:
    rows = {r["kind"]: r for r in measure(tmp_path)}
    assert list(rows) == ["plain", "staged", "amended", "relaned"]
    for row in rows.values():
        files = set(row["files"])
        assert "zephon_nodes/engine/multiplexer.py" in files  # the node itself was seen
        assert set(row["restore"]) <= files and row["all"] == len(files)
        # a restore checks the state and replays: neither happens on a fresh start
        assert {"zephon_nodes/engine/restore_checks.py", "zephon_nodes/state/validate.py"} <= set(
            row["restore"]
        )
    # a state after a recipe change is read through its stage section; a plain one is not
    assert "zephon_nodes/state/stage.py" in rows["staged"]["restore"]
    assert "zephon_nodes/state/stage.py" not in rows["plain"]["files"]
    assert "zephon_nodes/engine/relane/sources.py" in rows["relaned"]["restore"]
    # the lanes replay on restore threads (engine/parallel_map.run_together): counted too
    assert "zephon_nodes/engine/windowed.py" in rows["plain"]["files"]
    # a call back up: the replay check, run by parallel_map for the node, which imports it
    assert "engine.parallel_map -> engine.replay_check" in rows["plain"]["climbs"]
    assert all(" -> " in c for row in rows.values() for c in row["climbs"])
