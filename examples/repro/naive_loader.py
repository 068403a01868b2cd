"""Demo-only: the standard rank-sharded loader, as a TorchTitan 0.3.0 dataloader.

Not part of the library, and never to be used for training: it exists so that
``examples/reproduce.py`` can show what zephon-nodes fixes. It is what most training loops
do: the recipe's documents, in the recipe's seeded work-item order, are dealt to ranks by
index (document ``d`` goes to rank ``d % dp_world_size``); each rank tokenizes and packs its
own documents (same tokenizer and TorchTitan-compatible packer as the recipe) and yields
``local_batch_size`` rows per micro-batch. Its global batches are those of
:func:`zephon_nodes.verification.baselines.naive_batches`.

Its checkpoint is one replicated number, the global count of samples consumed. On resume it
*skips*: each rank drops ``consumed / dp_world_size`` samples of its own document stream.
At the same dp size that continues the run exactly; at another dp size it "works" but the
stream it skips through is a different one, so it trains on other batches (some documents
twice, some never).

Use it as TorchTitan's ``--module examples.repro.naive_loader --config
naive_llama3_debugmodel --dataloader.recipe R.toml``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.operators.documents import DocBatch
from zephon_nodes.operators.pack import ConcatPacker
from zephon_nodes.recipe import Recipe

CONSUMED_KEY = "consumed_samples"

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]


def rank_samples(pipeline: Pipeline, dp_world_size: int, dp_rank: int) -> Iterator[dict]:
    """This rank's packed samples: documents ``d`` with ``d % dp_world_size == dp_rank``."""
    packer = ConcatPacker(pipeline.recipe.seq_len, pipeline.pad_id)
    lanes = pipeline.num_lanes
    d = g = 0
    while True:
        item = pipeline.work_source.work(g % lanes, g // lanes)
        if item is None:
            return
        g += 1
        for doc in pipeline.stateless(item).documents():
            if d % dp_world_size == dp_rank:
                lengths = np.asarray([len(doc)], dtype=np.int64)
                yield from packer.feed(DocBatch(doc, lengths))
            d += 1


class RankShardedLoader(BaseDataLoader):
    """Rank-sharded loader that resumes by skipping (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """Settings of :class:`RankShardedLoader`."""

        recipe: str = ""
        """Path of the recipe TOML whose documents, tokenizer and seq_len are used."""

        infinite: bool = True
        """Accepted for TorchTitan's validator; unused."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
    ) -> None:
        recipe = Recipe.from_toml(config.recipe)
        if seq_len != recipe.seq_len:
            raise ValueError(f"{seq_len=} must equal the recipe's seq_len={recipe.seq_len}")
        self.pipeline = Pipeline(recipe)
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.local_batch_size = local_batch_size
        self.consumed = 0  # global samples consumed (same value on every rank)
        self._skip = 0
        self._it: Iterator[dict] | None = None

    def __iter__(self) -> Iterator[Batch]:
        if self._it is None:
            self._it = rank_samples(self.pipeline, self.dp_world_size, self.dp_rank)
            for _ in range(self._skip):
                next(self._it)
        while True:
            rows = []
            for _ in range(self.local_batch_size):
                try:
                    rows.append(next(self._it))
                except StopIteration:
                    return
            self.consumed += self.local_batch_size * self.dp_world_size
            t = {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}
            yield {"input": t["input"], "positions": t["positions"]}, t["labels"]

    def state_dict(self) -> dict[str, Any]:
        return {CONSUMED_KEY: torch.tensor([self.consumed], dtype=torch.int64)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self.consumed = int(state_dict[CONSUMED_KEY][0])
        self._skip = self.consumed // self.dp_world_size
        self._it = None


def naive_llama3_debugmodel() -> Any:
    """TorchTitan's llama3 ``debugmodel`` config fed by :class:`RankShardedLoader`."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    config.dataloader = RankShardedLoader.Config()
    return config
