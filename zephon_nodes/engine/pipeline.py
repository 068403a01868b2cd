"""Pipeline: a recipe made runnable (datasets opened, work source and lanes built)."""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchdata.nodes import BaseNode

from zephon_nodes.chat.assembly import chat_chain
from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import InSettings, Settings, current, using
from zephon_nodes.engine.accumulate import AccumulatorNode
from zephon_nodes.engine.assembly import refuse_tar, stateless_chain, work_source
from zephon_nodes.engine.lane import Lane, LaneNodes, WorkItemNode, chain_nodes
from zephon_nodes.engine.multiplexer import Multiplexer
from zephon_nodes.engine.operator_pools import PoolSpec, split_stages
from zephon_nodes.engine.parallel_map import OrderedParallelMap
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.relane import for_state
from zephon_nodes.engine.stages import check_stage_batches
from zephon_nodes.engine.timeline import Timeline
from zephon_nodes.engine.torchdata_stage import TorchdataStage
from zephon_nodes.engine.work import WorkItem, WorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.identity import content_summary
from zephon_nodes.io.index import index
from zephon_nodes.io.nodecache.future import CacheFeed, cacheable
from zephon_nodes.io.nodecache.nodecache import node_cache, prefetch_depth
from zephon_nodes.io.nodecache.tokenstore import process_stats, token_cache_settings
from zephon_nodes.io.nodecache.wholeshard import route_whole_shards
from zephon_nodes.io.nodecache.workercounts import merged, merged_tokens
from zephon_nodes.io.sources import open_dataset
from zephon_nodes.io.storage.checksum import one_pass
from zephon_nodes.io.storage.remote import finish_progress
from zephon_nodes.multimodal.assembly import make_packer, multimodal_chain, placeholder_id
from zephon_nodes.operators.bestfit import BestFitPacker
from zephon_nodes.operators.chain import Chain
from zephon_nodes.operators.pack import ConcatPacker
from zephon_nodes.operators.shuffle import ShuffleBuffer
from zephon_nodes.operators.tokencache import CachedParse
from zephon_nodes.operators.tokenize import load_tokenizer
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.state.identity import recipe_identity

__all__ = ["Pipeline", "lanes_for_rank"]


def lanes_for_rank(num_lanes: int, dp_world_size: int, dp_rank: int) -> list[int]:
    """Return the lanes rank ``dp_rank`` of ``dp_world_size`` owns (a contiguous block).

    Raises:
        RecipeError: If a value has the wrong type or range, the lanes do not divide evenly
            or the rank is out of range.
    """
    check_setting("dp_world_size", dp_world_size)
    check_setting("dp_rank", dp_rank)
    if num_lanes % dp_world_size:
        raise RecipeError(f"{num_lanes=} must be a multiple of {dp_world_size=}")
    if not 0 <= dp_rank < dp_world_size:
        raise RecipeError(f"{dp_rank=} must be an integer in [0, {dp_world_size=})")
    per = num_lanes // dp_world_size
    return list(range(dp_rank * per, (dp_rank + 1) * per))


# Per lane: its WorkItemNode and the pool stage nearest to it (see _read_frontiers).
_FRONTIER_NODES: weakref.WeakKeyDictionary[
    Lane, tuple[WorkItemNode | None, OrderedParallelMap | None]
] = weakref.WeakKeyDictionary()


def _frontier_nodes(lane: Lane) -> tuple[WorkItemNode | None, OrderedParallelMap | None]:
    """The lane's WorkItemNode and the last OrderedParallelMap before it in its chain."""
    first_map = None
    for n in chain_nodes(lane.source):
        if isinstance(n, WorkItemNode):
            return n, first_map
        if isinstance(n, OrderedParallelMap):
            first_map = n
    return None, first_map


def _read_frontiers(lanes: Mapping[int, Lane]) -> tuple[dict[int, int], dict[int, int]]:
    """Per lane: the first work item not yet read for sure, and the next one to submit.

    Items in between are in flight on the pool (their shard may be being read right now).
    """
    starts: dict[int, int] = {}
    submitted: dict[int, int] = {}
    for i, lane in lanes.items():
        found = _FRONTIER_NODES.get(lane)
        if found is None:  # a lane's nodes never change: walked once, not after every step
            found = _frontier_nodes(lane)
            _FRONTIER_NODES[lane] = found
        node, first_map = found
        if node is None:
            continue
        pending: list[int] = []
        if first_map is not None:
            pending = [w.position for w in first_map.in_flight() if isinstance(w, WorkItem)]
        submitted[i] = node.next_index
        starts[i] = min(pending, default=node.next_index)
    return starts, submitted


