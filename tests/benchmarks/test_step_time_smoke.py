"""Smoke tests of the step-time benchmarks (issue 33.5): they run and report; no timing is
asserted (the numbers live in docs/performance.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "cache")
    return env


@pytest.mark.slow
def test_step_time_smoke_reports_every_loader(tmp_path: Path) -> None:
    """--smoke runs the step alone and beside three loaders, and times both engines' resume
    at dp 1 and 4: every figure present and finite."""
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "benchmarks.step_time", "--smoke", "--root",
           str(tmp_path / "bench"), "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| zephon_process |" in proc.stdout
    result = json.loads(out.read_text())
    configs = result["summary"]["configs"]
    assert set(configs) == {"alone", "zephon_thread", "zephon_process", "nodes"}
    for name, row in configs.items():
        assert "error" not in row, (name, row)
        assert row["step_median_ms"] > 0 and row["tok_s"] > 0
        assert math.isfinite(row["step_inflation_median_pct"])
        if name != "alone":
            assert row["loader_cpu_s_per_1k_tok"] >= 0
    resume = result["resume_first_batch_s"]
    assert len(resume) == 4 and all(v > 0 for v in resume.values())
    assert result["meta"]["loadavg"]


def test_gpu_step_parses_help_on_cpu(tmp_path: Path) -> None:
    """The GPU script imports and parses --help without a GPU."""
    from benchmarks import gpu_step

    args = gpu_step.parse_args(["--steps", "3", "--peers", "alone"])
    assert args.steps == 3 and args.peers == "alone"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_step", "--help"],
        cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--peers" in proc.stdout and "debug model" in proc.stdout
