"""What both TorchTitan adapters share: the state codec's wrapper, checks, the metrics registry.

Nothing here imports TorchTitan: the 0.3.0 and the main adapter both build on it.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.metrics import flatten_metrics
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.state.dcp import decode_dcp_state
from zephon_nodes.state.schema import FORMAT

__all__ = [
    "check_agreement",
    "check_lanes",
    "check_stages",
    "check_tokenizer",
    "from_dcp_state",
    "loader_metrics",
    "register_loader",
    "resolve_max_decisions",
]

AUTO_DECISIONS = 256
"""Room for set_mixture decisions that ``max_decisions = -1`` gives a recipe of several datasets."""

# Loaders alive in this process, whose metrics TorchTitan's metrics processor logs.
_LIVE_LOADERS: weakref.WeakSet[Any] = weakref.WeakSet()
_SERIAL = itertools.count()


def register_loader(loader: Any) -> int:
    """Remember a live loader for :func:`loader_metrics`; return its serial number."""
    _LIVE_LOADERS.add(loader)
    return next(_SERIAL)


def loader_metrics(prefix: str = "zephon") -> dict[str, float]:
    """Metrics of the live ``ZephonDataLoader`` (training, not validation), flattened.

    Keys are ``zephon/data_wait_s``, ``zephon/operators/tokenize/busy_s``, ...; empty when
    no loader is alive. With several loaders (a validator's too) the first one built (the
    trainer's) is reported.
    """
    loaders = sorted(_LIVE_LOADERS, key=lambda x: x.serial)
    return flatten_metrics(loaders[0].metrics(), prefix) if loaders else {}


def from_dcp_state(
    sd: Mapping[str, Any],
    pipeline: Pipeline,
    lanes: list[int],
    *,
    dp_world_size: int,
    local_batch_size: int,
    max_decisions: int = 0,
    lineage_bytes: int = 0,
    stage_room: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """Convert loaded DCP tensors back to a JSON-safe multiplexer state for ``lanes``.

    :func:`zephon_nodes.state.dcp.decode_dcp_state` with the state's ``format`` added;
    see there for the arguments and the errors.
    """
    state = decode_dcp_state(
        sd,
        pipeline,
        lanes,
        dp_world_size=dp_world_size,
        local_batch_size=local_batch_size,
        max_decisions=max_decisions,
        lineage_bytes=lineage_bytes,
        stage_room=stage_room,
    )
    return {"format": FORMAT, **state}


def resolve_max_decisions(max_decisions: int, recipe: Recipe) -> int:
    """The room for ``set_mixture`` decisions in the checkpoint (fixed-shape DCP tensors).

    ``-1`` (the default) is 0 for a recipe of one dataset (it has no mixture to change, so
    its checkpoint carries no mixture keys and a lane costs its 32 bytes) and
    :data:`AUTO_DECISIONS` for a recipe of several; any other value is used as given (0 for
    a static mixture of several datasets keeps the checkpoint small too).
    """
    if max_decisions >= 0:
        return max_decisions
    return AUTO_DECISIONS if len(recipe.datasets) > 1 else 0


def check_lanes(recipe: Recipe, dp_world_size: int, dp_rank: int) -> None:
    """The one check of a TorchTitan job's data-parallel layout against the recipe's lanes.

    Raises:
        RecipeError: Naming the dp size and the dp sizes the recipe's ``num_lanes`` allows
            (or the rank, or the recipe's ``global_batch_size``).
    """
    L, G = recipe.num_lanes, recipe.global_batch_size
    check_setting("dp_world_size", dp_world_size)
    if not 0 <= dp_rank < dp_world_size:
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


def check_stages(recipe: Recipe, job: str) -> None:
    """Refuse a recipe whose stages change what a TorchTitan job fixes for its whole run.

    A TorchTitan job has one sequence length and one optimizer step (its own training
    config); stages that change only the datasets, weights, shuffle, operators or packing
    mode run inside the job.

    Args:
        recipe: The recipe the loader reads.
        job: The job's settings of both, for the message (e.g. ``"training.seq_len and
            training.global_batch_size"``).

    Raises:
        RecipeError: Naming the first stage that changes ``seq_len`` or
            ``global_batch_size`` and what to do instead.
    """
    for i, stage in enumerate(recipe.stages):
        for field in ("seq_len", "global_batch_size"):
            before, after = getattr(recipe, field), getattr(stage.recipe, field)
            if before != after:
                raise RecipeError(
                    f"stages[{i}] (start_step={stage.start_step}) changes {field} from "
                    f"{before} to {after}, which a TorchTitan job keeps for its whole run "
                    f"({job}): end the job after step {stage.start_step} and resume its "
                    f"checkpoint in a job with the new training config and the stage's recipe, "
                    f"with dataloader.amend_from = this recipe (the loader amends it at load)"
                )


def check_agreement(step: int, index: int, weights: Mapping[str, float], group: Any = None) -> None:
    """Check that every rank of ``group`` makes decision ``index`` after ``step`` alike.

    One ``all_gather`` of ``2 + D`` float64 values; nothing happens when
    ``torch.distributed`` is not initialized.

    Raises:
        RecipeError: Naming a rank that disagrees and both weight sets (and steps).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    names = list(weights)
    mine = torch.tensor([float(step), float(index), *weights.values()], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    me = dist.get_rank(group)
    for rank, theirs in enumerate(gathered):
        if not torch.equal(theirs.cpu(), mine.cpu()):
            t = theirs.cpu().tolist()
            raise RecipeError(
                f"ranks disagree on mixture decision {index}: rank {me} decided "
                f"{dict(weights)} after step {step}, rank {rank} decided "
                f"{dict(zip(names, t[2:], strict=True))} after step {int(t[0])} (decision "
                f"{int(t[1])}); every rank must call set_mixture with the same weights "
                f"after the same step"
            )


def check_tokenizer(recipe: Recipe, tokenizer: Any) -> None:
    """Refuse a TorchTitan tokenizer that does not describe the recipe's vocabulary.

    The recipe's tokenizer produces every token id the loader yields; TorchTitan's
    tokenizer (built from ``--hf-assets-path``) is not used by the loader. They must be
    the same vocabulary: equal vocabulary size, and equal bos/eos ids where TorchTitan's
    tokenizer defines them.

    Raises:
        RecipeError: Naming the first property that differs.
    """
    if tokenizer is None:
        return
    ours = load_tokenizer(recipe.tokenizer)
    where = f"recipe tokenizer ({recipe.tokenizer.kind}"
    where += f" {recipe.tokenizer.path})" if recipe.tokenizer.path else ")"
    theirs_vocab = None
    if hasattr(tokenizer, "get_vocab_size"):
        theirs_vocab = int(tokenizer.get_vocab_size())
    if theirs_vocab is not None and theirs_vocab != ours.vocab_size:
        raise RecipeError(
            f"TorchTitan's tokenizer (--hf-assets-path) has vocab_size={theirs_vocab}, the "
            f"{where} has {ours.vocab_size}: both must be the same vocabulary (the recipe's "
            f"tokenizer produces the ids; TorchTitan's describes them to the model)"
        )
    for name in ("bos_id", "eos_id"):
        theirs = getattr(tokenizer, name, None)
        if theirs is not None and int(theirs) != int(getattr(ours, name)):
            raise RecipeError(
                f"TorchTitan's tokenizer has {name}={theirs}, the {where} has "
                f"{name}={getattr(ours, name)}: both must be the same vocabulary"
            )
