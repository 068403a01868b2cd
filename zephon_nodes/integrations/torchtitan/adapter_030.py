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
from typing import Any, Literal

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan.common import check_config, check_stages
from zephon_nodes.integrations.torchtitan.lanes import LaneLoader
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
    L, G = recipe.num_lanes, recipe.global_batch_size
    check_setting("dp_world_size", dp_world_size)
    check_setting("training.local_batch_size", local_batch_size, bound=SETTINGS["local_batch_size"])
    check_setting("training.seq_len", seq_len, bound=SETTINGS["seq_len"])
    if dp_world_size < 1 or not 0 <= dp_rank < dp_world_size:
        raise RecipeError(f"{dp_rank=} must be in [0, {dp_world_size=})")
    if L % dp_world_size:
        divisors = [d for d in range(1, L + 1) if L % d == 0]
        raise RecipeError(
            f"the recipe's num_lanes={L} must be a multiple of the data-parallel size "
            f"{dp_world_size=} (dp_replicate x dp_shard): run at a dp size in {divisors}, or "
            f"write a new recipe whose num_lanes is a common multiple of every dp size you "
            f"plan to use (a new num_lanes is a new data stream)"
        )
    if G % L:
        raise RecipeError(f"the recipe's global_batch_size={G} must be a multiple of num_lanes={L}")
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
    class Config(BaseDataLoader.Config):
        """Settings of :class:`ZephonDataLoader`: the recipe, then physical settings only."""

        recipe: str = ""
        """Path of the zephon-nodes recipe TOML that defines the data (required)."""

        num_workers: int = 2
        """Worker threads or processes shared by this rank's lanes (0 runs inline)."""

        runner: Literal["thread", "process", "ray"] = "thread"
        """Where operators run: threads (GIL-releasing tokenizers), spawned processes, or Ray
        tasks on a Ray cluster (``RAY_ADDRESS``; needs the ``ray`` extra)."""

        lookahead: int = 4
        """Work items each lane submits to the workers ahead of the one it reads."""

        operator_workers: str = ""
        """Per-operator pools, e.g. ``"decode=process:6,tokenize=thread:2"`` (default: none,
        every operator on the shared pool); created and closed by this loader."""

        prefetch: int = 2
        """Micro-batches prepared ahead in a background thread (0 disables prefetching)."""

        worker_timeout_s: float = 300.0
        """Longest wait for one work item before the loader raises WorkerError."""

        check_tokenizer: bool = True
        """Refuse a TorchTitan tokenizer whose vocab size or bos/eos ids differ."""

        infinite: bool = True
        """Set by TorchTitan's validator; False refuses an endless recipe (work.epochs='inf')."""

        cache_limit: str = ""
        """Node cache size shared by the node's ranks, e.g. "50G" (the settings' cache_limit;
        empty: ZEPHON_CACHE_LIMIT, else the default share of the free disk). Physical."""

        token_cache: str = ""
        """Reuse tokenized work items across runs: "on", "off", or a storage URI shared by the
        cluster behind each node's cache (empty: ZEPHON_TOKEN_CACHE, else off). Physical:
        never changes a batch (docs/storage.md)."""

        token_cache_limit: str = ""
        """Token cache size, e.g. "16G" (empty: ZEPHON_TOKEN_CACHE_LIMIT, else 16G)."""

        max_decisions: int = -1
        """Room for set_mixture decisions in the checkpoint (fixed-shape DCP tensors); -1:
        256 for a recipe of several datasets, 0 (no mixture keys) for one dataset."""

        dump_batches: str = ""
        """Folder for this rank's rows of every step (step-S.rank-R.npz; zephon digest-dump)."""

        relane_from: int = 0
        """Lane count of the checkpoint to re-lane at load (0: never; docs/lanes.md)."""

        relaned: bool = False
        """The checkpoint to load was written after a re-lane (it carries a lineage)."""

        max_lineage_bytes: int = 65536
        """Room for a re-lane's lineage in the checkpoint (about 12 bytes per old lane)."""

        amended: bool = False
        """The checkpoint to load was written after a recipe change (``zephon amend``, or a
        stage of another recipe): it carries a stage section. A recipe with stages reserves
        its keys without this."""

        max_stage_bytes: int = 16384
        """Room for a stage section's shared part in the checkpoint (its dataset names,
        streams and amendments: about 40 bytes per dataset, 90 per amendment)."""

        max_stage_datasets: int = 32
        """Room per lane for the datasets a changing recipe has read (8 bytes each)."""

        amend_from: str = ""
        """Recipe TOML the checkpoint to load was written with, to amend it at load to this
        job's recipe, as ``zephon amend`` does (empty: never; docs/changing-recipes.md)."""

        def __post_init__(self) -> None:
            check_config(self)

    STEP_SETTING = "training.global_batch_size"

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
