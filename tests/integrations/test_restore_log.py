"""One log line per rank at every checkpoint and every restore (Python logging, which
TorchTitan's log shows): step, saved dp, new dp, samples replayed, seconds.

Runs with the installed TorchTitan's adapter (main: ``titan_main/test_seams_main.py``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tests.integrations.test_step_check import build
from tests.integrations.titan_main.helpers import dcp_load, union

LOGGER = "zephon_nodes.integrations.torchtitan"


def lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.INFO and r.getMessage().startswith(word)
    ]


def test_one_line_per_rank_at_checkpoint_and_restore(
    recipe_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    loaders = [build(recipe_path, 2, r, rows=2) for r in range(2)]  # 2 micro-batches a step
    for loader in loaders:
        it = iter(loader)
        for _ in range(4):  # steps 1 and 2
            next(it)
    states = [loader.state_dict() for loader in loaders]
    saved = lines(caplog, "zephon checkpoint")
    assert len(saved) == 2, saved
    for rank, lanes in ((0, "0-1"), (1, "2-3")):
        pattern = (
            rf"rank {rank} saved the state of step 2 at dp 2 \(lanes {lanes}, \d+ key\(s\)\) in "
        )
        assert sum(bool(re.search(pattern, line)) for line in saved) == 1, saved

    caplog.clear()
    new = build(recipe_path, 1, 0, rows=2)
    dcp_load(new, union(states))  # DCP asks the new loader for its keys: no checkpoint line
    assert lines(caplog, "zephon checkpoint") == []
    next(iter(new))
    (restored,) = lines(caplog, "zephon restore")
    m = re.fullmatch(
        r"zephon restore: rank 0 restored the state of step 2 saved at dp 2, now at dp 1 "
        r"\(lanes 0-3\): replayed (\d+) sample\(s\) of the lanes' current flush windows in "
        r"[\d.]+ s",
        restored,
    )
    assert m is not None, restored
    # 4 lanes x 2 samples per step x 2 steps were handed out; a lane replays at most those.
    assert 0 <= int(m.group(1)) <= 16
    for loader in (*loaders, new):
        loader.close()
