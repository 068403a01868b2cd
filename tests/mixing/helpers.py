"""Corpora, recipes and measurements shared by the mixing tests."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes import (
    DatasetSpec,
    Pipeline,
    Recipe,
    ShuffleSpec,
    TokenizerSpec,
    WorkSpec,
    simulate,
)
from zephon_nodes.recipe import MixtureSpec, PackSpec

# Each dataset writes its own letters, so the byte tokenizer's ids tell which dataset a
# label token came from without trusting the library's provenance field.
ALPHABETS = ("abcdefgh", "nopqrstu", "IJKLMNOP")


def texts(alphabet: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """``n`` texts of ``lo..hi`` characters drawn from ``alphabet`` (no spaces)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def memory_dataset(name: str, docs: Sequence[str], **kw: Any) -> DatasetSpec:
    return DatasetSpec(name, records=tuple({"text": t} for t in docs), **kw)


def write_jsonl(path: Path, docs: Sequence[str], field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for t in docs:
            f.write(json.dumps({field: t}) + "\n")
    return path


def base_recipe(datasets: Sequence[DatasetSpec], **kw: Any) -> Recipe:
    """A small recipe over the byte tokenizer without bos/eos (labels are text bytes)."""
    args: dict[str, Any] = {
        "datasets": tuple(datasets),
        "tokenizer": TokenizerSpec(kind="bytes", add_bos=False, add_eos=False),
        "seed": 5,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 64,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=4, epochs=1),
        "shuffle": ShuffleSpec(3),
    }
    args.update(kw)
    return Recipe(**args)


def two_length_recipe(w_short: float, *, seed: int = 5, **kw: Any) -> Recipe:
    """Short (10-30 chars) and long (200-400 chars) documents, both repeating."""
    short = memory_dataset(
        "short", texts(ALPHABETS[0], 3000, 10, 30, seed), weight=w_short, on_exhausted="repeat"
    )
    long_ = memory_dataset(
        "long",
        texts(ALPHABETS[1], 600, 200, 400, seed + 1),
        weight=1 - w_short,
        on_exhausted="repeat",
    )
    args: dict[str, Any] = {
        "seq_len": 256,
        "global_batch_size": 16,
        "num_lanes": 8,
        "flush_every": 4,
        "work": WorkSpec(chunk_size=8, epochs=1),
        "shuffle": ShuffleSpec(0),
        "seed": seed,
    }
    args.update(kw)
    return base_recipe([short, long_], **args)


def label_counts_by_alphabet(batches: Sequence[dict[str, Any]], n: int = 2) -> np.ndarray:
    """Non-padding label tokens per alphabet (byte tokenizer: id = byte + 3)."""
    lookup = np.full(512, -1, dtype=np.int64)
    for k, alphabet in enumerate(ALPHABETS[:n]):
        for ch in alphabet.encode():
            lookup[ch + 3] = k
    counts = np.zeros(n, dtype=np.int64)
    for mb in batches:
        labels = mb["labels"].numpy().ravel()
        labels = labels[labels != -100]
        which = lookup[labels]
        assert (which >= 0).all(), "a label token of no known alphabet"
        counts += np.bincount(which, minlength=n)[:n]
    return counts


def run_batches(pipeline: Pipeline, steps: int, world: int = 1, **kw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _, mbs in simulate(pipeline, world, steps, keep_batches=True, **kw):
        assert mbs is not None
        out.extend(mbs)
    return out


def digests(pipeline: Pipeline, world: int, steps: int, **kw: Any) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, world, steps, **kw)]


def elastic_check(recipe: Recipe, steps: int = 12, save_at: int = 5) -> list[str]:
    """Digests at dp 1 inline == every dp size, worker count and a resume on another dp."""
    pipeline = Pipeline(recipe)
    reference = digests(pipeline, 1, steps, num_workers=0)
    assert len(reference) == steps, "the recipe ran out of data too early for the check"
    L = recipe.num_lanes
    for world in [w for w in (1, 2, 4, 8) if L % w == 0]:
        for workers in (0, 2):
            got = digests(pipeline, world, steps, num_workers=workers)
            assert got == reference, (world, workers)
    saved: dict[str, Any] = {}
    before = digests(pipeline, L, save_at, save_at=save_at, on_save=saved.update)
    assert before == reference[:save_at]
    after = digests(Pipeline(recipe), 2 if L % 2 == 0 else 1, steps - save_at, resume_state=saved)
    assert after == reference[save_at:]
    return reference


__all__ = [
    "ALPHABETS",
    "MixtureSpec",
    "PackSpec",
    "base_recipe",
    "digests",
    "elastic_check",
    "label_counts_by_alphabet",
    "memory_dataset",
    "run_batches",
    "texts",
    "two_length_recipe",
    "write_jsonl",
]
