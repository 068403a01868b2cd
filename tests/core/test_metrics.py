"""Run metrics of a rank node: per step, per operator, restores and skipped records."""

from __future__ import annotations

import json

import torch

from zephon_nodes import DatasetSpec, Pipeline, Recipe, TokenizerSpec, WorkerPool, WorkSpec
from zephon_nodes.engine.metrics import flatten_metrics

TEXTS = [f"document {i} " * (1 + i % 7) for i in range(60)]


def recipe(records: list[dict], **kw) -> Recipe:
    args = {
        "datasets": (DatasetSpec("d", records=tuple(records), on_error="skip"),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "num_lanes": 1,
        "global_batch_size": 2,
        "seq_len": 32,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=5),
    }
    args.update(kw)
    return Recipe(**args)


def drain(node) -> list[dict[str, torch.Tensor]]:
    out = []
    while True:
        try:
            out.append(next(node))
        except StopIteration:
            return out


def drain_each(node):
    while True:
        try:
            yield next(node)
        except StopIteration:
            return


class TestRankMetrics:
    """node.metrics(): a plain dict whose numbers match what the node handed out."""

    def test_per_step_numbers(self):
        pool = WorkerPool(2, "thread")
        try:
            node = Pipeline(recipe([{"text": t} for t in TEXTS])).rank_node(pool=pool)
            node.reset(None)
            batches = [next(node) for _ in range(3)]
            m = node.metrics()
        finally:
            pool.close()
        last = batches[-1]
        assert m["step"] == 3
        assert m["samples"] == 2 and m["samples_total"] == 6
        assert m["tokens"] == int((last["labels"] != -100).sum())
        assert m["tokens_total"] == sum(int((b["labels"] != -100).sum()) for b in batches)
        assert m["padding_fraction"] == float((last["labels"] == -100).float().mean())
        assert m["data_wait_s"] > 0 and m["data_wait_s_total"] >= m["data_wait_s"]
        assert m["restore_s"] == 0.0
        assert set(m["operators"]) == {"parse", "tokenize", "ConcatPacker"}
        assert all(op["busy_s"] > 0 and op["calls"] >= 1 for op in m["operators"].values())
        assert m["operators"]["parse"]["calls"] == m["operators"]["tokenize"]["calls"]
        assert 0 <= m["queue_ready"] <= m["queue_depth"] <= 4  # lookahead 4
        assert json.loads(json.dumps(m)) == m

    def test_padding_fraction_of_every_step(self):
        node = Pipeline(recipe([{"text": t} for t in TEXTS], seq_len=64)).rank_node(
            pool=WorkerPool(0, "thread")
        )
        node.reset(None)
        seen = []
        for batch in drain_each(node):
            want = float((batch["labels"] == -100).float().mean())
            assert node.metrics()["padding_fraction"] == want
            seen.append(want)
        assert len(seen) > 3 and max(seen) > 0  # flush points pad

    def test_skipped_records_by_reason(self):
        records: list[dict] = [{"text": t} for t in TEXTS]
        for i in (3, 17, 40):
            records[i] = {"body": "no text field"}
        records[25] = {"text": 7}
        node = Pipeline(recipe(records)).rank_node(pool=WorkerPool(0, "thread"))
        node.reset(None)
        drain(node)
        # One lane read every work item once: every bad record was seen once.
        assert node.metrics()["skipped"] == {"missing_field": 3, "non_string_field": 1}

    def test_restore_time(self):
        p = Pipeline(recipe([{"text": t} for t in TEXTS]))
        pool = WorkerPool(1, "thread")
        try:
            node = p.rank_node(pool=pool)
            node.reset(None)
            for _ in range(4):
                next(node)
            state = node.get_state()
            again = p.rank_node(pool=pool)
            again.reset(state)
            assert again.metrics()["restore_s"] > 0
            assert again.metrics()["step"] == 4
        finally:
            pool.close()

    def test_flatten_for_loggers(self):
        flat = flatten_metrics(
            {"step": 2, "operators": {"parse": {"busy_s": 0.5, "calls": 3}}, "skipped": {}}
        )
        assert flat == {
            "zephon/step": 2.0,
            "zephon/operators/parse/busy_s": 0.5,
            "zephon/operators/parse/calls": 3.0,
        }
