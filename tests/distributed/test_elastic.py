"""torchelastic end to end (bounded version of ``examples/elastic/elastic.py``).

Two torchrun agents (``--nnodes=1:2 --rdzv-backend=c10d``, two ranks each) train a tiny model
on the loader; one agent is SIGKILLed with its ranks during a step, the job restarts on the other
with half the ranks from the last committed checkpoint, then the agent comes back and the job
grows to four ranks again. Every step of every worker group is compared with an uninterrupted
run: digests exactly, losses to float rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.elastic.elastic import NPROC, drill

pytestmark = pytest.mark.slow


def test_shrink_to_one_node_and_grow_back(tmp_path: Path) -> None:
    """Kill one of two agents during a step, then bring it back: same global batches throughout."""
    report = drill(tmp_path, steps=12, cycles=1, run_steps=4, ckpt_every=3, say=print)
    shrink, grow = report.events
    assert (shrink.kind, shrink.world_before, shrink.world_after) == ("shrink", 2 * NPROC, NPROC)
    assert (grow.kind, grow.world_before, grow.world_after) == ("grow", NPROC, 2 * NPROC)
    # Resumed from the last checkpoint before each event (every 3 steps; events after 4 and 8).
    assert shrink.at_step == 4 and shrink.resumed_from == 3
    assert grow.at_step == 8 and grow.resumed_from == 6
    assert [g["world"] for g in report.groups] == [4, 2, 4]
    assert report.groups[-1]["done"]
    # Steps 1-4 (5 if it finished before the kill) at 4 ranks, 4-8 at 2 ranks, 7-12 at 4
    # ranks: the steps trained again are compared too.
    assert report.steps_compared in (4 + 5 + 6, 5 + 5 + 6)
    assert report.max_loss_rel_diff < 1e-4
