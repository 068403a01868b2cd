"""A naive rank-sharded loader, for comparison only: what most training loops do.

Documents (in the recipe's seeded work-item order) are dealt to ranks by index: document
``d`` goes to rank ``d % R``. Each rank tokenizes and packs its own documents with the same
tokenizer and packer as the recipe, and yields ``G/R`` samples per step; the global batch is
the ranks' batches concatenated in rank order. Its global batches change with ``R``, which is
the confound zephon-nodes removes. Never use it to train.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.operators.documents import DocBatch
from zephon_nodes.operators.pack import ConcatPacker, Sample
from zephon_nodes.verification.digest import global_batch_digest

__all__ = ["naive_batches", "naive_digests"]


def _documents(pipeline: Pipeline) -> Iterator[np.ndarray]:
    """Token ids of every document, in the recipe's global work-item order."""
    lanes = pipeline.num_lanes
    g = 0
    while True:
        item = pipeline.work_source.work(g % lanes, g // lanes)
        if item is None:
            return
        yield from pipeline.stateless(item).documents()
        g += 1


def naive_batches(pipeline: Pipeline, dp_world_size: int, steps: int) -> Iterator[list[Sample]]:
    """Yield the naive loader's global batches (``G`` samples each, ranks in order).

    Raises:
        RecipeError: If ``dp_world_size`` does not divide the global batch size.
    """
    recipe = pipeline.recipe
    G, R = recipe.global_batch_size, dp_world_size
    if R < 1 or G % R:
        raise RecipeError(f"global_batch_size={G} must be a multiple of {dp_world_size=}")
    per_rank = G // R
    packers = [ConcatPacker(recipe.seq_len, pipeline.pad_id) for _ in range(R)]
    queues: list[deque[Sample]] = [deque() for _ in range(R)]
    docs = _documents(pipeline)
    d = 0
    for _ in range(steps):
        while min(len(q) for q in queues) < per_rank:
            try:
                doc = next(docs)
            except StopIteration:
                return
            rank = d % R
            d += 1
            lengths = np.asarray([len(doc)], dtype=np.int64)
            queues[rank].extend(packers[rank].feed(DocBatch(doc, lengths)))
        yield [queues[r].popleft() for r in range(R) for _ in range(per_rank)]


def naive_digests(pipeline: Pipeline, dp_world_size: int, steps: int) -> list[str]:
    """Digest each of the naive loader's global batches (same byte layout, lane id 0)."""
    return [
        global_batch_digest((0, sample) for sample in batch)
        for batch in naive_batches(pipeline, dp_world_size, steps)
    ]
