"""The timeline a rank node is handed: any segment's state resumes on the run's pipeline.

A re-laned state used to need its caller to pick the re-laned streams first
(``pipeline.for_state(state).rank_node(...)``); a node built from the run's pipeline refused
it ("lineage"). The node now asks its :class:`~zephon_nodes.engine.timeline.Timeline` which
segment a state is in, so ``pipeline.rank_node().reset(state)`` resumes a re-laned state,
a staged one and a plain one alike. Checked against the corpus: the documents of the
re-laned continuation are delivered once, and the batches are those of the re-laned
pipeline.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.stages.conftest import batches, recipe
from tests.stages.provenance import delivered, write_corpus
from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.relane import relane_state
from zephon_nodes.engine.timeline import Timeline, segment_for
from zephon_nodes.verification.digest import digest_microbatches


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Any, int]]:
    """Datasets a and b (2 shards of 120 documents each) and each document's input tokens."""
    root = tmp_path_factory.mktemp("timeline")
    return root, write_corpus(root, "ab", records=120)


def _relaned(root: Path) -> tuple[Any, dict[str, Any], Counter[Any]]:
    """The 4-lane recipe run 4 steps, its state re-laned to 8 lanes, what it delivered."""
    base = recipe(root, global_batch_size=24, num_lanes=4, flush_every=4)
    saved: list[dict[str, Any]] = []
    got: Counter[Any] = Counter()
    for _, _, batch in batches(Pipeline(base), 4, save_at=4, saved=saved):
        got.update(delivered([batch]))
    return base, relane_state(Pipeline(base), saved[0], 8), got


def _steps(node: Any, steps: int) -> tuple[list[str], list[dict[str, np.ndarray]]]:
    digests, arrays = [], []
    for _ in range(steps):
        mbs = [next(node)]
        digests.append(digest_microbatches(mbs))
        arrays.append({k: v.numpy() for k, v in mbs[0].items() if isinstance(v, torch.Tensor)})
    return digests, arrays


def test_a_node_of_the_run_resumes_a_relaned_state(corpus: tuple[Path, dict[Any, int]]) -> None:
    root, lengths = corpus
    base, state, before = _relaned(root)
    run = Pipeline(base.replace(num_lanes=8))
    with WorkerPool(1, "thread") as pool:
        node = run.rank_node(lanes=list(range(8)), pool=pool)  # no for_state
        node.reset(dict(state))
        assert node.pipeline.lineage == state["lineage"]
        digests, arrays = _steps(node, 3)
        node.close()
        ref = run.for_state(state).rank_node(lanes=list(range(8)), pool=pool)
        ref.reset(dict(state))
        assert _steps(ref, 3)[0] == digests
        ref.close()
    got = before + delivered(arrays)
    over = {doc: n for doc, n in got.items() if n > lengths[doc]}
    assert not over, f"{len(over)} documents delivered more tokens than they hold"
    assert delivered(arrays)  # the continuation delivered documents at all


def test_the_segment_of_each_state(corpus: tuple[Path, dict[Any, int]]) -> None:
    root, _ = corpus
    base, state, _ = _relaned(root)
    run = Pipeline(base.replace(num_lanes=8))
    timeline = Timeline(run)
    assert timeline.segment(None) is run
    assert segment_for(run, "not a state") is run  # validation names it, not the timeline
    relaned = timeline.segment(state)
    assert relaned is not run and relaned.lineage == state["lineage"]
    assert run.lineage is None  # the run's own pipeline is left as it is
    plain = dict(state, lineage=None)
    assert timeline.segment(plain) is run


def test_a_relaned_node_refuses_a_state_of_another_lineage(
    corpus: tuple[Path, dict[Any, int]],
) -> None:
    """A node of the re-laned run asked to resume a state never re-laned: refused."""
    root, _ = corpus
    base, state, _ = _relaned(root)
    relaned = Pipeline(base.replace(num_lanes=8)).for_state(state)
    plain_state = dict(state)
    plain_state.pop("lineage")
    with WorkerPool(1, "thread") as pool:
        node = relaned.rank_node(lanes=list(range(8)), pool=pool)
        with pytest.raises(CheckpointError, match="checkpoint"):
            node.reset(plain_state)
        node.close()
