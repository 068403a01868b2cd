"""The ``zephon digest`` and ``zephon demo`` command lines, run as users run them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.commands.run import zephon_process
from tests.core.test_bad_input import lines

RECIPE = """
seed = 7
num_lanes = 4
global_batch_size = 8
seq_len = 16
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "web"
paths = ["data/*.jsonl"]
[work]
chunk_size = 3
epochs = 1
[shuffle]
buffer_size = 4
"""


def zephon(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return zephon_process(*args, check=check)


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(lines(60))
    (tmp_path / "data" / "b.jsonl").write_bytes(lines(60, 60))
    (tmp_path / "r.toml").write_text(RECIPE)
    return tmp_path / "r.toml"


def parse(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_digest_lines_agree_across_dp_and_resume(recipe, tmp_path):
    """One JSON line per step; dp 1 == dp 4; save at 3 on dp 2, resume on dp 4 continues."""
    ref = parse(zephon("digest", str(recipe), "--dp-world-size", "1", "--steps", "8").stdout)
    assert [r["step"] for r in ref] == list(range(1, 9))
    assert all(len(r["digest"]) == 64 for r in ref)
    dp4 = zephon(
        "digest", str(recipe), "--dp-world-size", "4", "--steps", "8", "--num-workers", "1"
    )
    assert parse(dp4.stdout) == ref
    ckpt = tmp_path / "ckpt"
    first = zephon(
        "digest",
        str(recipe),
        "--dp-world-size",
        "2",
        "--steps",
        "5",
        "--save-at",
        "3",
        "--checkpoint-dir",
        str(ckpt),
    )
    assert parse(first.stdout) == ref[:5]
    state = json.loads((ckpt / "zephon_state.json").read_text())
    assert state["step"] == 3 and len(state["lanes"]) == 4
    resumed = zephon(
        "digest", str(recipe), "--dp-world-size", "4", "--steps", "5", "--resume-from", str(ckpt)
    )
    assert parse(resumed.stdout) == ref[3:8]


def test_finite_recipe_stops_early_and_says_so(recipe):
    """Asking for more steps than the data holds stops after the last full global batch."""
    out = zephon("digest", str(recipe), "--steps", "100000")
    steps = parse(out.stdout)
    assert 0 < len(steps) < 100000
    assert f"data ended after step {len(steps)}" in out.stderr


def test_errors_go_to_stderr_with_nonzero_exit(tmp_path):
    (tmp_path / "r.toml").write_text(RECIPE)
    out = zephon("digest", str(tmp_path / "r.toml"), "--steps", "1", check=False)
    assert out.returncode != 0
    assert "matches no file" in out.stderr
    assert out.stdout == ""


def test_bad_layout_is_refused(recipe):
    out = zephon("digest", str(recipe), "--steps", "1", "--dp-world-size", "3", check=False)
    assert out.returncode != 0
    assert "num_lanes=4 must be a multiple of dp_world_size=3" in out.stderr


@pytest.mark.slow
def test_demo_shows_identical_batches(tmp_path):
    """The bundled demo builds its corpus offline and reports identical digests."""
    out = zephon("demo", "--steps", "11", "--save-at", "10")
    assert "all 11 global batches identical" in out.stdout
    assert "naive rank-sharded loader: its global batches change" in out.stdout
    assert out.stdout.count("identical") >= 9
    # Every row of the table is aligned with its header (the resume rows once were not).
    rows = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 11
    assert len({len(line) for line in rows}) == 1
    assert [line.index("|", 1) for line in rows] == [rows[0].index("|", 1)] * len(rows)
    assert sum(line.split("|")[2].strip() == "11-11" for line in rows) == 2
