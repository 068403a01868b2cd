"""The worked controller of ``examples/curriculum`` on TorchTitan's real Trainer (bounded).

``run.py`` trains the llama3 debug model with ``CurriculumTrainer`` (TorchTitan's Trainer +
an exponentiated-gradient controller deciding after every step here) on 2 ranks with a
checkpoint at step 2, resumes it on other dp sizes, and writes a summary. The tests check
the summary's raw data (digests, journals, losses) and the dumped batches, not the script's
verdict.

CI resumes on 1 rank only (``--resume-on 1``: the resume at another dp size with the
controller's state, at the cost of one process; the per-domain all-reduce across ranks is
checked on the dp 2 job, and the resume on 4 ranks of the same Trainer and loader by
``test_torchtitan_walkthrough.py``). ``ZEPHON_FULL_SCENARIOS=1`` (``make test-long``)
resumes on 1 and on 4 ranks. The full run (40 steps, checkpoint at 20) is the example itself
(docs/mixing.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples.curriculum.controller import ExpGradController, domain_sums

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[2]
STEPS, SAVE_AT = 4, 2
RESUMED = ("dp1", "dp4") if os.environ.get("ZEPHON_FULL_SCENARIOS") == "1" else ("dp1",)
LOSS_RTOL = 1e-4
DOMAINS = ["stdlib", "repeat", "noise"]


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    work = tmp_path_factory.mktemp("curriculum")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, str(REPO / "examples" / "curriculum" / "run.py"), str(work / "w"),
        "--steps", str(STEPS), "--save-at", str(SAVE_AT), "--every", "1",
        "--resume-on", ",".join(name[2:] for name in RESUMED),
        "--json", str(work / "summary.json"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return work / "w", json.loads((work / "summary.json").read_text())


def decisions(journal: list[dict[str, Any]]) -> list[tuple[int, list[float]]]:
    return [(r["step"], r["decision"]) for r in journal if r["decision"] is not None]


def test_batches_equal_the_digest_of_the_decided_mixture(walk: Any) -> None:
    """Every job's batches (dp 2 steps 1-4, the resumed jobs steps 3-4) equal ``zephon
    digest`` with the dp 2 job's decisions, and the decisions did change the batches."""
    _, summary = walk
    expected = {int(k): v for k, v in summary["expected"].items()}
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert sorted(summary["journal"]) == sorted(["dp2", *RESUMED])
    want = {"dp2": range(1, STEPS + 1)}
    want.update({name: range(SAVE_AT + 1, STEPS + 1) for name in RESUMED})
    for name, steps in want.items():
        got = {int(k): v for k, v in summary[name]["digests"].items()}
        assert sorted(got) == list(steps), name
        assert all(got[t] == expected[t] for t in steps), name
    assert summary["batches_moved_by_decisions"] >= 1  # not the static mixture's batches


def test_decision_logs_are_equal_after_the_resume(walk: Any) -> None:
    """Decisions after steps 1 and 2 (before/at the checkpoint) and 3, 4 (after it)."""
    _, summary = walk
    base = decisions(summary["journal"]["dp2"])
    assert [s for s, _ in base] == [1, 2, 3, 4]
    for _, w in base:
        assert abs(sum(w) - 1) < 1e-12 and all(x > 0 for x in w)
    assert len({tuple(w) for _, w in base}) == 4  # every decision moved the weights
    assert [e["step"] for e in summary["log"]] == [1, 2, 3, 4]
    for name in RESUMED:
        assert decisions(summary["journal"][name]) == base[SAVE_AT:], name
        # The weights in force at the first resumed step are the checkpoint's last decision.
        assert summary["journal"][name][0]["weights"] == base[SAVE_AT - 1][1], name


def test_resumed_losses_continue_the_run(walk: Any) -> None:
    _, summary = walk
    base = summary["dp2_losses"]
    for name in RESUMED:
        got = summary[name]["losses"]
        assert len(got) == STEPS - SAVE_AT, name
        for t, b in zip(range(SAVE_AT + 1, STEPS + 1), got, strict=True):
            a = base[t - 1]
            assert abs(a - b) <= LOSS_RTOL * abs(a), f"{name} step {t}: {b} vs {a}"


def test_per_domain_tokens_are_the_all_reduced_dataset_ids(walk: Any) -> None:
    """The journal's per-domain token counts equal the ``dataset_ids`` in the dumped rows of
    all ranks together (so the all-reduce summed every rank's tokens exactly once)."""
    work, summary = walk
    for name in ("dp2", *RESUMED):
        for r in summary["journal"][name]:
            files = sorted((work / "batches" / name).glob(f"step-{r['step']:08d}.rank-*.npz"))
            ids = np.concatenate([np.load(f)["dataset_ids"].ravel() for f in files])
            assert ids.size == 8 * 64, (name, r["step"])
            counts = [int((ids == k).sum()) for k in range(len(DOMAINS))]
            assert r["tokens"] == counts, (name, r["step"])
            for loss, n in zip(r["loss"], counts, strict=True):
                assert (loss is None) == (n == 0)
                assert loss is None or 0 < loss < 20


def test_plot(walk: Any, tmp_path: Path) -> None:
    work, _ = walk
    summary = work.parent / "summary.json"
    out = tmp_path / "plot.png"
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "curriculum" / "plot.py"), str(summary), str(out)],
        check=True,
        timeout=120,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exponentiated_gradient_rule() -> None:
    c = ExpGradController(["a", "b"], eta=1.0, smoothing=0.0, quantum=0.0)
    d = c.update({"a": 0.5, "b": 0.5}, [2.0, 1.0])  # a is 0.5 above the mean, b 0.5 below
    assert abs(d.weights["a"] / d.weights["b"] - 2.718281828459045) < 1e-9
    c = ExpGradController(["a", "b"], eta=1.0, smoothing=0.5, quantum=0.0)
    assert c.update({"a": 1, "b": 1}, [1.0, 1.0]).weights == {"a": 0.5, "b": 0.5}
    # A domain without tokens (NaN) counts as the mean: only the others move it.
    c = ExpGradController(["a", "b", "c"], eta=1.0, smoothing=0.0, quantum=0.0)
    d = c.update({"a": 1, "b": 1, "c": 1}, [1.0, math.nan, 1.0])
    assert all(abs(w - 1 / 3) < 1e-12 for w in d.weights.values())


def test_rounding_and_margin() -> None:
    """Weights are rounded to the quantum; the margin is the distance to a boundary."""
    c = ExpGradController(["a", "b"], eta=1.0, smoothing=0.0, quantum=0.01)
    d = c.update({"a": 0.5, "b": 0.5}, [2.0, 1.0])  # raw a = e/(1+e) = 0.731058...
    assert d.weights == {"a": 0.73, "b": 0.27}
    assert abs(d.raw["a"] - 0.7310585786300049) < 1e-12
    assert abs(d.margin - (0.5 - 0.10585786300049)) < 1e-9


def test_domain_sums() -> None:
    import torch

    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    ids = torch.tensor([[0, 1, -1], [1, 1, 0]])
    got = domain_sums(loss, ids, 3)
    assert got.tolist() == [[7.0, 11.0, 0.0], [2.0, 3.0, 0.0]]
