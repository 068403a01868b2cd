"""Cross-adapter checkpoints: one written by each TorchTitan adapter, read by the other.

``tests/integrations/data/cross/`` holds a small recipe (bytes tokenizer) and two real DCP
checkpoints of its loader state after 2 steps at dp 2: ``ckpt_030`` written by the 0.3.0
adapter (in the 0.3.0 venv) and ``ckpt_main`` by the main adapter (in .venv-titan-main).
Each venv's tests load the other adapter's checkpoint and check that it still writes its
own byte for byte. Regenerate (in each venv) with::

    python -m tests.integrations.cross_checkpoint
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

DATA = Path(__file__).parent / "data" / "cross"
RECIPE = DATA / "recipe.toml"
SEQ, ROWS, SAVE_AT = 32, 2, 2


def build(world: int, rank: int, rows: int = ROWS) -> Any:
    """The installed adapter at ``world`` ranks, ``rows`` samples per micro-batch."""
    from zephon_nodes.integrations.torchtitan import API, ZephonDataLoader

    config = ZephonDataLoader.Config(recipe=str(RECIPE), num_workers=0, prefetch=0)
    if API == "main":
        return config.build(
            dp_world_size=world,
            dp_rank=rank,
            tokenizer=None,
            max_context_length=SEQ,
            num_tokens_per_batch=rows * SEQ,
        )
    return config.build(
        dp_world_size=world,
        dp_rank=rank,
        tokenizer=None,
        seq_len=SEQ,
        local_batch_size=rows,
        snapshot_every_n_steps=None,
    )


def rows_of(batch: tuple[dict[str, torch.Tensor], torch.Tensor]) -> list[dict[str, Any]]:
    """A micro-batch of either adapter as rows of ``SEQ`` tokens."""
    inputs, labels = batch
    fields = {"input": inputs["input"], "labels": labels, "positions": inputs["positions"]}
    flat = {k: v.reshape(-1, SEQ) for k, v in fields.items()}
    return [{k: v[i].numpy() for k, v in flat.items()} for i in range(flat["input"].shape[0])]


def steps(loaders: list[Any], n: int) -> list[str]:
    """Digest ``n`` recipe steps taken from every rank (rank order, micro-batch order)."""
    from tests.integrations.tt_helpers import step_digest

    its = [iter(x) for x in loaders]
    micro = 8 // len(loaders) // loaders[0].local_batch_size  # G / dp / rows
    out = []
    for _ in range(n):
        rows = [r for it in its for _ in range(micro) for r in rows_of(next(it))]
        out.append(step_digest([rows], 2))
    return out


def expected(n: int) -> list[str]:
    """The recipe's first ``n`` global batches (the core's simulation, no provenance)."""
    from zephon_nodes.engine.pipeline import Pipeline
    from zephon_nodes.recipe import Recipe
    from zephon_nodes.verification.simulate import simulate

    pipeline = Pipeline(Recipe.from_toml(RECIPE), provenance=False)
    return [r.digest for r, _ in simulate(pipeline, 2, n, num_workers=0)]


def state_after_steps() -> dict[str, torch.Tensor]:
    """The union of the two ranks' states after ``SAVE_AT`` steps (what DCP stores)."""
    loaders = [build(2, r) for r in range(2)]
    steps(loaders, SAVE_AT)
    out: dict[str, torch.Tensor] = {}
    for x in loaders:
        out.update(x.state_dict())
        x.close()
    return out


def save(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write ``{"dataloader": state}`` as a DCP checkpoint (no process group)."""
    import torch.distributed.checkpoint as dcp

    shutil.rmtree(path, ignore_errors=True)
    dcp.save({"dataloader": state}, checkpoint_id=str(path), no_dist=True)


def load(path: Path, loader: Any) -> None:
    """Load a DCP checkpoint into ``loader`` as TorchTitan's checkpointer does."""
    import torch.distributed.checkpoint as dcp

    dcp.load({"dataloader": loader}, checkpoint_id=str(path), no_dist=True)


def read(path: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read the stored tensors of the keys of ``like``."""
    import torch.distributed.checkpoint as dcp

    out = {k: torch.empty_like(v) for k, v in like.items()}
    dcp.load({"dataloader": out}, checkpoint_id=str(path), no_dist=True)
    return out


if __name__ == "__main__":
    from zephon_nodes.integrations.torchtitan import API

    target = DATA / ("ckpt_main" if API == "main" else "ckpt_030")
    save(target, state_after_steps())
    print(target)
