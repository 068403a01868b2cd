"""Smoke test of benchmarks/multimodal.py: it runs and prints its tables (no speed checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_run_prints_tables(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["ZEPHON_BENCH_DIR"] = str(tmp_path / "bench")
    env["ZEPHON_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "benchmarks.multimodal", "--tiny", "--no-grain"]
    cmd += ["--only", "thread,process,mixed"]
    out = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "| zephon-nodes thread x2 |" in out
    assert "| zephon-nodes process x2 (shared memory) |" in out
    assert "| zephon-nodes decode=process:2, rest inline |" in out
    decode = next(line for line in out.splitlines() if line.startswith("| decode |"))
    assert float(decode.split("|")[3].strip().rstrip("%")) > 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Decode limit: 2 workers"))
    assert float(lines[at].split(" = ")[1].split()[0].replace(",", "")) > 0
    row = next(line for line in lines[at:] if line.startswith("| zephon-nodes thread x2 |"))
    assert float(row.split("|")[3]) > 0  # CPU ms per image
