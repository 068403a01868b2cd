"""Shared helpers of the fault-tolerance tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from zephon_nodes import (
    DatasetSpec,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkerPool,
    WorkSpec,
)

# Inline pool (runs operators in the calling thread): no threads left behind by the many
# rank nodes the tests build.
INLINE = WorkerPool(0)

WORDS = ("alpha", "beta", "gamma", "delta", "lane", "flush", "window", "step", "zephon", "é☃")


def texts(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 1 to 40 words (non-ASCII included)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) + f" #{i}" for i in range(n)
    ]


def memory_recipe(n_docs: int = 120, **kw: Any) -> Recipe:
    """A small in-memory recipe (byte tokenizer): 4 lanes, G=8, seq_len 16, finite."""
    base: dict[str, Any] = {
        "datasets": (DatasetSpec("m", records=tuple({"text": t} for t in texts(n_docs))),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 3,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=5, epochs=1),
        "shuffle": ShuffleSpec(4),
    }
    base.update(kw)
    return Recipe(**base)


def memory_pipeline(**kw: Any) -> Pipeline:
    """:func:`memory_recipe` compiled."""
    return Pipeline(memory_recipe(**kw))


def write_jsonl(path: Path, docs: list[str]) -> Path:
    """Write documents as a ``.jsonl`` shard."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    return path
