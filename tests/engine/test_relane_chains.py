"""Chains of three re-lanes: no document delivered twice (checked against the corpus).

A re-lane of a re-laned run used to treat the old lanes' leftover windows still ahead of
them as untouched items: their first samples, delivered before the first re-lane, came
again (issue 32: 4 -> 8 -> 2 -> 6 and 4 -> 8 -> 4 -> 8, re-laned after step 4, 3 steps each).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.stages.conftest import batches, recipe
from tests.stages.provenance import delivered, write_corpus
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.relane import relane_state


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Any, int]]:
    """Datasets a and b (2 shards of 120 documents each) and each document's input tokens."""
    root = tmp_path_factory.mktemp("relane-chains")
    return root, write_corpus(root, "ab", records=120)


def run_chain(root: Path, lanes: list[int], dps: list[int]) -> tuple[Counter[Any], list[str]]:
    """Run 4 steps, then re-lane and run 3 steps for each later lane count."""
    base = recipe(root, global_batch_size=24, num_lanes=lanes[0], flush_every=4)
    got: Counter[Any] = Counter()
    digests: list[str] = []
    state: Any = None
    step = 0
    for k, (n, dp) in enumerate(zip(lanes, dps, strict=True)):
        if k:
            state = relane_state(Pipeline(base.replace(num_lanes=lanes[k - 1])), state, n)
        steps = 3 if k else 4
        saved: list[dict[str, Any]] = []
        pipeline = Pipeline(base.replace(num_lanes=n))
        for _, digest, batch in batches(
            pipeline, steps, dp, resume=state, save_at=step + steps, saved=saved
        ):
            got.update(delivered([batch]))
            digests.append(digest)
        step += steps
        state = saved[0]
    return got, digests


@pytest.mark.parametrize("lanes", [[4, 8, 2, 6], [4, 8, 4, 8]])
def test_third_relane_delivers_no_document_twice(
    corpus: tuple[Path, dict[Any, int]], lanes: list[int]
) -> None:
    root, lengths = corpus
    got, digests = run_chain(root, lanes, [1] * len(lanes))
    over = {doc: n for doc, n in got.items() if n > lengths[doc]}
    assert not over, f"{len(over)} documents delivered more tokens than they hold"
    assert len(digests) == 13
    mixed = [2, lanes[1] // 2, lanes[2], lanes[3] // 2]
    got2, digests2 = run_chain(root, lanes, mixed)
    assert digests2 == digests and got2 == got
