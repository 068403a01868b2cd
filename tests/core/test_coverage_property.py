"""Property: within an epoch every document's tokens appear exactly once."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given

from tests.strategies import recipes
from zephon_nodes import Pipeline, WorkerPool
from zephon_nodes.operators import IGNORE_INDEX


def _pairs_of_documents(texts, add_bos, add_eos):
    """Every (input, label) pair a document contributes, from first principles."""
    pairs = Counter()
    for text in texts:
        ids = [b + 3 for b in text.encode("utf-8")]
        ids = ([1] if add_bos else []) + ids + ([2] if add_eos else [])
        for a, b in itertools.pairwise(ids):
            pairs[(a, b)] += 1
    return pairs


@given(recipe=recipes())
def test_one_epoch_of_all_lanes_holds_each_document_once(recipe):
    """The union of all lane streams of one epoch is exactly the corpus (padding aside)."""
    recipe = recipe.replace(work=recipe.work.__class__(recipe.work.chunk_size, epochs=1))
    pipeline = Pipeline(recipe)
    got = Counter()
    rows = 0
    with WorkerPool(2, "thread") as pool:
        for lane in range(recipe.num_lanes):
            for sample in pipeline.build_lane(lane, pool):
                rows += 1
                keep = sample["labels"] != IGNORE_INDEX
                assert (sample["input"][~keep] == pipeline.pad_id).all()
                for a, b in zip(
                    sample["input"][keep].tolist(), sample["labels"][keep].tolist(), strict=True
                ):
                    got[(a, b)] += 1
    texts = [r["text"] for r in recipe.datasets[0].records]
    tok = recipe.tokenizer
    assert got == _pairs_of_documents(texts, tok.add_bos, tok.add_eos)
