"""The CPU/GPU launcher refuses a relative checkpoint path at once (TorchTitan does, ~45 s in)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_nodes.integrations.torchtitan.train import check_paths

REPO = Path(__file__).parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["--checkpoint.initial-load-path", "work/runs/dp2/checkpoint/step-3"],
        ["--checkpoint.initial_load_path=runs/step-3"],
    ],
)
def test_relative_path_refused(argv: list[str]) -> None:
    problem = check_paths(["--training.steps", "6", *argv])
    assert problem is not None
    assert "relative path" in problem and '"$PWD/' in problem


def test_absolute_path_accepted() -> None:
    assert check_paths(["--checkpoint.initial-load-path", "/data/runs/step-3"]) is None
    assert check_paths(["--training.steps", "6"]) is None


def _launch(tmp_path: Path, *python_flags: str) -> subprocess.CompletedProcess[str]:
    """The launcher as torchrun starts it, with a relative checkpoint path."""
    return subprocess.run(
        [
            sys.executable,
            *python_flags,
            "-m",
            "zephon_nodes.integrations.torchtitan.train",
            "--checkpoint.initial-load-path",
            "runs/step-3",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launcher_exits_2_in_one_line(tmp_path: Path) -> None:
    proc = _launch(tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "relative path" in lines[0], proc.stderr


def test_launcher_refuses_before_importing_torch(tmp_path: Path) -> None:
    """The check runs before torch is imported (torch alone takes seconds to import)."""
    proc = _launch(tmp_path, "-X", "importtime")
    assert proc.returncode == 2
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert "zephon_nodes.integrations" in imported  # the launcher ran (as __main__)
    assert "torch" not in imported
