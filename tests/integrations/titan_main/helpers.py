"""Helpers of the TorchTitan main tests: build the loader as the main Trainer does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.integrations.tt_helpers import Row, step_digest
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.recipe import Recipe
from zephon_nodes.verification.simulate import simulate

SEQ = 64  # the default test recipe's seq_len (G=8, 4 lanes)
SPL = 2  # samples per lane per step


def build(
    recipe: Path | str, world: int, rank: int, rows: int = 2, *, seq: int = SEQ, **cfg: Any
) -> Any:
    """Build the main adapter the way TorchTitan main's Trainer does (one worker); a
    micro-batch is ``rows`` packed samples of ``seq`` tokens."""
    from zephon_nodes.integrations.torchtitan import ZephonDataLoader

    cfg.setdefault("num_workers", 1)
    config = ZephonDataLoader.Config(recipe=str(recipe), **cfg)
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=None,
        max_context_length=2048,
        num_tokens_per_batch=rows * seq,
    )


def unflatten(batch: tuple[dict[str, torch.Tensor], torch.Tensor], seq: int = SEQ) -> list[Row]:
    """Cut a flat micro-batch back into its packed samples (rows of ``seq`` tokens)."""
    inputs, labels = batch
    n = labels.numel() // seq
    out = []
    for i in range(n):
        cut = slice(i * seq, (i + 1) * seq)
        out.append(
            {
                "input": inputs["input"][cut].numpy(),
                "labels": labels[cut].numpy(),
                "positions": inputs["positions"][cut].numpy(),
            }
        )
    return out


def optimizer_steps(
    loaders: list[Any], iters: list[Any], steps: int, accum: int, spl: int = SPL, seq: int = SEQ
) -> list[str]:
    """Digest each optimizer step: every rank's ``accum`` micro-batches, rank order first."""
    out = []
    for _ in range(steps):
        flat = [[next(it) for _ in range(accum)] for it in iters]
        # The step's tokens: ranks in order, then micro-batches in order, as one [G*S] run.
        tokens = torch.cat([b[0]["input"] for per_rank in flat for b in per_rank])
        rows = [r for per_rank in flat for b in per_rank for r in unflatten(b, seq)]
        glued = np.concatenate([r["input"] for r in rows])
        assert np.array_equal(tokens.numpy(), glued)
        out.append(step_digest([rows], spl))
    return out


def expected_digests(recipe: Path, steps: int) -> list[str]:
    """The recipe's global batches by the core's in-process simulation (no provenance)."""
    pipeline = Pipeline(Recipe.from_toml(recipe), provenance=False)
    return [r.digest for r, _ in simulate(pipeline, 2, steps, num_workers=1)]


def union(states: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What DCP stores from several ranks: replicated keys agree, lane keys are unique."""
    out: dict[str, torch.Tensor] = {}
    for sd in states:
        for k, v in sd.items():
            lane = k.startswith(("lane_", "mixture_lane_", "stage_lane_"))
            assert not (lane and k in out), f"lane key {k} saved twice"
            if k in out:
                assert torch.equal(out[k], v), f"replicated key {k} differs between ranks"
            out[k] = v.clone()
    return out


def dcp_load(loader: Any, stored: dict[str, torch.Tensor]) -> None:
    """Mimic DCP: ask the new loader for its keys, fill them in place, hand them back."""
    wanted = loader.state_dict()
    for k, v in wanted.items():
        if k not in stored:
            raise KeyError(f"Missing key in checkpoint state_dict: dataloader.{k}")
        assert v.shape == stored[k].shape and v.dtype == stored[k].dtype, k
        v.copy_(stored[k])
    loader.load_state_dict(wanted)
