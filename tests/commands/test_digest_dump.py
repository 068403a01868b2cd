"""``zephon digest --dump-batches`` and ``zephon digest-dump``: the batches behind the digests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.commands.conftest import write_recipe
from tests.commands.run import zephon
from zephon_nodes.core.errors import DataError
from zephon_nodes.verification.dump import StepDumper, dump_digests, write_step

STEPS = 5


def lines(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_dump_of_digest_gives_the_same_digests(tmp_path: Path, capsys) -> None:
    """digest-dump of a --dump-batches folder prints exactly what digest printed."""
    recipe = write_recipe(tmp_path)
    assert zephon("digest", str(recipe), "--steps", str(STEPS), "--dp-world-size", "2",
                  "--dump-batches", str(tmp_path / "dump")) == 0  # fmt: skip
    printed = lines(capsys.readouterr().out)
    assert [d["step"] for d in printed] == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == [
        "sources.json",  # the shards the per-token source fields index
        *[f"step-{t:08d}.npz" for t in range(1, STEPS + 1)],
    ]
    with np.load(tmp_path / "dump" / "step-00000001.npz") as data:
        assert {"input", "labels", "positions", "lane"} <= set(data.files)
        assert data["input"].shape == (8, 64)  # global batch 8 rows of seq_len 64
        assert sorted(data["lane"].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert zephon("digest-dump", str(tmp_path / "dump")) == 0
    assert lines(capsys.readouterr().out) == printed


def _batch(lanes: list[int], value: int) -> dict[str, torch.Tensor]:
    n = len(lanes)
    return {
        "input": torch.full((n, 4), value, dtype=torch.long),
        "lane": torch.tensor(lanes, dtype=torch.long),
    }


def test_rank_files_combine_in_lane_order(tmp_path: Path) -> None:
    """Rank files of a step give the digest of the whole batch, whatever the rank count."""
    whole = [_batch([0, 1], 5), _batch([2, 3], 6)]
    write_step(tmp_path / "a", 1, whole)
    write_step(tmp_path / "b", 1, [whole[1]], rank=1)
    write_step(tmp_path / "b", 1, [whole[0]], rank=0)
    assert dump_digests(tmp_path / "a") == dump_digests(tmp_path / "b")
    write_step(tmp_path / "c", 1, [_batch([0, 1], 5), _batch([2, 3], 7)])
    assert dump_digests(tmp_path / "c") != dump_digests(tmp_path / "a")


def test_step_dumper_skips_a_step_joined_midway(tmp_path: Path) -> None:
    """A rank resumed after micro-batch 1 of step 4 writes steps 5 on, never a partial step 4."""
    d = StepDumper(tmp_path, rank=3, micro_per_step=2)
    d.add(4, 1, _batch([6], 1))
    d.add(5, 0, _batch([6], 2))
    d.add(5, 1, _batch([7], 3))
    d.add(6, 0, _batch([6], 4))  # step 6 incomplete: not written
    assert list(d.steps_written()) == [5]
    with np.load(tmp_path / "step-00000005.rank-00003.npz") as data:
        assert data["lane"].tolist() == [6, 7]
        assert data["input"][:, 0].tolist() == [2, 3]


def test_bad_dump_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="dump folder not found"):
        dump_digests(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no step-"):
        dump_digests(tmp_path / "empty")
    write_step(tmp_path / "mixed", 1, [_batch([0], 1)])
    write_step(tmp_path / "mixed", 1, [_batch([1], 1)], rank=0)
    with pytest.raises(DataError, match="both a whole-batch file and rank files"):
        dump_digests(tmp_path / "mixed")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "step-00000001.npz").write_bytes(b"not an npz")
    with pytest.raises(DataError, match="cannot read batch dump"):
        dump_digests(tmp_path / "junk")
