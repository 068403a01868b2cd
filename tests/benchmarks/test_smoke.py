"""Smoke test of the benchmark runner: tiny corpus, every suite, well-formed output.

No speed thresholds here: the numbers live in the benchmark output and docs/performance.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KEYS = (
    "zephon_tok_s",
    "grain_tok_s",
    "torchtitan_tok_s",
    "raw_tok_s",
    "ckpt_bytes_per_lane",
    "resume_s",
    "peak_rss_mb",
)


@pytest.mark.slow
def test_tiny_run_prints_tables_and_positive_json(tmp_path: Path) -> None:
    """A tiny in-process run of every suite prints Markdown tables and a positive JSON."""
    out = tmp_path / "out.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--tiny",
        "--inprocess",
        "--rounds",
        "1",
        "--seconds",
        "0.2",
        "--flush-intervals",
        "1,4",
        "--first-rounds",
        "1",
        "--peers",
        "zephon,raw",
        "--root",
        str(tmp_path / "bench"),
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for header in (
        "| pipeline |",
        "| pipeline | fresh, dp1 |",
        "| zephon variant |",
        "| flush_every |",
        "| seq_len |",
    ):
        assert header in proc.stdout, proc.stdout
    summary = json.loads(out.read_text())
    for key in KEYS:
        value = summary[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value)
    details = summary["details"]
    assert set(details["throughput"]) == {"sp", "hf"}  # both tokenizers
    for tp in details["throughput"].values():
        # TorchTitan main's loader runs only where its venv exists (make test-titan-main's).
        assert set(tp["stats"]) - {"titan_main"} == {
            "zephon",
            "grain",
            "grain_proc",
            "torchtitan",
            "nodes",
            "raw",
        }
        for stats in tp["stats"].values():
            assert stats["median"] > 0 and stats["min"] <= stats["median"] <= stats["max"]
        for peer in ("zephon", "raw"):
            firsts = tp["first"][peer]
            assert set(firsts) == {"fresh_dp1", "resumed_dp1", "fresh_dp4", "resumed_dp4"}
            assert all(v > 0 for v in firsts.values()), (peer, firsts)
    assert [r["flush_every"] for r in details["resume"]["rows"]] == [1, 4]
    for row in details["checkpoint"]["rows"]:
        assert row["total_bytes"] == row["header_bytes"] + round(
            row["bytes_per_lane"] * row["num_lanes"]
        )
    # Every zephon scaling window covers whole flush periods of every lane.
    for name, stats in details["scaling"].items():
        assert stats["flush_periods_min"] >= 2, (name, stats)
