"""Smoke test of benchmarks/end_of_data.py: the start-up part, tiny, well-formed JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.end_of_data import main


def test_startup_numbers_are_written(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["--skip-demo", "--items", "50", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["startup"]
    assert row["items"] == 50 and row["records"] == 200 and row["measure"] == "tokens"
    assert all(row[k] >= 0 for k in ("round_robin_s", "auto_s", "deal_s"))
