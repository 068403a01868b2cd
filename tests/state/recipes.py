"""The two small in-memory recipes the checkpoint fixtures were written with (no data files).

``tests/state/fixtures/make_fixtures.py`` wrote the fixtures with these recipes at a commit
before the state package existed; the migration tests rebuild the same recipes, load the
fixtures with the current code and resume from them.
"""

from __future__ import annotations

import random

from zephon_nodes import DatasetSpec, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec


def _texts(alphabet: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def plain_recipe(num_lanes: int = 4) -> Recipe:
    """One dataset of 400 short documents, 4 lanes, G = 8, K = 3, a shuffle buffer."""
    docs = [f"doc {i}: " + "lorem ipsum " * (i % 11) for i in range(400)]
    return Recipe(
        datasets=(DatasetSpec("d", records=tuple({"text": t} for t in docs)),),
        tokenizer=TokenizerSpec(kind="bytes"),
        seed=3,
        num_lanes=num_lanes,
        global_batch_size=8,
        seq_len=64,
        flush_every=3,
        work=WorkSpec(chunk_size=7, epochs=1),
        shuffle=ShuffleSpec(4),
    )


def mixed_recipe() -> Recipe:
    """Two repeating datasets (short and long documents) for dynamic-mixture decisions."""
    short = DatasetSpec(
        "short",
        records=tuple({"text": t} for t in _texts("abcdefgh", 600, 10, 30, 5)),
        weight=0.5,
        on_exhausted="repeat",
    )
    long_ = DatasetSpec(
        "long",
        records=tuple({"text": t} for t in _texts("nopqrstu", 200, 100, 300, 6)),
        weight=0.5,
        on_exhausted="repeat",
    )
    return Recipe(
        datasets=(short, long_),
        tokenizer=TokenizerSpec(kind="bytes", add_bos=False, add_eos=False),
        seed=5,
        num_lanes=4,
        global_batch_size=8,
        seq_len=64,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=1),
        shuffle=ShuffleSpec(3),
    )
