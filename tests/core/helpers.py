"""Small helpers for the core tests."""

from __future__ import annotations

from typing import Any

from zephon_nodes import Pipeline, Recipe, simulate


def digests(pipeline: Pipeline, world: int, steps: int = 30, **kw: Any) -> list[str]:
    """Per-step global batch digests of a simulated run."""
    return [r.digest for r, _ in simulate(pipeline, world, steps, **kw)]


def texts_recipe(texts: list[str], **kw: Any) -> Recipe:
    """A recipe over in-memory texts with the byte tokenizer."""
    from zephon_nodes import DatasetSpec, TokenizerSpec, WorkSpec

    base: dict[str, Any] = {
        "datasets": (DatasetSpec("corpus", records=tuple({"text": t} for t in texts)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 1,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=2),
    }
    base.update(kw)
    return Recipe(**base)


def fail_on_seven(x: int) -> int:
    """A stateless operator that fails on one item (picklable for the process runner)."""
    if x == 7:
        raise ValueError("seven is not allowed")
    return x * 10
