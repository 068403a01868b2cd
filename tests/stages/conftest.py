"""A self-identifying corpus of three datasets and helpers that run recipes over it."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.stages.provenance import write_corpus
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

BASE: dict[str, Any] = {
    "seed": 7,
    "num_lanes": 4,
    "global_batch_size": 8,
    "seq_len": 32,
    "flush_every": 2,
    "tokenizer": {"kind": "bytes"},
    "datasets": [
        {"name": "a", "paths": ["a/*.jsonl"], "weight": 1.0},
        {"name": "b", "paths": ["b/*.jsonl"], "weight": 1.0},
    ],
    "work": {"chunk_size": 4, "epochs": "inf"},
}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Any, int]]:
    """Datasets a, b and c (2 shards of 300 documents each) and each document's length."""
    root = tmp_path_factory.mktemp("stages-corpus")
    return root, write_corpus(root, "abc", records=300)


def recipe(root: Path, **changes: Any) -> Recipe:
    """The base recipe over ``root`` with top-level keys changed (``stages`` included)."""
    raw = copy.deepcopy(BASE)
    raw.update(copy.deepcopy(changes))
    return Recipe.from_dict(raw, base_dir=root)


def batches(
    pipeline: Pipeline,
    steps: int,
    dp: int = 1,
    *,
    resume: Mapping[str, Any] | None = None,
    save_at: int | None = None,
    saved: list[dict[str, Any]] | None = None,
    workers: int = 1,
    runner: str = "thread",
) -> Iterator[tuple[int, str, dict[str, np.ndarray]]]:
    """``(step, digest, global batch as arrays)`` of each step of a simulated run."""
    with WorkerPool(workers, runner) as pool:
        for result, mbs in simulate(
            pipeline,
            dp,
            steps,
            pool=pool,
            resume_state=resume,
            save_at=save_at,
            on_save=saved.append if saved is not None else None,
            keep_batches=True,
        ):
            assert mbs is not None
            yield (
                result.step,
                result.digest,
                {k: torch.cat([m[k] for m in mbs]).numpy() for k in mbs[0]},
            )


def digests(pipeline: Pipeline, steps: int, dp: int = 1, **kw: Any) -> list[str]:
    """The digest of each step."""
    return [d for _, d, _ in batches(pipeline, steps, dp, **kw)]
