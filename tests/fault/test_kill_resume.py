"""SIGKILL a torchrun job 20 times (seeded), resume each time at a random dp size and worker
count: the trained steps' global batch digests equal an uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.killresume import kill_and_resume, make_corpus, reference_digests
from zephon_nodes import Pipeline, Recipe, simulate


@pytest.mark.slow
def test_kill_and_resume_twenty_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "cache"))
    steps, every = 60, 3
    recipe = make_corpus(tmp_path / "data", seed=0)
    ref = reference_digests(recipe, tmp_path / "reference", steps, every)
    # The uninterrupted torchrun run (dp 2) equals the in-process simulation at dp 1.
    sim = [r.digest for r, _ in simulate(Pipeline(Recipe.from_toml(recipe)), 1, steps)]
    assert [ref[t] for t in range(1, steps + 1)] == sim
    report = kill_and_resume(
        recipe, tmp_path / "killed", ref, kills=20, seed=0, steps=steps, ckpt_every=every
    )
    print("\n" + report.kill_log() + "\n" + report.summary())
    # Every planned kill lands (the ranks wait for it just past its point, and a kill that
    # never comes fails the session), so the count does not depend on the machine's speed.
    assert report.kills == 20, report.summary()
    assert report.steps_verified == steps
    assert report.dp_changes >= 5
    assert report.resumes >= 10
    phases = {k for k in report.kill_plans if k.startswith("fault:")}
    assert phases == {
        "fault:before_rename",
        "fault:after_rank_save",
        "fault:before_commit",
        "fault:after_commit",
    }
