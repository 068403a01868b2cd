"""The end of finite data after re-lanes and amendments, resumed at other dp sizes.

After a chain of changes (``relane_state``, ``amend_state``), the run goes on at another dp
size to the end of the data. Then what the end reports is checked against the corpus
(byte tokenizer, bos and eos once per document):

- ``unused_samples`` (what ``zephon digest`` and ``zephon stats`` print) is the number of
  samples the lanes still hold after the last full step (drained here lane by lane);
- the pairs delivered, plus those held at the end, plus the dropped tokens the metrics
  report, are exactly the corpus's pairs, none twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import assume, given, settings

from tests.core.test_relane import _pairs, change_chains, corpus_pairs, segment
from tests.stages.test_drop_accounting import _change, _held_and_reported
from zephon_nodes import Pipeline, WorkerPool, simulate
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.end_of_data import end_counts
from zephon_nodes.engine.relane import for_state


def _to_the_end(
    pipeline: Pipeline, state: dict[str, Any], dp: int, delivered: Counter
) -> tuple[dict[str, Any], int]:
    """Run from ``state`` to the end of the data at ``dp``; the ended state and the steps."""
    ended: dict[str, Any] = {}
    steps = 0
    for _, mbs in simulate(
        pipeline,
        dp,
        10_000,
        num_workers=0,
        resume_state=state,
        keep_batches=True,
        on_end=ended.update,
    ):
        steps += 1
        for mb in mbs or []:
            _pairs(mb, delivered)
    assert ended, "finite data ends"
    return ended, steps


@settings(max_examples=15)
@given(case=change_chains(("round_robin",), ("relane", "seq_len"), 1))
def test_the_end_counts_the_corpus_after_changes(case: dict[str, Any]) -> None:
    recipe = case["recipe"]
    pipeline, state, step = Pipeline(recipe), None, 0
    delivered: Counter = Counter()
    last_dp = 0
    for steps, dp_pick, change in case["chain"]:
        state = segment(pipeline, state, step, steps, dp_pick, delivered)
        assume(state is not None)  # the data lasted to the change
        assert state is not None
        step += steps
        last_dp = dp_pick
        if change is None:
            break
        try:
            state, recipe = _change(pipeline, state, change)
        except RecipeError:  # refused at the change: not this property's case
            assume(False)
        pipeline = Pipeline(recipe)
    p = for_state(pipeline, state)
    dps = [d for d in range(1, p.num_lanes + 1) if p.num_lanes % d == 0]
    ended, _ = _to_the_end(pipeline, state, dps[(last_dp + 1) % len(dps)], delivered)
    unused, endless = end_counts(for_state(pipeline, ended), ended)
    assert not endless
    held, reported = _held_and_reported(pipeline, ended)
    # Samples the lanes hold at the end, drained lane by lane (independently of end_counts).
    samples = _held_samples(pipeline, ended)
    assert sum(unused.values()) == samples
    want = corpus_pairs([r["text"] for r in recipe.datasets[0].records])
    got = delivered + held
    assert not got - want, "a document's tokens were delivered twice"
    assert sum((want - got).values()) == reported


def _held_samples(pipeline: Pipeline, state: dict[str, Any]) -> int:
    """Samples the lanes hold at ``state``, drained lane by lane."""
    p = for_state(pipeline, state)
    n = 0
    with WorkerPool(0, "thread") as pool:
        node = p.rank_node(lanes=list(range(p.num_lanes)), pool=pool)
        try:
            node.reset(state)
            for lane in node.lanes.values():
                n += sum(1 for _ in lane)
        finally:
            node.close()
    return n
