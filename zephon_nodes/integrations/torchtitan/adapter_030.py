"""TorchTitan 0.3.0 adapter: a ``BaseDataLoader`` whose checkpoint resumes at any dp size.

TorchTitan 0.3.0's trainer builds the loader with ``config.dataloader.build(dp_world_size=,
dp_rank=, tokenizer=, seq_len=, local_batch_size=, snapshot_every_n_steps=)``; it yields
TorchTitan's batch format ``({"input": ..., "positions": ...}, labels)``, one micro-batch of
``local_batch_size`` rows per call, ``G / (R * local_batch_size)`` calls per recipe step.

The checkpoint state goes through TorchTitan's own ``CheckpointManager`` (DCP) as the small
tensors of :mod:`zephon_nodes.state.dcp` (the same keys as the main adapter's). On load,
DCP first calls :meth:`ZephonDataLoader.state_dict` on the *new* loader to learn which keys
to read: it lists exactly the lanes this rank owns in the new layout, so a checkpoint
written at dp 2 loads at dp 1, 4, 8, ... (any divisor of ``num_lanes``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan.common import check_lanes, check_stages
from zephon_nodes.integrations.torchtitan.lanes import LaneLoader
from zephon_nodes.integrations.torchtitan.loader_config import LoaderConfig, check_config
from zephon_nodes.integrations.torchtitan.step_check import StepSetting
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import SETTINGS, check_setting

__all__ = ["ZephonDataLoader", "check_launch"]

logger = logging.getLogger("zephon_nodes.integrations.torchtitan")


def check_launch(
    recipe: Recipe, *, dp_world_size: int, dp_rank: int, seq_len: int, local_batch_size: int
) -> None:
    """Check that a TorchTitan job's geometry fits the recipe; say what to change if not.

    Raises:
        RecipeError: Naming the TorchTitan option or recipe field to change.
    """
    G = recipe.global_batch_size
    check_setting("training.local_batch_size", local_batch_size, bound=SETTINGS["local_batch_size"])
    check_setting("training.seq_len", seq_len, bound=SETTINGS["seq_len"])
    check_lanes(recipe, dp_world_size, dp_rank)
    share = G // dp_world_size
    if local_batch_size < 1 or share % local_batch_size:
        ok = [b for b in range(1, share + 1) if share % b == 0]
        raise RecipeError(
            f"each rank takes global_batch_size / dp_world_size = {G} / {dp_world_size} = "
            f"{share} samples per step, which must be a multiple of training.local_batch_size="
            f"{local_batch_size}: set --training.local-batch-size to one of {ok} and "
            f"--training.global-batch-size {G}"
        )
    if seq_len != recipe.seq_len:
        raise RecipeError(
            f"training.seq_len={seq_len} but the recipe's seq_len={recipe.seq_len}: set "
            f"--training.seq-len {recipe.seq_len} (seq_len is part of the recipe)"
        )


class ZephonDataLoader(LaneLoader, BaseDataLoader):
    """TorchTitan dataloader over a zephon-nodes recipe: same global batches at any dp size.

    Built by TorchTitan's trainer through ``config.dataloader.build(...)``. Each call of the
    iterator returns one micro-batch ``({"input", "positions"}, labels)`` of
    ``local_batch_size`` rows; the ``G / dp_world_size`` rows of a rank per recipe step come
    from the lanes it owns (a contiguous block of ``num_lanes / dp_world_size``).

    Args:
        config: The loader's settings (recipe path and physical settings).
        dp_world_size: Data-parallel size (TorchTitan's batch mesh).
        dp_rank: This rank's data-parallel index.
        tokenizer: TorchTitan's tokenizer; checked against the recipe's (see
            :func:`check_tokenizer`), never used to tokenize.
        seq_len: ``training.seq_len``; must equal the recipe's.
        local_batch_size: Rows per micro-batch (``training.local_batch_size``).
        snapshot_every_n_steps: Accepted for TorchTitan; unused (the state is always exact).

    Raises:
        RecipeError: If the recipe cannot be loaded or does not fit the job (messages say
            what to change).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config, LoaderConfig):
        """Settings of :class:`ZephonDataLoader`.

        The shared :class:`LoaderConfig` (the recipe, physical settings, checkpoint
        plumbing) and the switch TorchTitan's validator sets.
        """

        infinite: bool = True
        """Set by TorchTitan's validator; False refuses an endless recipe (work.epochs='inf')."""

        def __post_init__(self) -> None:
            check_config(self)

    STEP = StepSetting("training.global_batch_size", "--training.global-batch-size", tokens=False)

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
        if not config.recipe:
            raise RecipeError("ZephonDataLoader needs a recipe: set --dataloader.recipe PATH.toml")
        if config.dataset or config.dataset_path:
            raise RecipeError(
                f"ZephonDataLoader reads the data named by its recipe; dataloader.dataset="
                f"{config.dataset!r} and dataloader.dataset_path={config.dataset_path!r} "
                f"are not used: leave them empty and put the data in {config.recipe}"
            )
        self.config = config
        recipe = Recipe.from_toml(config.recipe)
        check_stages(recipe, "training.seq_len and training.global_batch_size")
        check_launch(
            recipe,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            seq_len=seq_len,
            local_batch_size=local_batch_size,
        )
        self._setup(
            recipe,
            tokenizer=tokenizer,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            local_batch_size=local_batch_size,
            infinite=("dataloader.infinite", config.infinite),
        )

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        """Yield micro-batches, continuing where the last iteration (or checkpoint) stopped."""
        for batch in self._micro_batches():
            yield {"input": batch["input"], "positions": batch["positions"]}, batch["labels"]
