"""Balanced dealing: a finite stream's items dealt by tokens so lanes end together."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_nodes import (
    DatasetSpec,
    Pipeline,
    Recipe,
    RecipeError,
    TokenizerSpec,
    WorkerPool,
    WorkSpec,
)
from zephon_nodes.engine import balance
from zephon_nodes.engine.balance import BalancedWorkSource
from zephon_nodes.engine.end_of_data import unused_samples
from zephon_nodes.engine.mixing import MixingWorkSource
from zephon_nodes.verification.simulate import simulate

TEXTS = [f"d{i} " + "word " * ((i * 37) % 120) for i in range(240)]


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSON lines shard of documents from 3 to ~600 bytes: items of very different sizes."""
    path = tmp_path_factory.mktemp("balance") / "skewed.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for text in TEXTS:
            f.write(json.dumps({"text": text}) + "\n")
    return path


def skewed(shard: Path, deal: str = "auto", epochs: int | None = 1) -> Recipe:
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


def _lane_tokens(p: Pipeline) -> list[int]:
    """Label tokens (not padding) each lane's samples hold, counted on the lanes' output."""
    with WorkerPool(0) as pool:
        return [
            sum(int((s["labels"] != -100).sum()) for s in p.build_lane(lane, pool))
            for lane in range(p.num_lanes)
        ]


def _unused(p: Pipeline) -> tuple[int, int]:
    ended: dict[str, Any] = {}
    steps = len(list(simulate(p, 2, 100_000, num_workers=0, on_end=ended.update)))
    unused = sum(unused_samples(p, ended).values())
    return unused, unused + steps * p.recipe.global_batch_size


def test_every_item_is_dealt_once_per_epoch_and_the_lanes_hold_equal_tokens(shard: Path) -> None:
    balanced = Pipeline(skewed(shard, epochs=2))
    plain = Pipeline(skewed(shard, "round_robin", epochs=2))
    ws = balanced.work_source
    assert isinstance(ws, BalancedWorkSource) and ws.measure == "tokens"
    n = balanced.datasets[0].num_work_items
    lanes = _lane_items(ws)
    assert Counter(i for items in lanes for i in items) == Counter({i: 2 for i in range(n)})
    got, rr = _lane_tokens(balanced), _lane_tokens(plain)
    assert sum(got) == sum(rr)
    assert max(got) - min(got) < (max(rr) - min(rr)) / 10, (got, rr)
    # each lane reads its items in stream order (epoch 0 before epoch 1)
    for lane in range(8):
        epochs = [ws.work(lane, i).epoch for i in range(len(lanes[lane]))]  # type: ignore[union-attr]
        assert epochs == sorted(epochs)


def test_balanced_dealing_leaves_at_most_two_percent_unused(shard: Path) -> None:
    balanced, total = _unused(Pipeline(skewed(shard)))
    plain, plain_total = _unused(Pipeline(skewed(shard, "round_robin")))
    assert total == plain_total  # the same samples, only dealt differently
    assert balanced <= 0.02 * total < plain, (balanced, plain, total)


def test_the_deal_is_part_of_the_fingerprint_only_where_it_changes_data(shard: Path) -> None:
    auto = Pipeline(skewed(shard))
    assert auto.fingerprint == Pipeline(skewed(shard, "balanced")).fingerprint
    assert auto.canonical["work"]["deal"] == "balanced-tokens"
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


def test_jsonl_parquet_and_in_memory_records_deal_identically(shard: Path, tmp_path: Path) -> None:
    """Sizes come from the records, never from how they are stored."""
    pq.write_table(pa.table({"text": TEXTS, "n": list(range(240))}), tmp_path / "s.parquet")
    memory = tuple({"text": t} for t in TEXTS)
    base = skewed(shard)
    ref = [r.digest for r, _ in simulate(Pipeline(base), 2, 6, num_workers=0)]
    rr = [r.digest for r, _ in simulate(Pipeline(skewed(shard, "round_robin")), 2, 6)]
    assert ref != rr
    for spec in (
        DatasetSpec("s", paths=(str(tmp_path / "s.parquet"),)),
        DatasetSpec("s", records=memory),
    ):
        p = Pipeline(base.replace(datasets=(spec,)))
        assert isinstance(p.work_source, BalancedWorkSource)
        assert [r.digest for r, _ in simulate(p, 4, 6, num_workers=2)] == ref, spec


def test_large_datasets_are_sized_by_record_counts(
    shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above EXACT_RECORDS no record is read at start-up: an item's size is its record count."""
    tokens = Pipeline(skewed(shard))
    monkeypatch.setattr(balance, "EXACT_RECORDS", 100)
    p = Pipeline(skewed(shard))
    ws = p.work_source
    assert isinstance(ws, BalancedWorkSource) and ws.measure == "records"
    assert [r.digest for r, _ in simulate(p, 2, 4)] != [r.digest for r, _ in simulate(tokens, 2, 4)]
    assert ws.item_sizes.tolist() == [4] * 60  # 240 records, chunk_size 4
    assert sorted(len(s) for s in ws.streams) == [7, 7, 7, 7, 8, 8, 8, 8]
    with WorkerPool(0) as pool:
        assert sum(sum(1 for _ in p.build_lane(lane, pool)) for lane in range(8)) > 0


def test_mixtures_and_images_keep_round_robin(shard: Path) -> None:
    mixed = skewed(shard).replace(
        datasets=(
            DatasetSpec("a", paths=(str(shard),), weight=0.5),
            DatasetSpec("b", records=tuple({"text": t} for t in TEXTS), weight=0.5),
        )
    )
    assert not mixed.balanced_dealing
    assert isinstance(Pipeline(mixed).work_source, MixingWorkSource)
    with pytest.raises(RecipeError, match=r"deal='balanced' applies to single-dataset"):
        Pipeline(mixed.replace(work=WorkSpec(chunk_size=4, deal="balanced")))
    assert WorkSpec().deal == "auto"


def test_streams_longer_than_the_bound_are_dealt_round_robin(
    shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over MAX_BALANCED_ITEMS items (all epochs), "auto" deals round-robin, "balanced" refuses.

    The shard has 240 records in items of 4: 60 items per epoch, 180 over 3 epochs.
    """
    monkeypatch.setattr(balance, "MAX_BALANCED_ITEMS", 179)
    auto = Pipeline(skewed(shard, epochs=3))
    assert type(auto.work_source).__name__ == "DatasetWorkSource"
    # Round-robin: lane l reads global items l, l + 8, ... (180 items: 23 for lanes 0-3).
    assert [len(s) for s in _lane_items(auto.work_source)] == [23] * 4 + [22] * 4
    with pytest.raises(RecipeError, match=r"deals at most 179 work items; .* gives 180 "):
        Pipeline(skewed(shard, deal="balanced", epochs=3))
    monkeypatch.setattr(balance, "MAX_BALANCED_ITEMS", 180)
    assert isinstance(Pipeline(skewed(shard, epochs=3)).work_source, BalancedWorkSource)
    # A huge epoch count costs nothing at start-up under "auto" (the fuzzer found the stream
    # being built over every epoch).
    monkeypatch.setattr(balance, "MAX_BALANCED_ITEMS", 1 << 20)
    huge = Pipeline(skewed(shard, epochs=2**31))
    assert type(huge.work_source).__name__ == "DatasetWorkSource"
