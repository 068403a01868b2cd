"""Smoke test of benchmarks/soak.py: a few seconds of the thread runner, well-formed output.

No thresholds on speed or slopes here: the numbers live in docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_soak_samples_every_metric(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "zc")
    cmd = [sys.executable, "-m", "benchmarks.soak", "--tiny", "--minutes", "0.03"]
    cmd += ["--interval", "0.5", "--runners", "thread", "--root", str(tmp_path / "b")]
    cmd += ["--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| rss_mb |" in proc.stdout and "slope per minute" in proc.stdout
    (result,) = json.loads(out.read_text())["results"]
    assert result["runner"] == "thread" and len(result["samples"]) >= 2
    for row in result["samples"]:
        assert row["rss_mb"] > 0 and row["threads"] >= 1 and row["open_files"] >= 3
        assert row["mtok_s"] > 0 and row["shm_segments"] == 0  # threads use no /dev/shm
    minutes = [r["minute"] for r in result["samples"]]
    assert minutes == sorted(minutes)
    assert set(result["slope_per_minute"]) >= {"rss_mb", "open_files", "threads", "mtok_s"}
