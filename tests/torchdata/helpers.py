"""Shared recipe and loader stacks of the torchdata tests."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torchdata.nodes import (
    BaseNode,
    Batcher,
    Loader,
    Mapper,
    ParallelMapper,
    Prefetcher,
    Unbatcher,
)

from zephon_nodes import DatasetSpec, Pipeline, Recipe, ShuffleSpec, TokenizerSpec, WorkSpec
from zephon_nodes.verification.digest import digest_microbatches
from zephon_nodes.verification.simulate import simulate


def texts(n: int, seed: int = 0) -> list[str]:
    """Documents of varied length (deterministic)."""
    return [f"doc {i}: " + "lane window " * ((i * 7 + seed) % 11) for i in range(n)]


def recipe(n: int = 160, **kw: Any) -> Recipe:
    """Eight lanes, G=16, short sequences: many steps from little text."""
    base: dict[str, Any] = {
        "datasets": (DatasetSpec("t", records=tuple({"text": t} for t in texts(n))),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 3,
        "num_lanes": 8,
        "global_batch_size": 16,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=3, epochs=1),
        "shuffle": ShuffleSpec(4),
    }
    base.update(kw)
    return Recipe(**base)


def reference(pipeline: Pipeline, steps: int) -> list[str]:
    """Per-step digests of a one-rank inline run."""
    return [r.digest for r, _ in simulate(pipeline, 1, steps, num_workers=0)]


def same(x: Any) -> Any:
    """Identity (module level: picklable for the process ParallelMapper)."""
    return x


def flat(items: list[Any]) -> list[dict[str, torch.Tensor]]:
    """Micro-batches out of a stack's items (a Batcher yields lists of them)."""
    out: list[dict[str, torch.Tensor]] = []
    for x in items:
        out.extend(x if isinstance(x, list) else [x])
    return out


# A wrapper stack around the rank node: root -> root node whose items are micro-batches (or
# lists of them).
STACKS: dict[str, Callable[[BaseNode[Any]], BaseNode[Any]]] = {
    "Prefetcher": lambda n: Prefetcher(n, prefetch_factor=2, snapshot_frequency=3),
    "Mapper": lambda n: Mapper(n, same),
    "ParallelMapper-thread": lambda n: ParallelMapper(
        n, same, num_workers=2, method="thread", snapshot_frequency=3
    ),
    # forkserver, not fork: a fork while other threads of a long test session hold locks
    # (fsspec's IO loop, pools) left workers deadlocked in the full suite. The server imports
    # this module once (see the preload below), so its forked workers start warm.
    "ParallelMapper-process": lambda n: ParallelMapper(
        n,
        same,
        num_workers=2,
        method="process",
        multiprocessing_context="forkserver",
        snapshot_frequency=3,
    ),
    "Batcher": lambda n: Prefetcher(Batcher(n, 2, drop_last=False), 2, snapshot_frequency=1),
    "Batcher-Unbatcher": lambda n: Unbatcher(
        Prefetcher(Batcher(n, 3, drop_last=False), 2, snapshot_frequency=2)
    ),
}


def take_microbatches(loader: Loader[Any], count: int) -> list[dict[str, torch.Tensor]]:
    """Take at least ``count`` micro-batches from a loader's current iteration."""
    out: list[dict[str, torch.Tensor]] = []
    it = iter(loader)
    while len(out) < count:
        out.extend(flat([next(it)]))
    return out


def step_digests(per_rank: list[list[dict[str, torch.Tensor]]], micro: int) -> list[str]:
    """Digest each step from every rank's micro-batches (``micro`` per rank per step)."""
    steps = min(len(mbs) for mbs in per_rank) // micro
    return [
        digest_microbatches([mb for mbs in per_rank for mb in mbs[s * micro : (s + 1) * micro]])
        for s in range(steps)
    ]


def shift(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample transform: shift the input ids by one (a new dict; the input is untouched)."""
    out = dict(sample)
    out["input"] = sample["input"] + 1
    return out


class WindowNumbered(BaseNode[dict[str, Any]]):
    """A user node written like torchdata's examples: numbers the samples it has seen."""

    def __init__(self, source: BaseNode[dict[str, Any]]) -> None:
        super().__init__()
        self.source = source
        self.n = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(initial_state["source"] if initial_state else None)
        self.n = initial_state["n"] if initial_state else 0

    def next(self) -> dict[str, Any]:
        sample = dict(next(self.source))
        self.n += 1
        sample["n"] = np.asarray([self.n], dtype=np.int64)
        return sample

    def get_state(self) -> dict[str, Any]:
        return {"source": self.source.get_state(), "n": self.n}


STAGE_KINDS: dict[str, Callable[[BaseNode[Any]], BaseNode[Any]]] = {
    "Mapper": lambda feed: Mapper(feed, shift),
    "ParallelMapper": lambda feed: ParallelMapper(feed, shift, num_workers=2, in_order=True),
    "Batcher+Unbatcher": lambda feed: Unbatcher(Batcher(feed, 3, drop_last=False)),
    "user node": WindowNumbered,
}


multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
