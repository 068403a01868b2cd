"""The TorchTitan walk-through (examples/torchtitan) in its CPU form, end to end.

``run.py`` makes the assets, trains TorchTitan's real Trainer (llama3 debug model) on 2 ranks
with a checkpoint at step 2, resumes it on 1 and 4 ranks, and compares what each job dumped
(``--dataloader.dump-batches``) with ``zephon digest``. This test checks the summary itself
rather than trusting the script's verdict.

CI runs 4 steps with the checkpoint at step 2 (two steps after the resume, each Trainer step
costs seconds on a CPU); ``ZEPHON_FULL_SCENARIOS=1`` (``make test-long``) runs the script's
defaults, 6 steps with the checkpoint at step 3 (docs/torchtitan.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
STEPS, SAVE_AT = (6, 3) if os.environ.get("ZEPHON_FULL_SCENARIOS") == "1" else (4, 2)
LOSS_RTOL = 1e-4


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    work = tmp_path_factory.mktemp("walk")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, str(REPO / "examples" / "torchtitan" / "run.py"), str(work / "w"),
        "--steps", str(STEPS), "--save-at", str(SAVE_AT), "--json", str(work / "summary.json"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return work / "w", json.loads((work / "summary.json").read_text()), out


def test_every_job_trained_on_the_digested_batches(walk: Any) -> None:
    """dp 2 steps 1..STEPS and the dp 1 / dp 4 resumes (after SAVE_AT) equal ``zephon digest``."""
    _, summary, out = walk
    expected = {int(k): v for k, v in summary["expected"].items()}
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert len(set(expected.values())) == STEPS  # all different batches
    want = {"dp2": range(1, STEPS + 1), "dp1": range(SAVE_AT + 1, STEPS + 1)}
    want["dp4"] = want["dp1"]
    for name, steps in want.items():
        got = {int(k): v for k, v in summary["jobs"][name]["digests"].items()}
        assert sorted(got) == list(steps), name
        for t in steps:
            assert got[t] == expected[t], f"{name} step {t}"
    assert "every job trained on the batches zephon digest names" in out


def test_resumed_losses_continue_the_run(walk: Any) -> None:
    """The resumed jobs' losses match the uninterrupted dp 2 run (floating point aside)."""
    _, summary, _ = walk
    losses = {k: {int(s): v for s, v in j["losses"].items()} for k, j in summary["jobs"].items()}
    assert sorted(losses["dp2"]) == list(range(1, STEPS + 1))
    for name in ("dp1", "dp4"):
        assert sorted(losses[name]) == list(range(SAVE_AT + 1, STEPS + 1)), name
        for t in losses[name]:
            a, b = losses["dp2"][t], losses[name][t]
            assert abs(a - b) <= LOSS_RTOL * abs(a), f"{name} step {t}: {b} vs {a}"


def test_each_rank_dumped_its_own_rows(walk: Any) -> None:
    """One file per step and rank, and the rank files of a step hold disjoint lanes."""
    import numpy as np

    work, _, _ = walk
    for name, world, first in (("dp2", 2, 1), ("dp1", 1, SAVE_AT + 1), ("dp4", 4, SAVE_AT + 1)):
        files = sorted((work / "batches" / name).glob("step-*.npz"))
        assert len(files) == world * (STEPS - first + 1), (name, [f.name for f in files])
        step = f"step-{first:08d}"
        lanes = [set(np.load(f)["lane"].tolist()) for f in files if f.name.startswith(step)]
        assert len(lanes) == world
        assert set().union(*lanes) == {0, 1, 2, 3}
        assert sum(len(s) for s in lanes) == 4


def test_trainer_logs_loader_metrics(walk: Any) -> None:
    """The Trainer's TensorBoard events hold the loader's metrics (zephon/...) at every step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work, _, _ = walk
    (events,) = (work / "runs" / "dp2").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    scalars = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}
    steps = list(range(1, STEPS + 1))

    def values(tag: str) -> list[float]:
        assert [e.step for e in scalars[tag]] == steps, tag
        return [e.value for e in scalars[tag]]

    assert values("zephon/step") == steps
    assert values("zephon/samples") == [4.0] * STEPS  # rank 0's share: G / dp = 8 / 2
    assert values("zephon/samples_total") == [4.0 * t for t in steps]
    assert all(0 < v <= 4 * 64 for v in values("zephon/tokens"))
    assert all(0 <= v < 1 for v in values("zephon/padding_fraction"))
    assert all(v >= 0 for v in values("zephon/data_wait_s"))
    assert values("zephon/data_wait_s_total")[-1] > 0
    busy = values("zephon/operators/tokenize/busy_s")
    assert busy[-1] > 0 and busy == sorted(busy)  # cumulative
    assert all(v >= 0 for v in values("zephon/queue_depth"))


def test_each_rank_logs_its_checkpoint_and_restore(walk: Any) -> None:
    """TorchTitan's log of each job holds one line per rank at the checkpoint and the restore."""
    work, _, _ = walk
    logs = {name: (work / "logs" / f"{name}.txt").read_text() for name in ("dp2", "dp1", "dp4")}
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


def test_run_refuses_a_used_working_folder(tmp_path: Path) -> None:
    """A folder with runs/ from an earlier walk-through is refused before any job: TorchTitan
    would resume the old checkpoints there and the old batch dumps would be compared."""
    (tmp_path / "w" / "runs" / "dp2").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "torchtitan" / "run.py"), str(tmp_path / "w")],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds runs/" in lines[0], proc.stderr
    assert not (tmp_path / "w" / "recipe.toml").exists()  # nothing was made
