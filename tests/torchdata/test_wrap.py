"""The "wrap" end of data: dry lanes continue into the next pass; no sample is dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.torchdata.test_balance import TEXTS, skewed
from zephon_nodes import DatasetSpec, Pipeline, Recipe, RecipeError, WorkerPool, WorkSpec
from zephon_nodes.engine.end_of_data import unused_samples
from zephon_nodes.engine.lane import Lane
from zephon_nodes.engine.multiplexer import LANE_KEY
from zephon_nodes.engine.work import lane_length
from zephon_nodes.engine.wrap import WrappedWorkSource
from zephon_nodes.verification.simulate import simulate


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import json

    path = tmp_path_factory.mktemp("wrap") / "skewed.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for text in TEXTS[:120]:
            f.write(json.dumps({"text": text}) + "\n")
    return path


def wrapping(shard: Path, deal: str = "round_robin") -> Recipe:
    r = skewed(shard, deal)
    return r.replace(work=WorkSpec(chunk_size=4, epochs=1, deal=deal, end_of_data="wrap"))


def _pass_samples(p: Pipeline, lane: int, pass_index: int) -> list[np.ndarray]:
    """A lane's inputs in one pass of the recipe read alone (no wrap)."""
    with WorkerPool(0) as pool:
        node = p.build_lane(lane, pool)
        node.reset({Lane.WINDOW_KEY: 0, Lane.CONSUMED_KEY: 0, Lane.PASS_KEY: pass_index})
        return [s["input"] for s in node]


@pytest.mark.parametrize("deal", ["round_robin", "balanced"])
def test_every_sample_of_the_epoch_is_delivered_then_the_next_pass_follows(
    shard: Path, deal: str
) -> None:
    plain = Pipeline(skewed(shard, deal))
    wrapped = Pipeline(wrapping(shard, deal))
    assert isinstance(wrapped.work_source, WrappedWorkSource)
    assert lane_length(wrapped.work_source, 0) is None  # endless, found without probing
    L, spl = plain.num_lanes, plain.recipe.samples_per_lane
    lanes = [_pass_samples(plain, lane, 0) + _pass_samples(plain, lane, 1) for lane in range(L)]
    first = [len(_pass_samples(plain, lane, 0)) for lane in range(L)]
    # The drop policy stops early and reports the rest: delivered + unused = the epoch.
    ended: dict[str, Any] = {}
    stop = len(list(simulate(plain, 2, 10_000, num_workers=0, on_end=ended.update)))
    assert stop * spl * L + sum(unused_samples(plain, ended).values()) == sum(first)
    # Wrap runs until the longest lane has delivered its last sample of the epoch, and on.
    steps = -(-max(first) // spl) + 2
    taken = [0] * L
    for _, mbs in simulate(wrapped, 4, steps, num_workers=2, keep_batches=True):
        for mb in mbs or []:
            for row, lane in zip(mb["input"], mb[LANE_KEY].tolist(), strict=True):
                assert np.array_equal(row.numpy(), lanes[lane][taken[lane]]), (lane, taken)
                taken[lane] += 1
    assert taken == [steps * spl] * L
    assert all(t >= n for t, n in zip(taken, first, strict=True))  # the whole epoch delivered
    assert stop < steps - 2  # the drop policy would have stopped before


def test_wrap_is_elastic_across_the_pass_boundary(shard: Path) -> None:
    p = Pipeline(wrapping(shard))
    plain = Pipeline(skewed(shard, "round_robin"))
    first = [len(_pass_samples(plain, lane, 0)) for lane in range(8)]
    steps = max(first) // 2 + 4
    ref = [r.digest for r, _ in simulate(p, 1, steps, num_workers=0)]
    assert len(ref) == steps
    save = min(first) // 2 + 1  # the shortest lane is in pass 1, the longest in pass 0
    assert save < max(first) // 2
    saved: list[dict[str, Any]] = []
    head = [r.digest for r, _ in simulate(p, 8, save, save_at=save, on_save=saved.append)]
    tail = [r.digest for r, _ in simulate(p, 2, steps - save, resume_state=saved[0])]
    assert head + tail == ref


def test_wrap_joins_the_fingerprint_and_applies_to_finite_single_datasets(shard: Path) -> None:
    base = skewed(shard, "round_robin")
    assert wrapping(shard).fingerprint() != base.fingerprint()
    error = base.replace(work=WorkSpec(chunk_size=4, deal="round_robin", end_of_data="error"))
    assert error.fingerprint() == base.fingerprint()
    endless = base.replace(work=WorkSpec(chunk_size=4, epochs=None, end_of_data="wrap"))
    assert endless.fingerprint() == skewed(shard, "round_robin", epochs=None).fingerprint()
    mixed = wrapping(shard).replace(
        datasets=(
            DatasetSpec("a", paths=(str(shard),), weight=0.5),
            DatasetSpec("b", records=tuple({"text": t} for t in TEXTS), weight=0.5),
        )
    )
    with pytest.raises(RecipeError, match=r"end_of_data='wrap' applies to single-dataset"):
        Pipeline(mixed)
