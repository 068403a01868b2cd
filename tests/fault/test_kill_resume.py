"""SIGKILL a torchrun job again and again (seeded), resume each time at a random dp size and
worker count: the trained steps' global batch digests equal an uninterrupted run's.

CI kills the job 8 times; ``ZEPHON_FULL_SCENARIOS=1`` (``make test-long``) 20 times, as does
the driver itself (``python tests/fault/killresume.py --kills 20 --seed 0``). Eight is the
smallest session that still reaches the four fault phases inside a checkpoint with room
for other kills (the driver puts the last kills inside a checkpoint while a phase is
missing); the resume and dp-change bounds are the 20-kill session's, scaled by 8 / 20.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fault.killresume import kill_and_resume, make_corpus, reference_digests
from zephon_nodes import Pipeline, Recipe, simulate

FULL = os.environ.get("ZEPHON_FULL_SCENARIOS") == "1"
KILLS = 20 if FULL else 8


@pytest.mark.slow
def test_kill_and_resume_many_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    steps, every = 60, 3
    recipe = make_corpus(tmp_path / "data", seed=0)
    ref = reference_digests(recipe, tmp_path / "reference", steps, every)
    # The uninterrupted torchrun run (dp 2) equals the in-process simulation at dp 1.
    sim = [r.digest for r, _ in simulate(Pipeline(Recipe.from_toml(recipe)), 1, steps)]
    assert [ref[t] for t in range(1, steps + 1)] == sim
    report = kill_and_resume(
        recipe, tmp_path / "killed", ref, kills=KILLS, seed=0, steps=steps, ckpt_every=every
    )
    print("\n" + report.kill_log() + "\n" + report.summary())
    # Every planned kill lands (the ranks wait for it just past its point, and a kill that
    # never comes fails the session), so the count does not depend on the machine's speed.
    assert report.kills == KILLS, report.summary()
    assert report.steps_verified == steps
    assert report.dp_changes >= KILLS // 4, report.summary()  # 5 of 20, 2 of 8
    assert report.resumes >= KILLS // 2, report.summary()  # 10 of 20, 4 of 8
    phases = {k for k in report.kill_plans if k.startswith("fault:")}
    assert phases == {
        "fault:before_rename",
        "fault:after_rank_save",
        "fault:before_commit",
        "fault:after_commit",
    }, report.summary()
