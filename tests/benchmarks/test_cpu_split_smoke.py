"""Smoke test of ``benchmarks/cpu_split.py``: tiny corpus, each mode, well-formed numbers.

No speed thresholds here: the numbers live in docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# 200 steady steps: 0.23 CPU s on the tiny corpus (0.16 s wall). With 2 (about 20 ms) the
# process's CPU, read from /proc in 10 ms ticks, read 0.0 once on a quiet machine (CI run of
# 2026-12-05 00:29).
@pytest.mark.parametrize(
    "mode", [["--steps", "200", "--warmup-steps", "1"], ["--first", "--resume-after", "2"]]
)
def test_cpu_split_prints_one_consistent_json_line(tmp_path: Path, mode: list[str]) -> None:
    """Tokens were delivered; the threads measured never exceed the process's CPU."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "benchmarks.cpu_split", "--tiny", *mode]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO), check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert out["tokens"] > 0 and out["cpu_s"] > 0
    measured = out["main_thread_cpu_s"] + out.get("parse_cpu_s", 0) + out.get("tokenize_cpu_s", 0)
    assert measured <= out["cpu_s"] + 0.05  # clock ticks of /proc round to 10 ms
    assert out["mode"].startswith("first" if "--first" in mode else "steady")
