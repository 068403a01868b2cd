"""The trainer's optimizer step is checked against the recipe's global batch as it happens.

TorchTitan passes the loader only its micro-batch size; the loader counts the micro-batches
the trainer takes before PyTorch's optimizer-step hook fires (no call-stack inspection).
Runs with the installed TorchTitan's adapter (0.3.0 here, main in ``make test-titan-main``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan import API, ZephonDataLoader

SEQ = 64  # the test recipe's seq_len (G=8, 4 lanes)


def build(recipe: Path, world: int, rank: int, rows: int, **settings: Any) -> Any:
    """Build the installed adapter as its Trainer does: ``rows`` samples per micro-batch."""
    settings.setdefault("num_workers", 1)
    config = ZephonDataLoader.Config(recipe=str(recipe), **settings)
    if API == "main":
        sizes: dict[str, Any] = {"max_context_length": SEQ, "num_tokens_per_batch": rows * SEQ}
    else:
        sizes = {"seq_len": SEQ, "local_batch_size": rows}
    return config.build(dp_world_size=world, dp_rank=rank, tokenizer=None, **sizes)


def step_message(micro: int, rows: int, world: int) -> str:
    samples = micro * rows * world
    if API == "main":
        return (
            rf"training.num_tokens_per_train_step={samples * SEQ} tokens, which is not a "
            rf"multiple of the recipe's global_batch_size=8 .*--training.num-tokens-per-"
            rf"train-step {8 * SEQ}"
        )
    return (
        rf"training.global_batch_size={samples} samples, which is not a multiple of the "
        rf"recipe's global_batch_size=8 .*--training.global-batch-size 8"
    )


@pytest.fixture
def optimizer() -> Iterator[torch.optim.Optimizer]:
    yield torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def test_half_a_global_batch_per_optimizer_step_is_refused(
    recipe_path: Path, optimizer: torch.optim.Optimizer
) -> None:
    loader = build(recipe_path, 2, 0, rows=2)  # a recipe step is 2 micro-batches per rank
    try:
        optimizer.step()  # TorchTitan's state initialization: before any batch, not counted
        it = iter(loader)
        next(it)
        with pytest.raises(RecipeError, match=step_message(1, 2, 2)):
            optimizer.step()
    finally:
        loader.close()


def test_whole_global_batches_per_optimizer_step_pass(
    recipe_path: Path, optimizer: torch.optim.Optimizer
) -> None:
    loader = build(recipe_path, 1, 0, rows=2)  # a recipe step is 4 micro-batches at dp 1
    try:
        it = iter(loader)
        with torch.no_grad():  # a validator's reads are not the trainer's step
            next(it)
        for _ in range(2):  # two optimizer steps of two global batches each
            for _ in range(8):
                next(it)
            optimizer.step()
        assert loader.step_check.checked == 8
    finally:
        loader.close()


def test_a_closed_loader_leaves_no_hook(
    recipe_path: Path, optimizer: torch.optim.Optimizer
) -> None:
    loader = build(recipe_path, 2, 0, rows=2)
    it = iter(loader)
    next(it)
    loader.close()
    optimizer.step()  # would be refused if the closed loader still listened
    assert loader.step_check.checked is None
