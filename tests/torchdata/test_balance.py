"""Balanced dealing: a finite stream's items dealt by size so lanes end closer together."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from zephon_nodes import DatasetSpec, Pipeline, Recipe, RecipeError, TokenizerSpec, WorkSpec
from zephon_nodes.engine.balance import BalancedWorkSource, item_bytes
from zephon_nodes.engine.end_of_data import unused_samples
from zephon_nodes.verification.simulate import simulate


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSON lines shard of documents from 3 to ~600 bytes: items of very different sizes."""
    path = tmp_path_factory.mktemp("balance") / "skewed.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(240):
            f.write(json.dumps({"text": f"d{i} " + "word " * ((i * 37) % 120)}) + "\n")
    return path


def skewed(shard: Path, deal: str = "balanced", epochs: int | None = 1) -> Recipe:
    return Recipe(
        datasets=(DatasetSpec("s", paths=(str(shard),)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=11,
        num_lanes=8,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=epochs, deal=deal),
    )


def _lane_items(ws: Any) -> list[list[int]]:
    out = []
    for lane in range(ws.num_lanes):
        items, i = [], 0
        while (w := ws.work(lane, i)) is not None:
            assert (w.lane, w.position) == (lane, i)
            items.append(w.item)
            i += 1
        out.append(items)
    return out


def _unused(p: Pipeline) -> int:
    ended: dict[str, Any] = {}
    list(simulate(p, 2, 100_000, num_workers=0, on_end=ended.update))
    return sum(unused_samples(p, ended).values())


def test_every_item_is_dealt_once_per_epoch_and_the_lanes_hold_equal_bytes(shard: Path) -> None:
    balanced = Pipeline(skewed(shard, epochs=2))
    plain = Pipeline(skewed(shard, "round_robin", epochs=2))
    ws = balanced.work_source
    assert isinstance(ws, BalancedWorkSource)
    n = balanced.datasets[0].num_work_items
    lanes = _lane_items(ws)
    assert Counter(i for items in lanes for i in items) == Counter({i: 2 for i in range(n)})
    spread = max(ws.lane_bytes) - min(ws.lane_bytes)
    rr = [sum(map(item_bytes, items)) for items in _lane_items_raw(plain.work_source)]
    assert spread < (max(rr) - min(rr)) / 4, (ws.lane_bytes, rr)
    # each lane reads its items in stream order (epoch 0 before epoch 1)
    for lane in range(8):
        epochs = [ws.work(lane, i).epoch for i in range(len(lanes[lane]))]  # type: ignore[union-attr]
        assert epochs == sorted(epochs)


def _lane_items_raw(ws: Any) -> list[list[Any]]:
    out = []
    for lane in range(ws.num_lanes):
        items, i = [], 0
        while (w := ws.work(lane, i)) is not None:
            items.append(w)
            i += 1
        out.append(items)
    return out


def test_balanced_dealing_leaves_fewer_samples_unused(shard: Path) -> None:
    balanced = _unused(Pipeline(skewed(shard)))
    plain = _unused(Pipeline(skewed(shard, "round_robin")))
    assert balanced < plain / 2, (balanced, plain)


def test_the_deal_is_part_of_the_fingerprint_only_where_it_changes_data(shard: Path) -> None:
    assert skewed(shard).fingerprint() != skewed(shard, "round_robin").fingerprint()
    assert "deal" not in skewed(shard, "round_robin").canonical()["work"]
    # endless streams are always dealt round-robin: the setting does not change them
    endless = skewed(shard, epochs=None)
    assert endless.fingerprint() == skewed(shard, "round_robin", epochs=None).fingerprint()
    assert not isinstance(Pipeline(endless).work_source, BalancedWorkSource)


def test_balanced_dealing_is_elastic_and_has_passes(shard: Path) -> None:
    p = Pipeline(skewed(shard))
    ref = [r.digest for r, _ in simulate(p, 1, 8, num_workers=0)]
    saved: list[dict[str, Any]] = []
    first = [r.digest for r, _ in simulate(p, 4, 3, save_at=3, on_save=saved.append)]
    rest = [r.digest for r, _ in simulate(p, 2, 5, resume_state=saved[0])]
    assert first + rest == ref
    second = p.work_source.for_pass(1)
    assert isinstance(second, BalancedWorkSource)
    assert _lane_items(second) != _lane_items(p.work_source)


def test_balanced_dealing_needs_a_byte_index(shard: Path) -> None:
    """Sizes read another way would make the batches depend on the storage format."""
    records = tuple({"text": f"t{i}"} for i in range(40))
    r = skewed(shard).replace(datasets=(DatasetSpec("mem", records=records),))
    with pytest.raises(RecipeError, match=r"deal='balanced' needs JSON lines shards.*'mem'"):
        Pipeline(r)
    assert Pipeline(r.replace(work=WorkSpec(chunk_size=4))).recipe.work.deal == "round_robin"
