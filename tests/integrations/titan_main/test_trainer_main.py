"""TorchTitan main's real Trainer on CPU: dp 2, checkpoint, resume on dp 1 and dp 4 (bounded).

``examples/torchtitan/run.py`` (the walk-through, which picks main's size options) trains
TorchTitan's own llama3 debug-model job, switched to the recipe by ``--override.imports``,
on 2 ranks for 4 steps with a checkpoint at step 2, resumes on 1 rank (4 micro-batches of 2
packed samples per optimizer step) and on 4 ranks (1), and compares every dumped batch
with ``zephon digest`` (run as the CLI). This test checks the summary itself. Measured
(load 11-18 on the 2 cores): losses of the resumed steps within 1e-5 relative of the
uninterrupted run's; the test allows 1e-4 (gradient sums add in another order at dp 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "torchtitan.components.data.loader",
    reason="needs TorchTitan main (the .venv-titan-main of `make test-titan-main`)",
)
pytest.importorskip("triton", reason="torchtitan.trainer imports triton")

pytestmark = [pytest.mark.titan_main, pytest.mark.slow]

REPO = Path(__file__).parents[3]
STEPS, SAVE_AT = 4, 2
LOSS_RTOL = 1e-4


def test_dp2_checkpoint_resumes_on_dp1_and_dp4(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    summary = tmp_path / "summary.json"
    cmd = [
        sys.executable, str(REPO / "examples" / "torchtitan" / "run.py"), str(tmp_path / "w"),
        "--steps", str(STEPS), "--save-at", str(SAVE_AT), "--resume-on", "1,4",
        "--json", str(summary),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    got = json.loads(summary.read_text())
    expected = {int(k): v for k, v in got["expected"].items()}
    jobs = got["jobs"]
    assert sorted(jobs) == ["dp1", "dp2", "dp4"]
    dp2 = {int(k): v for k, v in jobs["dp2"]["digests"].items()}
    assert dp2 == {t: expected[t] for t in range(1, STEPS + 1)}
    base = {int(k): v for k, v in jobs["dp2"]["losses"].items()}
    for name in ("dp1", "dp4"):
        digests = {int(k): v for k, v in jobs[name]["digests"].items()}
        assert digests == {t: expected[t] for t in range(SAVE_AT + 1, STEPS + 1)}, name
        resumed = {int(k): v for k, v in jobs[name]["losses"].items()}
        assert sorted(resumed) == list(range(SAVE_AT + 1, STEPS + 1)), name
        for t, loss in resumed.items():
            assert loss == pytest.approx(base[t], rel=LOSS_RTOL), (name, t, loss, base[t])
    # TorchTitan's log of each job: one line per rank at the checkpoint and at the restore.
    logs = {n: (tmp_path / "w" / "logs" / f"{n}.txt").read_text() for n in ("dp2", "dp1", "dp4")}
    check_log_lines(logs)


def check_log_lines(logs: dict[str, str]) -> None:
    """One ``zephon checkpoint`` line per rank of the dp 2 job at step SAVE_AT, one
    ``zephon restore`` line per rank of each resumed job."""
    for rank in (0, 1):
        line = f"zephon checkpoint: rank {rank} saved the state of step {SAVE_AT} at dp 2 "
        assert logs["dp2"].count(line) == 1, (rank, logs["dp2"][-2000:])
    for name, world in (("dp1", 1), ("dp4", 4)):
        for rank in range(world):
            line = (
                f"zephon restore: rank {rank} restored the state of step {SAVE_AT} saved at "
                f"dp 2, now at dp {world} "
            )
            assert logs[name].count(line) == 1, (name, rank, logs[name][-2000:])
