"""Hypothesis strategies shared by the test suite (recipes, corpora, layouts)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from zephon_nodes import (
    DatasetSpec,
    OperatorSpec,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkerPool,
    WorkSpec,
)
from zephon_nodes.recipe import PackSpec

documents = st.one_of(
    st.just(""),
    st.text(max_size=6),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=5, max_size=40),
    st.text(alphabet="ab \n", min_size=20, max_size=60),
    st.text(alphabet="xyz", min_size=150, max_size=400),
)

corpora = st.lists(documents, min_size=0, max_size=40)


@st.composite
def recipes(draw: st.DrawFn, min_docs: int = 8) -> Recipe:
    """A small recipe over an in-memory corpus with the byte tokenizer.

    Corpora mix empty, tiny, unicode and long documents; chunk sizes are drawn so that most
    lanes get work items, and epochs are 1, 2 or endless (callers cap the steps).
    """
    texts = draw(st.lists(documents, min_size=min_docs, max_size=60))
    num_lanes = draw(st.sampled_from([1, 2, 4, 8]))
    per_lane = draw(st.integers(1, 3))
    max_chunk = max(1, min(9, len(texts) // num_lanes))
    return Recipe(
        datasets=(DatasetSpec("corpus", records=tuple({"text": t} for t in texts)),),
        tokenizer=TokenizerSpec(
            kind="bytes", add_bos=draw(st.booleans()), add_eos=draw(st.booleans())
        ),
        seed=draw(st.integers(0, 2**32)),
        num_lanes=num_lanes,
        global_batch_size=num_lanes * per_lane,
        seq_len=draw(st.integers(2, 48)),
        flush_every=draw(st.integers(1, 5)),
        work=WorkSpec(
            chunk_size=draw(st.integers(1, max_chunk)),
            epochs=draw(st.sampled_from([1, 2, None])),
        ),
        shuffle=ShuffleSpec(draw(st.sampled_from([0, 1, 3, 8]))),
    )


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``."""
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def lane_assignments(draw: st.DrawFn, num_lanes: int, world: int) -> list[list[int]]:
    """An arbitrary split of the lanes into ``world`` equal groups."""
    order = draw(st.permutations(list(range(num_lanes))))
    per = num_lanes // world
    return [sorted(order[r * per : (r + 1) * per]) for r in range(world)]


# Chat messages: content may be empty, unicode, or very long (longer than a sample).
message_contents = st.one_of(
    st.just(""),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
    st.text(alphabet="hello there, how are you? ", min_size=1, max_size=30),
    st.text(alphabet="abc ", min_size=120, max_size=300),
)


@st.composite
def conversations(draw: st.DrawFn, roles: tuple[str, ...] = ("user", "assistant")) -> list:
    """A conversation: an optional system message, then turns of random roles."""
    out = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(message_contents)})
    for _ in range(draw(st.integers(1, 5))):
        out.append({"role": draw(st.sampled_from(roles)), "content": draw(message_contents)})
    return out


@st.composite
def chain_recipes(draw: st.DrawFn) -> Recipe:
    """A byte-tokenizer recipe with an optional filter and map operator (per-operator pools)."""
    texts = draw(corpora.filter(lambda c: len(c) >= 8))
    ops: list[OperatorSpec] = []
    if draw(st.booleans()):
        ops.append(OperatorSpec("filter", "min_chars", {"n": draw(st.integers(0, 30))}))
    if draw(st.booleans()):
        ops.append(OperatorSpec("map", "strip"))
    lanes = draw(st.sampled_from([1, 2, 4]))
    from tests.core.helpers import texts_recipe

    return texts_recipe(
        texts,
        operators=tuple(ops),
        num_lanes=lanes,
        global_batch_size=lanes * draw(st.integers(1, 2)),
        seq_len=draw(st.integers(4, 24)),
        flush_every=draw(st.integers(1, 3)),
        pack=PackSpec(mode=draw(st.sampled_from(["concat", "bestfit"]))),
    )


def operator_assignments(draw: st.DrawFn, pipeline: Pipeline, pools: dict[str, WorkerPool]) -> dict:
    """Draw, for each operator of the pipeline's chain, one of ``pools`` or the default."""
    out: dict[str, WorkerPool] = {}
    for op in pipeline.stateless.operators:
        choice = draw(st.sampled_from([None, *pools]))
        if choice is not None:
            out[op.name] = pools[choice]
    return out


#: The transitions of a run (engine/timeline.py): what a chain of changes is drawn from.
TRANSITIONS = ("relane", "add", "remove", "seq_len", "mixture", "stage", "pass")


@st.composite
def transition_chains(draw: st.DrawFn, lanes: Sequence[int], max_len: int = 6) -> dict:
    """A run's first lane count and a chain of up to ``max_len`` transitions.

    Each transition is ``(kind, steps, value, dp)``: run ``steps`` steps (1-3) of the segment
    before it at dp ``dp`` (an index into the segment's dp sizes), then make the change;
    ``value`` picks the change's parameter (a lane count, a dataset, a seq_len, weights). A
    planned stage is drawn only first (a stage cannot start after a re-lane).
    """
    n = draw(st.integers(0, max_len))
    chain = []
    for i in range(n):
        kinds = TRANSITIONS if i == 0 else tuple(k for k in TRANSITIONS if k != "stage")
        chain.append(
            (
                draw(st.sampled_from(kinds)),
                draw(st.integers(1, 3)),
                draw(st.integers(0, 5)),
                draw(st.integers(0, 3)),
            )
        )
    return {
        "lanes": draw(st.sampled_from(list(lanes))),
        "chain": chain,
        "last_dp": draw(st.integers(0, 3)),
    }
