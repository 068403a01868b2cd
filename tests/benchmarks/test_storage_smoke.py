"""Smoke test of benchmarks/storage.py: a quick run prints well-formed JSON.

No thresholds on the numbers here: they live in the benchmark output and the docs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.storage import main


def test_quick_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both parts run and report every field, with positive times and rates."""
    out = tmp_path / "storage.json"
    assert main(["--quick", "--root", str(tmp_path / "b"), "--json", str(out)]) == 0
    assert "| S3 / local throughput |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    shards = result["startup"]["shards"]
    assert set(shards) == {"20", "60"}
    for row in shards.values():
        assert all(v is not None and v > 0 for v in row.values()), row
    assert result["startup"]["ratio_60_over_20"] > 0
    rates = result["throughput"]["tokens_per_s"]
    assert rates["local"] > 0 and rates["s3"] > 0
    assert result["throughput"]["s3_over_local"] == pytest.approx(
        rates["s3"] / rates["local"], rel=0.01
    )
