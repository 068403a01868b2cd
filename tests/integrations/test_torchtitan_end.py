"""The end of finite data in a real multi-rank job: every rank stops after the same step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations.test_torchtitan_torchrun import tail, torchrun
from zephon_nodes import Pipeline, Recipe, WorkerPool

RECIPE = """
seed = 5
num_lanes = 4
global_batch_size = 8
seq_len = 16
flush_every = 2

[tokenizer]
kind = "bytes"

[[datasets]]
name = "t"
paths = ["t.jsonl"]

[work]
chunk_size = 3
epochs = 1
deal = "round_robin"
"""


def _steps_alone(pipeline: Pipeline, dp: int, rank: int) -> int:
    """Steps one rank's lanes can fill on their own (where it stopped before agreement)."""
    with WorkerPool(0) as pool:
        node = pipeline.rank_node(dp, rank, pool=pool)
        return sum(1 for _ in node) // node.micro_per_step


@pytest.mark.slow
def test_two_ranks_stop_after_the_same_step(tmp_path: Path) -> None:
    """torchrun, 2 ranks (gloo): the ranks' own lanes end apart; both stop at the first end."""
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as f:
        for i in range(60):  # documents of very different lengths: lanes end apart
            words = (i * 7) % 23
            f.write(json.dumps({"text": f"d{i} " + "word " * words}) + "\n")
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    pipeline = Pipeline(Recipe.from_toml(path))
    alone = [_steps_alone(pipeline, 2, r) for r in (0, 1)]
    assert alone[0] != alone[1], alone  # without agreement one rank would read on alone
    out = tmp_path / "out"
    out.mkdir()
    rc = torchrun(
        2, "tt_end_agree.py", ["--recipe", str(path), "--out", str(out)], tmp_path / "log"
    )
    assert rc == 0, tail(tmp_path / "log")
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    micro_per_step = 4 // 2  # G / dp = 4 rows per rank and step, local_batch_size 2
    assert [g["micro_batches"] for g in got] == [min(alone) * micro_per_step] * 2
