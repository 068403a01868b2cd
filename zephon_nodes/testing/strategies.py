"""Hypothesis strategies for recipes and operator inputs (documents, corpora, lanes, ranks).

Use them in your own property tests::

    from hypothesis import given
    from zephon_nodes.testing import strategies as zst

    @given(zst.recipes())
    def test_my_recipe_family(recipe): ...
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from zephon_nodes.operators.documents import DocBatch, TextBatch
from zephon_nodes.recipe import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec

__all__ = [
    "LANE_COUNTS",
    "corpora",
    "doc_batches",
    "documents",
    "lane_counts",
    "recipes",
    "text_batches",
    "world_sizes",
]

LANE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)


def documents(max_size: int = 200) -> st.SearchStrategy[str]:
    """Document texts: empty, short, any Unicode, and long runs that span samples."""
    return st.one_of(
        st.just(""),
        st.text(max_size=8),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=max_size),
        st.text(alphabet="ab \n", min_size=max_size // 2, max_size=max_size),
    )


def corpora(min_size: int = 1, max_size: int = 60) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Corpora: lists of JSON records ``{"text": ...}``."""
    return st.lists(documents().map(lambda t: {"text": t}), min_size=min_size, max_size=max_size)


def lane_counts(max_lanes: int = 16) -> st.SearchStrategy[int]:
    """Lane counts with many divisors (the ones people pick), up to ``max_lanes``."""
    return st.sampled_from([n for n in LANE_COUNTS if n <= max_lanes])


def world_sizes(num_lanes: int | None = None, max_size: int = 8) -> st.SearchStrategy[int]:
    """Data-parallel world sizes; with ``num_lanes``, only those that divide it."""
    if num_lanes is None:
        return st.integers(1, max_size)
    return st.sampled_from(
        [d for d in range(1, min(num_lanes, max_size) + 1) if num_lanes % d == 0]
    )


def text_batches(max_docs: int = 6) -> st.SearchStrategy[TextBatch]:
    """Inputs of a text operator: the texts of one work item."""
    return st.lists(documents(80), max_size=max_docs).map(lambda ts: TextBatch(ts, "hypothesis"))


def _doc_batch(docs: list[list[int]]) -> DocBatch:
    tokens = np.asarray([t for d in docs for t in d], dtype=np.int32)
    lengths = np.asarray([len(d) for d in docs], dtype=np.int64)
    return DocBatch(tokens, lengths)


def doc_batches(
    max_docs: int = 6, max_len: int = 40, vocab: int = 259
) -> st.SearchStrategy[DocBatch]:
    """Inputs of a token operator or packer: the token ids of one work item's documents."""
    doc = st.lists(st.integers(0, vocab - 1), max_size=max_len)
    return st.lists(doc, max_size=max_docs).map(_doc_batch)


@st.composite
def recipes(draw: st.DrawFn, min_docs: int = 8, max_lanes: int = 8) -> Recipe:
    """Small recipes over an in-memory corpus with the byte tokenizer (no files needed)."""
    texts = draw(st.lists(documents(120), min_size=min_docs, max_size=min_docs + 40))
    num_lanes = draw(lane_counts(max_lanes))
    per_lane = draw(st.integers(1, 3))
    max_chunk = max(1, min(9, len(texts) // num_lanes))
    return Recipe(
        datasets=(DatasetSpec("corpus", records=tuple({"text": t} for t in texts)),),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=draw(st.booleans()), add_eos=True),
        seed=draw(st.integers(0, 2**32)),
        num_lanes=num_lanes,
        global_batch_size=num_lanes * per_lane,
        seq_len=draw(st.integers(2, 48)),
        flush_every=draw(st.integers(1, 5)),
        work=WorkSpec(chunk_size=draw(st.integers(1, max_chunk)), epochs=1),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 1, 3, 8]))),
    )