class Pipeline:
    """A recipe compiled into its work source and per-lane operator chains.

    Building it opens (and indexes) every shard, loads the tokenizer once and computes the
    recipe fingerprint. Lanes and rank multiplexers are then cheap to build.

    Args:
        recipe: The recipe.
        provenance: Add ``dataset_ids`` (each token's recipe dataset index, -1 on padding)
            to every sample (the default; covered by digests). False drops the field.
        stages: torchdata nodes appended to every lane, after packing and shuffling: each
            ``make(feed) -> BaseNode`` builds a node over ``feed`` (the lane's samples of one
            flush window) and runs in a
            :class:`~zephon_nodes.engine.torchdata_stage.TorchdataStage`.
            They must yield samples (dicts of arrays) and are not part of the fingerprint.
        settings: The physical settings (cache directory and limit, retries, ...; see
            :mod:`zephon_nodes.core.settings`) its build and all of its work run under,
            on any pool (default: the current settings when it is built). Never part of
            the fingerprint: they change no byte of output.
        trace: Samples of text recipes (concatenated packing) also hold ``source_shard`` and
            ``source_record`` per token (where each token came from; for batch dumps, never
            part of a digest).
    """

    def __init__(
        self,
        recipe: Recipe,
        *,
        provenance: bool = True,
        stages: Sequence[Callable[[BaseNode[Any]], BaseNode[Any]]] = (),
        settings: Settings | None = None,
        trace: bool = False,
    ) -> None:

        if settings is not None and not isinstance(settings, Settings):
            raise RecipeError(f"settings must be a Settings, got {type(settings).__name__}")
        self.settings: Settings = settings or current()
        self.trace = trace
        self._bound: dict[int, tuple[Any, InSettings]] = {}
        index.forget()  # dataset indexes are read afresh for every build
        try:
            with one_pass(), using(self.settings):
                self._build(recipe, provenance, stages)
        finally:
            finish_progress()

    def _build(
        self,
        recipe: Recipe,
        provenance: bool,
        stages: Sequence[Callable[[BaseNode[Any]], BaseNode[Any]]],
    ) -> None:

        self.recipe = recipe
        self.provenance = provenance
        self.stages = tuple(stages)
        self.canonical = recipe.canonical(lazy=True)
        tok = load_tokenizer(recipe.tokenizer)
        if recipe.pack.pad_id is not None:
            vocab = int(getattr(tok, "vocab_size", 0) or 0)
            if vocab > 0 and not 0 <= recipe.pack.pad_id < vocab:
                raise RecipeError(
                    f"pack.pad_id={recipe.pack.pad_id} must be an integer in [0, {vocab - 1}] "
                    f"(a token id of the tokenizer's vocabulary of {vocab})"
                )
            self.pad_id = recipe.pack.pad_id
        else:
            self.pad_id = tok.pad_id if tok.pad_id >= 0 else tok.eos_id
        self.placeholder_id = -1
        specs = list(recipe.datasets)
        if recipe.chat is not None:
            self.stateless = chat_chain(recipe, tok)
            # Every format reads the messages field as the record's field.
            field = recipe.chat.messages_field
            specs = [dataclasses.replace(d, text_field=field) for d in specs]
        elif recipe.image is not None:
            self.placeholder_id = placeholder_id(recipe, tok)
            self.stateless = multimodal_chain(recipe, tok)
        else:
            self.stateless = stateless_chain(recipe, tok, trace=self.trace)
        # Multimodal recipes also read Parquet files' binary image column.
        images = [(d.image_field or "image") if recipe.image else None for d in recipe.datasets]
        opened = [
            open_dataset(spec, recipe.work.chunk_size, image_column)
            for spec, image_column in zip(specs, images, strict=True)
        ]
        self.datasets: list[Dataset] = [o.dataset for o in opened]
        # With a node-cache limit, shards read whole (single-frame .zst) live in that cache.

        self.datasets = route_whole_shards(self.datasets, self.settings)
        if recipe.image is None:
            refuse_tar(self.datasets)
        self.skipped_files = {o.dataset.name: dict(o.skipped_files) for o in opened}
        self.work_source: WorkSource
        self.work_source, estimate = work_source(recipe, self.datasets, self.stateless)
        if estimate is not None:
            # The token estimate the mixture was planned with is part of the data identity.
            self.canonical["mixture"]["estimate"] = estimate
        if all(d.num_records == 0 for d in self.datasets):
            raise RecipeError(
                f"the recipe's datasets hold no records, so it can produce no batch (files "
                f"skipped: {self.skipped_files})"
            )
        contents = content_summary(recipe.datasets, self.canonical)
        self.fingerprint, self.summary = recipe_identity(self.canonical, contents)
        self._cache_feed: Any = None
        #: The re-lane lineage of the streams read (engine/relane/), None if never re-laned.
        self.lineage: dict[str, Any] | None = None
        # A recipe that changes during the run (engine/stages.py): this pipeline is the run's
        # (``run``) and runs its base recipe; each stage's pipeline is a copy made by
        # ``stages.stage_pipeline`` (its ``stage`` section, ``base_step`` and next change).
        self.run: Pipeline = self
        self.segments: dict[int, Pipeline] = {}
        self.stage: Any = None
        self.base_step = 0
        self.next_change: int | None = recipe.stages[0].start_step if recipe.stages else None

    #: The fields :meth:`derive` may replace: a segment's identity, data plan and place in a run.
    DERIVED = frozenset(
        (
            "recipe",
            "canonical",
            "fingerprint",
            "summary",
            "lineage",
            "work_source",
            "datasets",
            "run",
            "segments",
            "stage",
            "base_step",
            "next_change",
        )
    )

    def derive(self, **fields: Any) -> Pipeline:
        """A pipeline of the same compiled recipe with ``fields`` replaced (see :data:`DERIVED`).

        Everything else (the opened datasets, the operator chains, the settings) is shared; the
        node-cache feed, which follows the work source, is rebuilt on demand. This pipeline is
        left unchanged: a segment of a run (a stage, a re-laned stream) is always derived.

        Raises:
            TypeError: If a field is not one a segment may replace.
        """
        unknown = sorted(set(fields) - self.DERIVED)
        if unknown:
            raise TypeError(f"Pipeline.derive cannot replace {unknown}")
        out = copy.copy(self)
        for name, value in fields.items():
            setattr(out, name, value)
        out._cache_feed = None
        return out

    def check_produces(self) -> None:
        """Refuse, cheaply and before any lane is built, a recipe that can produce no batch.

        Every step takes samples from every lane, so a lane without a single work item means
        the stream ends before step 1. Work is dealt to lanes in turn, so the last lane is
        the first to go without. The commands and the TorchTitan loader call this first.

        Raises:
            RecipeError: Naming the lane count and the work items the data holds.
        """
        last = self.num_lanes - 1
        if self.work_source.work(last, 0) is None:
            self._check_short_end_datasets()
            items = sum(d.num_work_items for d in self.datasets)
            if items >= self.num_lanes:  # enough items: they are not dealt, not too few
                raise RecipeError(
                    f"lane {last} gets no work item although the data holds {items} work "
                    f"item(s) per epoch: items whose records are all skipped (on_error = "
                    f'"skip") or hold no tokens are not dealt, so the recipe can produce no '
                    f"global batch; check the data (zephon stats counts skipped records by "
                    f"reason)"
                )
            raise RecipeError(
                f"num_lanes={self.num_lanes} but the data holds only {items} work item(s) "
                f"per epoch: lane {last} gets none, so the recipe can produce no global batch "
                f"(use fewer lanes, a smaller work.chunk_size or more data)"
            )

    def _check_short_end_datasets(self) -> None:
        """Refuse a mixture whose ``"end"`` dataset has fewer items per pass than lanes.

        A mixture's lane ends where it would take an item of such a dataset's next pass;
        lane ``l`` takes the dataset's items ``l, l + L, ...``, so a dataset of at most
        ``l`` items over its epochs ends lane ``l`` at its first item of it.

        Raises:
            RecipeError: Naming the datasets, their work items and the lane count.
        """
        recipe = self.recipe
        epochs = recipe.work.epochs
        if len(recipe.datasets) < 2 or epochs is None or len(self.datasets) != len(recipe.datasets):
            return
        short = [
            (spec.name, ds.num_work_items)
            for spec, ds in zip(recipe.datasets, self.datasets, strict=True)
            if spec.on_exhausted == "end" and ds.num_work_items * epochs < self.num_lanes
        ]
        if short:
            named = ", ".join(f"{name!r} ({n} work item(s))" for name, n in short)
            raise RecipeError(
                f"lane {self.num_lanes - 1} gets no work item: dataset(s) {named} with "
                f'on_exhausted = "end" hold fewer work items per pass (x work.epochs={epochs}) '
                f"than the {self.num_lanes} lanes, and a mixture's lane ends where it would "
                f'take one past the pass; give them on_exhausted = "repeat", a smaller '
                f"chunk_size, or use fewer lanes"
            )

    @property
    def num_lanes(self) -> int:
        """The recipe's lane count."""
        return self.recipe.num_lanes

    def build_lane(
        self,
        lane: int,
        pool: WorkerPool,
        lookahead: int = 4,
        *,
        chain_stages: Sequence[tuple[Callable[[Any], Any], WorkerPool]] | None = None,
    ) -> Lane:
        """Build lane ``lane``: work items -> parse+tokenize (pool) -> pack -> shuffle -> stages.

        Args:
            lane: Lane index.
            pool: The pool running the fused stateless chain.
            lookahead: Work items each pool stage submits ahead.
            chain_stages: Instead of the fused chain on ``pool``: ``(operators, pool)``
                stages run one after another (per-operator pools, see
                :meth:`operator_stages`).
        """
        r = self.recipe
        # A re-laned checkpoint's streams (engine/relane/) bring their own lane nodes.
        relaned = self.work_source if isinstance(self.work_source, LaneNodes) else None
        items = (
            relaned.item_node(lane, r.flush_every)
            if relaned is not None
            else WorkItemNode(self.work_source, lane, r.flush_every)
        )
        node: BaseNode[Any] = items
        fused = [(self.stateless, pool)]
        for fn, stage_pool in chain_stages if chain_stages is not None else fused:
            node = OrderedParallelMap(node, self._in_settings(fn), stage_pool, lookahead=lookahead)
        seq_len, pad_id, prov = r.seq_len, self.pad_id, self.provenance
        if r.image is not None:
            ph = self.placeholder_id
            node = AccumulatorNode(node, lambda w: make_packer(r, pad_id, ph, prov))
        elif r.pack.mode == "bestfit":
            bins = r.pack.bins
            node = AccumulatorNode(node, lambda w: BestFitPacker(seq_len, pad_id, bins, prov))
        else:
            docs = r.chat is not None  # chat samples carry document boundaries
            trace = self.trace
            node = AccumulatorNode(
                node, lambda w: ConcatPacker(seq_len, pad_id, prov, docs, trace=trace)
            )
        if r.shuffle.buffer_size > 0:
            size, seed = r.shuffle.buffer_size, r.seed
            if relaned is not None:
                parts = relaned.lane_seed
                node = AccumulatorNode(node, lambda w: ShuffleBuffer(size, *parts(lane, items, w)))
            else:
                seeds = self.work_source.shuffle_parts  # (seed, lane, w) but after a change
                node = AccumulatorNode(node, lambda w: ShuffleBuffer(size, *seeds(seed, lane, w)))
        for k, make in enumerate(self.stages):
            name = getattr(make, "__name__", type(make).__name__)
            node = TorchdataStage(node, make, name=f"stage {k} ({name})")
        return relaned.lane_node(node, lane) if relaned is not None else Lane(node, lane)

    def run_stateless(self, item: WorkItem) -> Any:
        """Run the stateless chain on one work item here, under the pipeline's settings."""
        return self._in_settings(self.stateless)(item)

    def _in_settings(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` bound to the pipeline's settings (one wrapper per function: Ray caches it)."""
        hit = self._bound.get(id(fn))
        if hit is None or hit[0] is not fn:
            hit = (fn, InSettings(fn, self.settings))
            self._bound[id(fn)] = hit
        return hit[1]

    def stage_segment(self, key: int) -> Pipeline:
        """The pipeline of stage ``key``'s own recipe (its datasets opened once per run; cached).

        Called on the run's pipeline (``self.run``); stage 0 is the run itself.
        """
        seg = self.segments.get(key)
        if seg is None:
            if key == 0:
                seg = self
            else:
                seg = Pipeline(
                    self.recipe.stage_recipe(key),
                    provenance=self.provenance,
                    stages=self.stages,
                    settings=self.settings,
                    trace=self.trace,
                )
            self.segments[key] = seg
        return seg

    def for_state(self, state: Mapping[str, Any] | None) -> Pipeline:
        """The pipeline that resumes ``state``: this one, or its re-laned copy.

        See :func:`zephon_nodes.engine.relane.for_state`.
        """
        return for_state(self, state)

    def rank_node(
        self,
        dp_world_size: int = 1,
        dp_rank: int = 0,
        *,
        local_batch_size: int | None = None,
        pool: WorkerPool | None = None,
        lanes: Sequence[int] | None = None,
        lookahead: int = 4,
        operator_pools: Mapping[str, WorkerPool | PoolSpec | str] | None = None,
    ) -> Multiplexer:
        """Build the multiplexer node of one data-parallel rank.

        Args:
            dp_world_size: Number of data-parallel ranks ``R``.
            dp_rank: This rank.
            local_batch_size: Micro-batch size; default one micro-batch per step (``G/R``).
            pool: Worker pool shared by the rank's lanes (default: 2 threads, created and
                owned by the returned node: closed by its ``close()``, its ``with`` block, or
                when it is garbage-collected; a pool passed in is never closed by the node).
            lanes: Explicit lanes for this rank (default: :func:`lanes_for_rank`).
            lookahead: Work items each lane submits ahead (per stage).
            operator_pools: Per-operator pools, e.g. ``{"decode": "process:6",
                "tokenize": "thread:2"}`` (see :mod:`zephon_nodes.engine.operator_pools`); values
                are pools (the caller's) or specs (pools created and owned by the node).
                Operators not named run on ``pool``. A physical setting: output unchanged.
        """
        L = self.num_lanes
        check_setting("dp_world_size", dp_world_size)
        check_setting("lookahead", lookahead)
        if local_batch_size is not None:
            check_setting("local_batch_size", local_batch_size)
        if lanes is None:
            if L % dp_world_size:
                raise RecipeError(
                    f"num_lanes={L} must be a multiple of {dp_world_size=}; choose a lane "
                    f"count that is a common multiple of every dp size you plan to use"
                )
            lanes = lanes_for_rank(L, dp_world_size, dp_rank)
        else:
            lanes = list(lanes)
            bad = [x for x in lanes if isinstance(x, bool) or not isinstance(x, int)]
            if bad or not all(0 <= x < L for x in lanes) or len(set(lanes)) != len(lanes):
                raise RecipeError(
                    f"lanes={lanes!r} must be distinct integers in [0, {L}) (num_lanes={L}); "
                    f"a repeated lane would yield its samples twice"
                )

        check_stage_batches(self.run.recipe, len(lanes), local_batch_size)  # before any pool
        owned: list[WorkerPool] = []
        if pool is None:
            pool = WorkerPool(2, "thread", settings=self.settings)
            owned.append(pool)
        chain_stages = None
        if operator_pools:
            chain_stages, created = self.operator_stages(operator_pools, pool)
            owned.extend(created)

        def lane_builder(segment: Pipeline, lane: int) -> Lane:
            # A segment with this recipe's own operator chain (a re-laned stream the timeline
            # resolves at reset) keeps the per-operator pools; a stage's lanes run its own
            # chain on the rank's pool (one fused chain).
            if chain_stages is not None and segment.stateless is self.stateless:
                return segment.build_lane(lane, pool, lookahead, chain_stages=chain_stages)
            return segment.build_lane(lane, pool, lookahead)

        # Each rank node gets its own copy of a mixing work source (its decisions are per
        # node): its lanes are built by a pipeline derived with it (build_lane, which
        # subclasses override, reads it as ``self.work_source``); this one is left as it is.
        ws = self.work_source.fork()
        own = self.derive(work_source=ws)
        try:
            # Without per-operator pools, the call a subclass overriding build_lane expects.
            built = {
                lane: own.build_lane(lane, pool, lookahead)
                if chain_stages is None
                else own.build_lane(lane, pool, lookahead, chain_stages=chain_stages)
                for lane in lanes
            }
            node = Multiplexer(
                built,
                self,
                local_batch_size=local_batch_size,
                work_source=ws,
                lane_builder=lane_builder,
                timeline=Timeline(self),
            )
        except BaseException:
            for p in owned:
                p.close()
            raise
        node.own(owned)
        feed = self.cache_feed()
        if feed is not None:
            node.position_hooks.append(lambda _: feed.update(*_read_frontiers(built)))
        return node

    def operator_stages(
        self,
        operator_pools: Mapping[str, WorkerPool | PoolSpec | str],
        default: WorkerPool,
    ) -> tuple[list[tuple[Callable[[Any], Any], WorkerPool]], list[WorkerPool]]:
        """Cut the stateless chain into per-operator pool stages.

        Args:
            operator_pools: Operator key -> pool, :class:`PoolSpec` or spec string.
            default: The pool of the operators not named.

        Returns:
            The stages (for :meth:`build_lane`) and the pools created from specs (the caller
            owns and closes them).

        Raises:
            RecipeError: If a key names no operator or a spec is malformed.
        """
        created: list[WorkerPool] = []
        pools: dict[str, WorkerPool] = {}
        for key, value in operator_pools.items():
            if isinstance(value, WorkerPool):
                pools[key] = value
                continue
            spec = PoolSpec.parse(value) if isinstance(value, str) else value
            pools[key] = spec.build(default.timeout_s, settings=self.settings)
            created.append(pools[key])
        try:
            cut = split_stages(self.stateless, pools)
        except BaseException:
            for p in created:
                p.close()
            raise
        return [(fn, pools[k] if k is not None else default) for fn, k in cut], created

    def cache_feed(self) -> Any:
        """Return the feed planning the node cache's future (None without a cache limit).

        Every rank built by this pipeline registers its lanes' positions with it, so the
        node cache (:func:`~zephon_nodes.io.nodecache.nodecache.node_cache`) evicts and
        prefetches by the exact upcoming accesses of all of them.
        """
        if self._cache_feed is None:
            cache = node_cache(self.settings)
            cached = any(
                d.shards.whole()  # LazyShards: single-frame .zst, from the index
                if hasattr(d.shards, "whole")
                else any(cacheable(s) for s in d.shards)
                for d in self.datasets
            )
            if cached:
                depth = prefetch_depth(self.settings)
                self._cache_feed = CacheFeed(cache, self.work_source, prefetch=depth)
        return self._cache_feed

    def cache_stats(self) -> dict[str, int] | None:
        """Return this process's node-cache counters (hits, misses, bytes_fetched, ...).

        Counters of its process workers (``runner="process"``) are included: they come back
        with each result (see :mod:`zephon_nodes.io.nodecache.workercounts`).

        None when no shard is read through the node cache and no cache limit is set
        (``--cache-limit`` / ``ZEPHON_CACHE_LIMIT``).
        """
        if self.settings.cache_limit is None and self.cache_feed() is None:
            return None
        return merged(node_cache(self.settings).stats())

    def token_cache_stats(self) -> dict[str, Any] | None:
        """Return the token cache's counters (this process and its process workers).

        Keys: hits, misses, bytes_read, bytes_written, evictions, damaged, uncached,
        tokens_served, cpu_s_saved, limit_bytes (see :mod:`zephon_nodes.io.nodecache.tokenstore`).
        None when this pipeline's chain does not use the token cache (off, or a recipe it
        does not apply to).
        """
        chain = self.stateless
        if not isinstance(chain, Chain) or not any(
            isinstance(op, CachedParse) for op in chain.operators
        ):
            return None
        out: dict[str, Any] = merged_tokens(process_stats())
        out["limit_bytes"] = token_cache_settings()[1]
        out["cpu_s_saved"] = out.pop("cpu_ns_saved", 0) / 1e9
        return out
