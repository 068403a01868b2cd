"""TorchTitan's real Trainer under torchelastic: a node is lost, the job shrinks and resumes.

Bounded version of ``examples/elastic/titan.py``: two torchrun agents of one rank each
(``--nnodes=1:2``, c10d rendezvous), TorchTitan 0.3.0's Trainer (llama3 debug model, CPU
patches) fed by ZephonDataLoader, a DCP checkpoint every 3 steps. Agent b is SIGKILLed after
step 4; agent a restarts alone, loads checkpoint 3 and trains to step 6. Every step each worker
group dumped (``--dataloader.dump-batches``) must equal ``zephon digest`` of the recipe. The
grow back to two agents runs in the example (``python -m examples.elastic.titan``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.elastic.titan import drill

pytestmark = pytest.mark.slow


def test_trainer_shrinks_to_one_node_with_the_same_batches(tmp_path: Path) -> None:
    report = drill(tmp_path, steps=6, ckpt_every=3, shrink_after=4, grow=False, nproc=1)
    (shrink,) = report.events
    assert (shrink.kind, shrink.world_before, shrink.world_after) == ("shrink", 2, 1)
    # Killed after step 4 was loaded: the only complete checkpoint then was step 3.
    assert shrink.latest_checkpoint == 3 and shrink.resumed_from == 3
    worlds = [(g["world"], g["resumed_from"], g["steps"][-1]) for g in report.groups]
    assert worlds[0][:2] == (2, 0) and worlds[-1] == (1, 3, 6)
    # Steps 1..4 (or 5) on two ranks, then 4..6 on one: the steps redone are compared too.
    assert report.steps_compared >= 4 + 3
