"""Scheduled mixtures follow their schedule; `zephon stats --json` reports the shares."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.mixing.helpers import label_counts_by_alphabet, two_length_recipe, write_jsonl
from zephon_nodes import Pipeline, WorkSpec, simulate
from zephon_nodes.cli import main
from zephon_nodes.recipe import MixtureSpec
from zephon_nodes.recipe.schedule import WeightSchedule


class TestWeightSchedule:
    """Piecewise-linear weights, held after the last point; steps converted to tokens."""

    def test_interpolation_in_steps(self):
        r = two_length_recipe(
            0.5,
            mixture=MixtureSpec(
                schedule=((0, {"short": 3, "long": 1}), (10, {"short": 1, "long": 3})),
                unit="steps",
            ),
        )
        s = WeightSchedule.from_recipe(r)
        per_step = r.global_batch_size * r.seq_len
        assert s.weights_at(0) == (0.75, 0.25)
        assert s.weights_at(5 * per_step) == pytest.approx((0.5, 0.5))
        assert s.weights_at(10 * per_step) == (0.25, 0.75)
        assert s.weights_at(1e12) == (0.25, 0.75)

    def test_static_weights_are_one_point(self):
        s = WeightSchedule.from_recipe(two_length_recipe(0.2))
        assert s.points == ((0.0, pytest.approx((0.2, 0.8))),)


def test_scheduled_shares_follow_the_schedule():
    """Short docs go from 0.9 to 0.1 of the tokens over 240k tokens, then stay at 0.1.

    Each 10-step window's share is compared with the schedule at the window's middle
    (in non-padding tokens emitted so far); lanes drift by a few work items, hence 0.05.
    """
    schedule = ((0, {"short": 0.9, "long": 0.1}), (240_000, {"short": 0.1, "long": 0.9}))
    recipe = two_length_recipe(
        0.5,
        mixture=MixtureSpec(schedule=schedule, unit="tokens", block=16),
        work=WorkSpec(chunk_size=2, epochs=1),
    )
    steps = 100
    results = list(simulate(Pipeline(recipe), 2, steps, keep_batches=True))
    assert len(results) == steps
    done = 0
    shares, expected = [], []
    for start in range(0, steps, 10):
        mbs = [mb for _, batch in results[start : start + 10] for mb in batch or []]
        counts = label_counts_by_alphabet(mbs)
        shares.append(counts[0] / counts.sum())
        middle = done + counts.sum() / 2
        expected.append(0.9 - 0.8 * min(middle / 240_000, 1.0))
        done += counts.sum()
    assert np.all(np.diff(shares[:5]) < 0), shares
    for got, want in zip(shares, expected, strict=True):
        assert abs(got - want) < 0.05, (shares, expected)
    assert abs(shares[-1] - 0.1) < 0.03, shares  # held after the last point


def test_stats_json_keys(tmp_path, capsys):
    """The command prints one JSON object with token_shares and padding_fraction."""
    write_jsonl(tmp_path / "a.jsonl", ["short text"] * 200)
    write_jsonl(tmp_path / "b.jsonl", ["a longer text " * 4] * 100)
    (tmp_path / "r.toml").write_text(
        """
num_lanes = 2
global_batch_size = 4
seq_len = 64
flush_every = 2
[tokenizer]
kind = "bytes"
[[datasets]]
name = "a"
paths = ["a.jsonl"]
weight = 1
on_exhausted = "repeat"
[[datasets]]
name = "b"
paths = ["b.jsonl"]
weight = 3
on_exhausted = "repeat"
[work]
chunk_size = 2
""",
        encoding="utf-8",
    )
    assert main(["stats", str(tmp_path / "r.toml"), "--steps", "60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["token_shares"]) == {"a", "b"}
    assert abs(sum(out["token_shares"].values()) - 1) < 1e-9
    assert abs(out["token_shares"]["b"] - 0.75) < 0.05
    assert 0 <= out["padding_fraction"] < 1
    assert out["steps"] == 60
    assert out["tokens"] + round(out["padding_fraction"] * out["positions"]) == out["positions"]
    assert main(["stats", str(tmp_path / "r.toml"), "--steps", "3"]) == 0
    assert "token share" in capsys.readouterr().out
