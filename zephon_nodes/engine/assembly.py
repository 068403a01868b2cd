"""Assemble a recipe's datasets, stateless operator chain and WorkSource."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine import balance
from zephon_nodes.engine.balance import BalancedWorkSource, item_sizes
from zephon_nodes.engine.mixing import MixingWorkSource, estimate_tokens_per_record
from zephon_nodes.engine.work import DatasetWorkSource, WorkSource
from zephon_nodes.engine.wrap import WrappedWorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.formats.pretokenized import check_recipe
from zephon_nodes.io.formats.tar import TarShard
from zephon_nodes.operators.bestfit import LongDocuments
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.filter import Filter
from zephon_nodes.operators.map import Map
from zephon_nodes.operators.parse import ParseJsonl
from zephon_nodes.operators.tokencache import cached_chain
from zephon_nodes.operators.tokenize import Tokenize, Tokenizer, loaded_sha256
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.schedule import WeightSchedule

__all__ = ["refuse_tar", "stateless_chain", "work_source"]


def stateless_chain(recipe: Recipe, tokenizer: Tokenizer, *, trace: bool = False) -> Chain:
    """Return the operators run on the pool for every work item, fused into one call.

    Parse (with each dataset's ``on_error``), the recipe's filters and maps in order,
    tokenize, then (best-fit packing only) the long-document rule. With the token cache on
    (:mod:`zephon_nodes.operators.tokencache`), parse and tokenize read and fill it, unless
    ``trace`` (the cache keeps no record numbers).
    """
    index = {d.name: i for i, d in enumerate(recipe.datasets)}
    skip = frozenset(i for i, d in enumerate(recipe.datasets) if d.on_error == "skip")
    # Pre-tokenized datasets (io/formats/pretokenized.py): their tokenizer must be the
    # recipe's; parse checks their ids against its vocabulary and the tokenizer skips them.
    vocab = int(getattr(tokenizer, "vocab_size", 0) or 0)
    check_recipe(recipe.datasets, recipe.operators, recipe.tokenizer.path, vocab)
    ops: list[Any] = [ParseJsonl(skip=skip, vocab_size=vocab)]
    for spec in recipe.operators:
        ops.append(
            Filter.from_spec(spec, index) if spec.kind == "filter" else Map.from_spec(spec, index)
        )
    custom = tokenizer if recipe.tokenizer.kind == "custom" else None
    sha256 = loaded_sha256(recipe.tokenizer, tokenizer)
    ops.append(Tokenize(recipe.tokenizer, tokenizer=custom, sha256=sha256))
    if recipe.pack.mode == "bestfit":
        ops.append(LongDocuments(recipe.seq_len, recipe.pack.long_documents))
    return Chain(ops if trace else cached_chain(ops, recipe))


def _no_wrap(recipe: Recipe) -> Any:

    return dataclasses.replace(recipe.work, end_of_data="drop_report")


def work_source(
    recipe: Recipe, datasets: Sequence[Dataset], chain: Any
) -> tuple[WorkSource, dict[str, float] | None]:
    """Return the recipe's WorkSource and the token estimate it was planned with.

    One dataset: :class:`DatasetWorkSource` (``on_exhausted = "repeat"`` makes it endless),
    re-dealt by size (:class:`BalancedWorkSource`) when the recipe deals a finite stream
    balanced (the default). Several: :class:`MixingWorkSource`, planned with
    ``mixture.tokens_per_record`` or, when absent, an estimate from a seeded sample
    (returned, so it can join the fingerprint).
    """
    if recipe.wraps:
        if len(datasets) > 1:
            raise RecipeError(
                "work.end_of_data='wrap' applies to single-dataset recipes; in a mixture, "
                "give the datasets on_exhausted='repeat' (or use 'drop_report')"
            )
        base, _ = work_source(recipe.replace(work=_no_wrap(recipe)), datasets, chain)
        return WrappedWorkSource(base, recipe.flush_every), None
    epochs = recipe.work.epochs
    if len(datasets) == 1:
        if recipe.datasets[0].on_exhausted == "repeat":
            epochs = None
        single = DatasetWorkSource(datasets[0], recipe.seed, recipe.num_lanes, epochs)
        if recipe.balanced_dealing and recipe.image is not None:
            raise RecipeError(
                "work.deal='balanced' applies to text recipes; an image recipe's items are "
                "dealt round-robin: use work.deal='round_robin' (or 'auto')"
            )
        total = single.total_items
        if recipe.balanced_dealing and total is not None:
            if total <= balance.MAX_BALANCED_ITEMS:
                sizes, measure = item_sizes(datasets[0], 0, chain)
                return BalancedWorkSource(single, sizes, measure), None
            if recipe.work.deal == "balanced":
                raise RecipeError(
                    f"work.deal='balanced' deals at most {balance.MAX_BALANCED_ITEMS:,} work "
                    f"items; dataset {datasets[0].name!r} gives {total:,} "
                    f"({datasets[0].num_work_items:,} items x {epochs} epochs): use "
                    f"work.deal='auto' (round-robin at this size) or fewer epochs"
                )
        return single, None
    if recipe.balanced_dealing:
        raise RecipeError(
            "work.deal='balanced' applies to single-dataset recipes; a mixture deals its items "
            "by its per-lane plans: use work.deal='round_robin' (or 'auto')"
        )
    stored = recipe.mixture.tokens_per_record
    estimate: dict[str, float] | None = None
    if stored is not None:
        per_record = [float(stored[d.name]) for d in recipe.datasets]
    else:
        per_record = estimate_tokens_per_record(
            datasets, chain, recipe.seed, recipe.mixture.estimate_records
        )
        estimate = {d.name: v for d, v in zip(recipe.datasets, per_record, strict=True)}
    per_item = [
        c * ds.num_records / ds.num_work_items if ds.num_work_items else 0.0
        for c, ds in zip(per_record, datasets, strict=True)
    ]
    source = MixingWorkSource(
        datasets,
        recipe.seed,
        recipe.num_lanes,
        epochs,
        [d.on_exhausted for d in recipe.datasets],
        WeightSchedule.from_recipe(recipe),
        per_item,
        recipe.mixture.block,
    )
    return source, estimate


def refuse_tar(datasets: Sequence[Dataset]) -> None:
    """Refuse tar shards (images) in a recipe without an ``[image]`` table."""
    for d in datasets:
        first_tar = getattr(d.shards, "first_of_kind", None)  # LazyShards: from the index
        if first_tar is not None:
            tar = first_tar("tar")
            tars = [tar] if tar is not None else []
        else:
            tars = [s.path for s in d.shards if isinstance(s, TarShard)]
        if tars:
            raise RecipeError(
                f"dataset {d.name!r}: {tars[0]} is a tar shard (images); a recipe reading "
                f"tar shards needs an [image] table"
            )
