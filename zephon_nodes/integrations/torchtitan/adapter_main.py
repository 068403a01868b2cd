"""TorchTitan main adapter: a ``BaseDataLoader`` of flat token batches, elastic in dp.

TorchTitan's main branch (the Grain-era data API) builds the loader with
``config.dataloader.build(dp_world_size=, dp_rank=, tokenizer=, max_context_length=,
num_tokens_per_batch=)`` and takes ``gradient_accumulation_steps =
num_tokens_per_train_step / (num_tokens_per_microbatch_per_dp_rank * dp)`` batches per
optimizer step. A batch is ``({"input": [T], "positions": [T]}, labels [T])``.

Here a micro-batch is ``rows = num_tokens_per_batch / seq_len`` packed samples of the
recipe, concatenated: ``positions`` restart at every document (the packer's positions, so
attention never crosses a sample), labels use TorchTitan's ``IGNORE_INDEX``. The ranks own
contiguous lane blocks and yield their rows in lane order, so concatenating every rank's
micro-batches of one optimizer step (rank order, then micro-batch order) gives the step's
``[G, S]`` global batch of ``zephon digest`` flattened row by row (docs/digest.md).

The state is the DCP keys of :mod:`zephon_nodes.state.dcp`, the same as the 0.3.0
adapter's, with ``local_batch_size`` = ``rows``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torchtitan.components.data.loader import BaseDataLoader, DataloaderExhaustedError
from torchtitan.components.loss import IGNORE_INDEX

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.integrations.torchtitan.common import check_config, check_stages
from zephon_nodes.integrations.torchtitan.lanes import LaneLoader
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import SETTINGS, check_setting

__all__ = ["ZephonDataLoader", "check_launch", "trainer_step_tokens"]

logger = logging.getLogger("zephon_nodes.integrations.torchtitan")

_MICRO = "training.num_tokens_per_microbatch_per_dp_rank"
_STEP = "training.num_tokens_per_train_step"
_CONTEXT = "training.max_context_length"


def _multiples(unit: int, limit: int, count: int = 6) -> list[int]:
    return [unit * k for k in range(1, count + 1) if unit * k <= max(limit, unit)]


def check_launch(
    recipe: Recipe,
    *,
    dp_world_size: int,
    dp_rank: int,
    max_context_length: int,
    num_tokens_per_batch: int,
    num_tokens_per_train_step: int | None = None,
) -> int:
    """Check that a TorchTitan main job's sizes fit the recipe; say what to change if not.

    Args:
        recipe: The recipe.
        dp_world_size: Data-parallel size (TorchTitan's batch mesh).
        dp_rank: This rank's data-parallel index.
        max_context_length: ``training.max_context_length``.
        num_tokens_per_batch: ``training.num_tokens_per_microbatch_per_dp_rank``.
        num_tokens_per_train_step: ``training.num_tokens_per_train_step`` as the Trainer
            resolved it (None: unknown, not checked).

    Returns:
        The packed samples per micro-batch (``num_tokens_per_batch / seq_len``).

    Raises:
        RecipeError: Naming the TorchTitan setting and the recipe field, both values.
    """
    L, G, S = recipe.num_lanes, recipe.global_batch_size, recipe.seq_len
    check_setting("dp_world_size", dp_world_size)
    check_setting(_CONTEXT, max_context_length, bound=SETTINGS["seq_len"])
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
    if max_context_length < S:
        raise RecipeError(
            f"the recipe's seq_len={S} is longer than {_CONTEXT}={max_context_length}: set "
            f"--training.max-context-length {S} (seq_len is part of the recipe)"
        )
    if num_tokens_per_batch < 1 or num_tokens_per_batch % S:
        raise RecipeError(
            f"{_MICRO}={num_tokens_per_batch} must be a multiple of the recipe's seq_len={S} "
            f"(a micro-batch is whole packed samples): set it to one of "
            f"{_multiples(S, num_tokens_per_batch)}"
        )
    rows = num_tokens_per_batch // S
    check_setting(_MICRO + " / seq_len", rows, bound=SETTINGS["local_batch_size"])
    share = G // dp_world_size
    if share % rows:
        ok = [b * S for b in range(1, share + 1) if share % b == 0]
        raise RecipeError(
            f"each rank takes global_batch_size / dp_world_size = {G} / {dp_world_size} = "
            f"{share} samples per step, which must be a multiple of {_MICRO} / seq_len = "
            f"{num_tokens_per_batch} / {S} = {rows}: set "
            f"--training.num-tokens-per-microbatch-per-dp-rank to one of {ok}"
        )
    if num_tokens_per_train_step is not None and num_tokens_per_train_step % (G * S):
        raise RecipeError(
            f"{_STEP}={num_tokens_per_train_step} must be the recipe's global batch "
            f"global_batch_size x seq_len = {G} x {S} = {G * S} tokens (or a multiple): set "
            f"--training.num-tokens-per-train-step {G * S}"
        )
    return rows


def trainer_step_tokens() -> int | None:
    """``num_tokens_per_train_step`` of the TorchTitan ``Trainer`` building this loader.

    TorchTitan passes the loader only the micro-batch size; the optimizer step size is
    known to the ``Trainer``, which has resolved it (``gradient_accumulation_steps``) before
    it builds the loader. This finds the ``Trainer.__init__`` frame on the call stack;
    None when the loader is built by other code (tests, your own loop).
    """
    frame = sys._getframe(1)
    while frame is not None:
        me = frame.f_locals.get("self")
        accum = getattr(me, "gradient_accumulation_steps", None)
        config = getattr(me, "config", None)
        training = getattr(config, "training", None)
        if frame.f_code.co_name == "__init__" and isinstance(accum, int) and training:
            micro = int(training.num_tokens_per_microbatch_per_dp_rank)
            pp = int(getattr(me, "num_pp_microbatches", 1) or 1)
            dp = frame.f_locals.get("dp_degree")
            if isinstance(dp, int):
                return accum * micro * pp * dp
        frame = frame.f_back  # type: ignore[assignment]
    return None


class ZephonDataLoader(LaneLoader, BaseDataLoader):
    """TorchTitan main dataloader over a zephon-nodes recipe: same global batches at any dp.

    Built by TorchTitan's trainer through ``config.dataloader.build(...)``. Each call of the
    iterator returns one flat micro-batch ``({"input": [T], "positions": [T]}, labels [T])``
    of ``T = num_tokens_per_batch`` tokens: ``T / seq_len`` packed samples of the lanes this
    rank owns (a contiguous block of ``num_lanes / dp_world_size``), concatenated.

    Args:
        config: The loader's settings (recipe path and physical settings).
        dp_world_size: Data-parallel size (TorchTitan's batch mesh).
        dp_rank: This rank's data-parallel index.
        tokenizer: TorchTitan's tokenizer; checked against the recipe's, never used to
            tokenize.
        max_context_length: ``training.max_context_length``; at least the recipe's seq_len.
        num_tokens_per_batch: ``training.num_tokens_per_microbatch_per_dp_rank``; a multiple
            of the recipe's seq_len.
        **kwargs: Ignored (TorchTitan's build arguments of later versions).

    Raises:
        RecipeError: If the recipe cannot be loaded or does not fit the job (messages name
            both settings).
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

        repeat: bool = True
        """Set by TorchTitan's validator (0.3.0's ``infinite``); False refuses an endless
        recipe (work.epochs='inf') and ends with the data."""

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

    STEP_SETTING = _STEP

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any = None,
        max_context_length: int,
        num_tokens_per_batch: int,
        **kwargs: Any,
    ) -> None:
        del kwargs
        if not config.recipe:
            raise RecipeError("ZephonDataLoader needs a recipe: set --dataloader.recipe PATH.toml")
        self.config = config
        recipe = Recipe.from_toml(config.recipe)
        check_stages(recipe, f"{_MICRO} and {_STEP}")
        rows = check_launch(
            recipe,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            max_context_length=max_context_length,
            num_tokens_per_batch=num_tokens_per_batch,
            num_tokens_per_train_step=trainer_step_tokens(),
        )
        self.num_tokens_per_batch = num_tokens_per_batch
        self._setup(
            recipe,
            tokenizer=tokenizer,
            dp_world_size=dp_world_size,
            dp_rank=dp_rank,
            local_batch_size=rows,
            infinite=("dataloader.repeat", config.repeat),
        )

    def __iter__(self) -> Iterator[tuple[dict[str, Any], torch.Tensor]]:
        """Yield flat micro-batches; raise ``DataloaderExhaustedError`` where the data ends.

        Finite data ends after the same step on every rank (the ranks agree on it), so the
        trainer's collectives never wait for a rank that stopped.
        """
        for batch in self._micro_batches():
            labels = batch["labels"].reshape(-1)
            if IGNORE_INDEX != -100:
                labels = torch.where(labels == -100, IGNORE_INDEX, labels)
            inputs = {
                "input": batch["input"].reshape(-1),
                "positions": batch["positions"].reshape(-1),
            }
            yield inputs, labels
        raise DataloaderExhaustedError(
            f"the recipe's data ended after step {self._state['step']} (on every rank)"
        )
