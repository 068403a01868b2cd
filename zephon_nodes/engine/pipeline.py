"""Pipeline: a recipe made runnable (datasets opened, work source and lanes built)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.engine.checkpoint import recipe_summary
from zephon_nodes.engine.lane import Lane, WorkItemNode
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.operators.accumulate import AccumulatorNode
from zephon_nodes.operators.bestfit import BestFitPacker
from zephon_nodes.operators.pack import ConcatPacker
from zephon_nodes.operators.parallel_map import OrderedParallelMap
from zephon_nodes.operators.shuffle import ShuffleBuffer
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe.spec import Recipe

__all__ = ["Pipeline", "lanes_for_rank"]


def lanes_for_rank(num_lanes: int, dp_world_size: int, dp_rank: int) -> list[int]:
    """Return the lanes rank ``dp_rank`` of ``dp_world_size`` owns (a contiguous block).

    Raises:
        ValueError: If the lanes do not divide evenly or the rank is out of range.
    """
    if dp_world_size < 1 or num_lanes % dp_world_size:
        raise ValueError(f"{num_lanes=} must be a multiple of {dp_world_size=}")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"{dp_rank=} must be in [0, {dp_world_size=})")
    per = num_lanes // dp_world_size
    return list(range(dp_rank * per, (dp_rank + 1) * per))


def _refuse_tar(datasets: Sequence[Dataset]) -> None:
    from zephon_nodes.errors import RecipeError
    from zephon_nodes.io.tar import TarShard

    for d in datasets:
        tars = [s.path for s in d.shards if isinstance(s, TarShard)]
        if tars:
            raise RecipeError(
                f"dataset {d.name!r}: {tars[0]} is a tar shard (images); a recipe reading "
                f"tar shards needs an [image] table"
            )


def _read_frontiers(lanes: Mapping[int, Lane]) -> tuple[dict[int, int], dict[int, int]]:
    """Per lane: the first work item not yet read for sure, and the next one to submit.

    Items in between are in flight on the pool (their shard may be being read right now).
    """
    starts: dict[int, int] = {}
    submitted: dict[int, int] = {}
    for i, lane in lanes.items():
        node: Any = lane.source
        pending: list[int] = []
        while node is not None and not isinstance(node, WorkItemNode):
            if isinstance(node, OrderedParallelMap):
                pending = [w.position for w in node.in_flight() if hasattr(w, "position")]
            node = getattr(node, "source", None)
        if node is None:
            continue
        submitted[i] = node.next_index
        starts[i] = min(pending, default=node.next_index)
    return starts, submitted


class Pipeline:
    """A recipe compiled into its work source and per-lane operator chains.

    Building it opens (and indexes) every shard, loads the tokenizer once and computes the
    recipe fingerprint. Lanes and rank multiplexers are then cheap to build.

    Args:
        recipe: The recipe.
        provenance: Add ``dataset_ids`` (each token's dataset index, -1 on padding) to the
            samples, for statistics (``zephon stats``); changes the digests.
    """

    def __init__(self, recipe: Recipe, *, provenance: bool = False) -> None:
        from zephon_nodes.io import index
        from zephon_nodes.io.checksum import one_pass
        from zephon_nodes.io.remote import finish_progress

        index.forget()  # dataset indexes are read afresh for every build
        try:
            with one_pass():
                self._build(recipe, provenance)
        finally:
            finish_progress()

    def _build(self, recipe: Recipe, provenance: bool) -> None:
        from zephon_nodes.engine.assembly import stateless_chain, work_source
        from zephon_nodes.io.identity import content_summary
        from zephon_nodes.io.sources import open_dataset

        self.recipe = recipe
        self.provenance = provenance
        self.canonical = recipe.canonical()
        tok = load_tokenizer(recipe.tokenizer)
        if recipe.pack.pad_id is not None:
            self.pad_id = recipe.pack.pad_id
        else:
            self.pad_id = tok.pad_id if tok.pad_id >= 0 else tok.eos_id
        self.placeholder_id = -1
        if recipe.image is not None:
            from zephon_nodes.multimodal.assembly import multimodal_chain, placeholder_id

            self.placeholder_id = placeholder_id(recipe, tok)
            self.stateless = multimodal_chain(recipe, tok)
        else:
            self.stateless = stateless_chain(recipe, tok)
        # Multimodal recipes also read Parquet files' binary image column.
        images = [(d.image_field or "image") if recipe.image else None for d in recipe.datasets]
        opened = [
            open_dataset(spec, recipe.work.chunk_size, image_column)
            for spec, image_column in zip(recipe.datasets, images, strict=True)
        ]
        self.datasets: list[Dataset] = [o.dataset for o in opened]
        # With a node-cache limit, shards read whole (single-frame .zst) live in that cache.
        from zephon_nodes.io.wholeshard import route_whole_shards

        self.datasets = route_whole_shards(self.datasets)
        if recipe.image is None:
            _refuse_tar(self.datasets)
        self.skipped_files = {o.dataset.name: dict(o.skipped_files) for o in opened}
        self.work_source: WorkSource
        self.work_source, estimate = work_source(recipe, self.datasets, self.stateless)
        if estimate is not None:
            # The token estimate the mixture was planned with is part of the data identity.
            self.canonical["mixture"]["estimate"] = estimate
        blob = json.dumps(self.canonical, sort_keys=True, separators=(",", ":"))
        self.fingerprint = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        self.summary = recipe_summary(self.canonical)
        contents = content_summary(recipe.datasets, self.canonical)
        if contents:
            self.summary["contents"] = contents
        self._cache_feed: Any = None

    @property
    def num_lanes(self) -> int:
        """The recipe's lane count."""
        return self.recipe.num_lanes

    def build_lane(self, lane: int, pool: WorkerPool, lookahead: int = 4) -> Lane:
        """Build lane ``lane``: work items -> parse+tokenize (on the pool) -> pack -> shuffle."""
        r = self.recipe
        node: BaseNode[Any] = WorkItemNode(self.work_source, lane, r.flush_every)
        node = OrderedParallelMap(node, self.stateless, pool, lookahead=lookahead)
        seq_len, pad_id, prov = r.seq_len, self.pad_id, self.provenance
        if r.image is not None:
            from zephon_nodes.multimodal.assembly import make_packer

            ph = self.placeholder_id
            node = AccumulatorNode(node, lambda w: make_packer(r, pad_id, ph, prov))
        elif r.pack.mode == "bestfit":
            bins = r.pack.bins
            node = AccumulatorNode(node, lambda w: BestFitPacker(seq_len, pad_id, bins, prov))
        else:
            node = AccumulatorNode(node, lambda w: ConcatPacker(seq_len, pad_id, prov))
        if r.shuffle.buffer_size > 0:
            size, seed = r.shuffle.buffer_size, r.seed
            node = AccumulatorNode(node, lambda w: ShuffleBuffer(size, seed, lane, w))
        return Lane(node, lane)

    def rank_node(
        self,
        dp_world_size: int = 1,
        dp_rank: int = 0,
        *,
        local_batch_size: int | None = None,
        pool: WorkerPool | None = None,
        lanes: Sequence[int] | None = None,
        lookahead: int = 4,
    ) -> Multiplexer:
        """Build the multiplexer node of one data-parallel rank.

        Args:
            dp_world_size: Number of data-parallel ranks ``R``.
            dp_rank: This rank.
            local_batch_size: Micro-batch size; default one micro-batch per step (``G/R``).
            pool: Worker pool shared by the rank's lanes (default: 2 threads).
            lanes: Explicit lanes for this rank (default: :func:`lanes_for_rank`).
            lookahead: Work items each lane submits ahead.
        """
        from zephon_nodes.errors import RecipeError

        L = self.num_lanes
        if lanes is None:
            if dp_world_size < 1 or L % dp_world_size:
                raise RecipeError(
                    f"num_lanes={L} must be a multiple of {dp_world_size=}; choose a lane "
                    f"count that is a common multiple of every dp size you plan to use"
                )
            lanes = lanes_for_rank(L, dp_world_size, dp_rank)
        pool = pool if pool is not None else WorkerPool(2, "thread")
        built = {lane: self.build_lane(lane, pool, lookahead) for lane in lanes}
        node = Multiplexer(built, self, local_batch_size=local_batch_size)
        feed = self.cache_feed()
        if feed is not None:
            node.position_hooks.append(lambda _: feed.update(*_read_frontiers(built)))
        return node

    def cache_feed(self) -> Any:
        """Return the feed planning the node cache's future (None without a cache limit).

        Every rank built by this pipeline registers its lanes' positions with it, so the
        node cache (:func:`~zephon_nodes.io.nodecache.node_cache`) evicts and prefetches by
        the exact upcoming accesses of all of them.
        """
        if self._cache_feed is None:
            from zephon_nodes.io.future import CacheFeed, cacheable
            from zephon_nodes.io.nodecache import node_cache, prefetch_depth

            cache = node_cache()
            cached = any(cacheable(s) for d in self.datasets for s in d.shards)
            if cache is not None and cached:
                self._cache_feed = CacheFeed(cache, self.work_source, prefetch=prefetch_depth())
        return self._cache_feed

    def cache_stats(self) -> dict[str, int] | None:
        """Return this process's node-cache counters (hits, misses, bytes_fetched, ...).

        None when no cache limit is set (``ZEPHON_CACHE_LIMIT`` / ``--cache-limit``).
        """
        from zephon_nodes.io.nodecache import node_cache

        cache = node_cache()
        return cache.stats() if cache is not None else None
