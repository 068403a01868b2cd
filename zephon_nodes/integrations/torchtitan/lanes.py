"""The lanes behind both TorchTitan adapters: pool, rank node, state, mixture, re-lane, amend.

:class:`LaneLoader` is everything a ``ZephonDataLoader`` does that does not depend on
TorchTitan's API: it owns this rank's lanes (a contiguous block of ``num_lanes /
dp_world_size``), yields their micro-batches of ``local_batch_size`` rows, and converts its
state to and from the DCP keys of :mod:`zephon_nodes.state.dcp`. The 0.3.0 adapter yields
those micro-batches as ``[rows, seq_len]``; the main adapter flattens them.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torchdata.nodes import BaseNode, Prefetcher

from zephon_nodes.core.errors import CheckpointError, RecipeError
from zephon_nodes.core.settings import Settings, current, using
from zephon_nodes.engine.end_of_data import all_ranks_continue
from zephon_nodes.engine.metrics import StepMetrics
from zephon_nodes.engine.operator_pools import parse_operator_workers
from zephon_nodes.engine.pipeline import Pipeline, lanes_for_rank
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.relane import for_state, pipeline_at, relane_state
from zephon_nodes.engine.restore_checks import check_rank_state
from zephon_nodes.engine.stages import amend_state, segment_for_state
from zephon_nodes.integrations.torchtitan.common import (
    check_agreement,
    check_tokenizer,
    from_dcp_state,
    register_loader,
    resolve_max_decisions,
)
from zephon_nodes.integrations.torchtitan.rank_node import child_rank_node
from zephon_nodes.integrations.torchtitan.step_check import StepCheck, StepSetting
from zephon_nodes.recipe import Recipe
from zephon_nodes.state.dcp import DP_KEY, to_dcp_state
from zephon_nodes.state.mixture import MIXTURE_KEY, normalize_weights, with_decision
from zephon_nodes.state.schema import FORMAT, STAGE_KEY
from zephon_nodes.verification.dump import StepDumper

__all__ = ["LaneLoader"]

logger = logging.getLogger("zephon_nodes.integrations.torchtitan")


class LaneLoader:
    """This rank's lanes of a recipe, as TorchTitan's loaders need them (a mixin).

    An adapter sets ``self.config`` (its ``Config``), checks the job's sizes, then calls
    :meth:`_setup`; it yields :meth:`_micro_batches` in its own batch format.
    """

    config: Any
    STEP: StepSetting
    """The TorchTitan setting that sets the optimizer step (checked by :class:`StepCheck`)."""

    def _setup(
        self,
        recipe: Recipe,
        *,
        tokenizer: Any,
        dp_world_size: int,
        dp_rank: int,
        local_batch_size: int,
        infinite: tuple[str, bool],
    ) -> None:
        """Build the pool and this rank's node (after the adapter's size checks).

        ``infinite`` is the adapter's setting that TorchTitan's validator turns off to read
        until the data ends: its name and value (False refuses an endless recipe).
        """
        config = self.config
        setting, endless = infinite
        self.max_decisions = resolve_max_decisions(config.max_decisions, recipe)
        if config.check_tokenizer:
            check_tokenizer(recipe, tokenizer)
        if not endless and recipe.work.epochs is None:
            raise RecipeError(
                f"{setting}=False (TorchTitan's validator with validator.steps=-1 "
                f"reads until the data ends) but recipe {config.recipe} never ends "
                f"(work.epochs = 'inf'): set --validator.steps, or give the validator a recipe "
                f"with a finite work.epochs"
            )
        if endless and recipe.work.epochs is not None:
            logger.info(
                "recipe %s ends after %d epoch(s) (work.epochs); set work.epochs = 'inf' "
                "for an endless stream",
                config.recipe,
                recipe.work.epochs,
            )
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.local_batch_size = local_batch_size
        settings: Settings = current()
        chosen = {
            name: getattr(config, name)
            for name in ("cache_limit", "token_cache", "token_cache_limit")
            if getattr(config, name) is not None
        }
        if chosen:
            settings = settings.replace(**chosen)
        with using(settings):
            self.pipeline = Pipeline(recipe, settings=settings)
            # The recipe the checkpoint to amend at load was written with (amend_from).
            self._amend_old: Pipeline | None = (
                Pipeline(Recipe.from_toml(config.amend_from), settings=settings)
                if config.amend_from
                else None
            )
        self.lanes = lanes_for_rank(recipe.num_lanes, dp_world_size, dp_rank)
        self.settings = settings
        # The thread engine's pool; the process engine's child builds its own.
        self.pool: WorkerPool | None = (
            WorkerPool(
                config.num_workers, config.runner, config.worker_timeout_s, settings=settings
            )
            if config.engine == "thread"
            else None
        )
        # Micro-batches of this rank per recipe step (from the recipe: asking a child
        # process's node would start its stream, and a second start is a second pass).
        self.micro_per_step = recipe.samples_per_lane * len(self.lanes) // local_batch_size
        self._build_node()
        self.step_check = StepCheck(
            self.STEP,
            micro_per_step=self.micro_per_step,
            rows=local_batch_size,
            dp_world_size=dp_world_size,
            global_batch_size=recipe.global_batch_size,
            seq_len=recipe.seq_len,
            recipe=config.recipe,
        )
        weakref.finalize(self, self.step_check.close)  # a loader dropped without close()
        self._dumper = (
            StepDumper(config.dump_batches, dp_rank, self.micro_per_step)
            if config.dump_batches
            else None
        )
        self._state: dict[str, Any] = self._fresh_state()
        self._restore: dict[str, Any] | None = None
        self._started = False
        self._loaded = False
        self._saved_dp: int | None = None  # the dp size of a loaded checkpoint, until logged
        self._dataset_ids: list[torch.Tensor] = []
        # What the trainer got and how long it waited, per step (after the prefetcher).
        self._steps = StepMetrics()
        self._step_batches: list[dict[str, torch.Tensor]] = []
        self._step_wait = 0.0
        # A finite stream ends where some rank's lane runs dry: ranks agree on that step.
        self._finite = (
            recipe.work.epochs is not None
            and any(d.on_exhausted == "end" for d in recipe.datasets)
            and not recipe.wraps
        )
        self.serial = register_loader(self)

    def _build_node(self) -> None:
        """Build this rank's multiplexer (and prefetcher) over ``self.pipeline``.

        With ``dataloader.engine = "process"`` the node is a ``ChildRankNode`` running the
        same multiplexer in a child process (it prefetches there; no prefetcher here).
        """
        config = self.config
        if config.engine == "process":
            self.multiplexer: Any = child_rank_node(
                config,
                self.settings,
                dp_world_size=self.dp_world_size,
                dp_rank=self.dp_rank,
                local_batch_size=self.local_batch_size,
                lanes=self.lanes,
            )
            self._node: BaseNode[dict[str, torch.Tensor]] = self.multiplexer
            return
        assert self.pool is not None
        self.multiplexer = self.pipeline.rank_node(
            self.dp_world_size,
            self.dp_rank,
            local_batch_size=self.local_batch_size,
            pool=self.pool,
            lanes=self.lanes,
            lookahead=config.lookahead,
            operator_pools=parse_operator_workers(config.operator_workers),
        )
        self.multiplexer.own([self.pool])  # a loader dropped without close() stops it too
        self._node = (
            Prefetcher(self.multiplexer, config.prefetch)
            if config.prefetch > 0
            else self.multiplexer
        )

    def _read_relaned(self, state: dict[str, Any]) -> None:
        """Switch to the re-laned streams of ``state`` (rebuilding this rank's nodes)."""
        pipeline = for_state(self.pipeline, state)
        if pipeline is self.pipeline:
            return
        if self.config.engine == "process":
            # The child's rank node resumes the state on its timeline (the re-laned streams);
            # the loader keeps the re-laned pipeline for its own checks of the state.
            self.pipeline = pipeline
            return
        old = self.multiplexer
        self.pipeline = pipeline
        self._build_node()
        old._owned[:] = [r for r in old._owned if r is not self.pool]
        old.close()  # its per-operator pools; the shared pool serves the new node

    def _lineage_room(self, state: Mapping[str, Any]) -> int:
        relaned = state.get("lineage") is not None or self.config.relaned
        return self.config.max_lineage_bytes if relaned else 0

    def _stage_room(self, state: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """Room of the stage keys: reserved by a recipe with stages or ``dataloader.amended``."""
        config = self.config
        staged = bool(self.pipeline.recipe.stages) or config.amended
        if staged or (state is not None and state.get(STAGE_KEY) is not None):
            return config.max_stage_bytes, config.max_stage_datasets
        return 0, 0

    def _relane_template(self) -> dict[str, Any]:
        """The keys of the checkpoint ``dataloader.relane_from`` names: all its old lanes."""
        return _every_lane_at_start(pipeline_at(self.pipeline, self.config.relane_from))

    def _amend_layout(self) -> dict[str, Any]:
        """How the checkpoint ``dataloader.amend_from`` names is encoded (the old recipe's)."""
        old = self._amend_old
        assert old is not None
        config = self.config
        staged = bool(old.recipe.stages) or config.amended
        return {
            "max_decisions": resolve_max_decisions(config.max_decisions, old.recipe),
            "lineage_bytes": config.max_lineage_bytes if config.relaned else 0,
            "stage_room": (
                (config.max_stage_bytes, config.max_stage_datasets) if staged else (0, 0)
            ),
        }

    def _amend_keys(self) -> dict[str, Any]:
        """The keys of the checkpoint ``dataloader.amend_from`` names: all its old lanes.

        They are the old recipe's keys (its datasets, decision room and stage room); DCP
        fills them before :meth:`_amend` reads them.
        """
        old = self._amend_old
        assert old is not None
        return to_dcp_state(
            _every_lane_at_start(old),
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            dataset_names=[d.name for d in old.recipe.datasets],
            **self._amend_layout(),
        )

    def cache_stats(self) -> dict[str, int] | None:
        """Return the node cache's counters in this process, or None without a cache limit.

        Keys: hits, misses, bytes_fetched, evictions, peak_bytes, limit_bytes and more (see
        :meth:`~zephon_nodes.io.nodecache.cache.NodeCache.stats`); log them with your metrics.
        """
        return self.pipeline.cache_stats()

    def _fresh_state(self) -> dict[str, Any]:
        p = self.pipeline
        return {
            "format": FORMAT,
            "fingerprint": p.fingerprint,
            "recipe": dict(p.summary),
            "num_lanes": p.num_lanes,
            "step": 0,
            "micro": 0,
            "lanes": {str(i): [0, 0] for i in self.lanes},
        }

    def _start(self) -> None:
        if self.config.relane_from and not self._loaded:
            raise CheckpointError(
                f"dataloader.relane_from={self.config.relane_from} but no checkpoint was "
                f"loaded: there is nothing to re-lane (unset it to start afresh)"
            )
        if self.config.amend_from and not self._loaded:
            raise CheckpointError(
                f"dataloader.amend_from={self.config.amend_from} but no checkpoint was "
                f"loaded: there is nothing to amend (unset it to start afresh)"
            )
        state = self._restore
        t0 = time.perf_counter()
        if isinstance(self._node, Prefetcher):
            snap = None if state is None else {"snapshot": state, "steps_since_snapshot": 0}
            self._node.reset(snap)
        else:
            self._node.reset(state)
        self._restore = None
        self._started = True
        if state is not None and self._saved_dp is not None:  # a load, not a set_mixture
            self._log_restore(state, self._saved_dp, time.perf_counter() - t0)
            self._saved_dp = None

    def _lane_span(self) -> str:
        return f"{self.lanes[0]}-{self.lanes[-1]}" if len(self.lanes) > 1 else f"{self.lanes[0]}"

    def _log_restore(self, state: Mapping[str, Any], saved_dp: int, seconds: float) -> None:
        """One line per rank: the restored step, the dp sizes, the samples replayed."""
        replayed = sum(int(state["lanes"][str(i)][1]) for i in self.lanes)
        logger.info(
            "zephon restore: rank %d restored the state of step %d saved at dp %d, now at dp "
            "%d (lanes %s): replayed %d sample(s) of the lanes' current flush windows in %.2f s",
            self.dp_rank,
            int(state["step"]),
            saved_dp,
            self.dp_world_size,
            self._lane_span(),
            replayed,
            seconds,
        )

    def _current_state(self) -> dict[str, Any]:
        if isinstance(self._node, Prefetcher):
            st = self._node.get_state()
            if st.get("steps_since_snapshot", 0) != 0:  # never with snapshot_frequency=1
                raise CheckpointError("prefetcher state is not at a snapshot")
            return dict(st["snapshot"])
        return self.multiplexer.get_state()

    def _micro_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Yield the rank's micro-batches of ``[rows, seq_len]`` fields.

        Continues where the last iteration (or checkpoint) stopped; returns where the data
        ends, after the same step on every rank.
        """
        while True:
            if not self._started or self._restore is not None:
                self._start()  # at the start, after a load, or after set_mixture
            t0 = time.perf_counter()
            step_start = self._state["micro"] == 0
            try:
                batch: dict[str, torch.Tensor] | None = next(self._node)
            except StopIteration:
                batch = None
            if step_start and self._finite and not all_ranks_continue(batch is not None):
                # Another rank's lanes ran dry: every rank stops after the same step.
                logger.info("the data ended after step %d (on every rank)", self._state["step"])
                return
            if batch is None:
                return
            self._state = self._current_state()
            if "dataset_ids" in batch:
                self._dataset_ids.append(batch["dataset_ids"])
                del self._dataset_ids[:-1024]
            self._count(batch, time.perf_counter() - t0)
            if self._dumper is not None:
                step, micro = self._state["step"], self._state["micro"]
                index = (micro - 1) % self.micro_per_step
                self._dumper.add(step if micro == 0 else step + 1, index, batch)
            self.step_check.took()
            yield batch

    def _count(self, batch: dict[str, torch.Tensor], wait_s: float) -> None:
        self._step_batches.append(batch)
        self._step_wait += wait_s
        if self._state["micro"] == 0:  # the step's last micro-batch
            self._steps.step(self._step_batches, self._step_wait)
            self._step_batches, self._step_wait = [], 0.0

    def metrics(self) -> dict[str, Any]:
        """Return the rank's run metrics (a plain dict; see ``docs/torchtitan.md``).

        As :meth:`~zephon_nodes.engine.multiplexer.Multiplexer.metrics` (operators, queues,
        skipped records, replay time), but the per-step numbers are those of the steps the
        trainer took:
        ``step`` is the last step fully handed out, ``data_wait_s`` the time the trainer
        waited for its micro-batches (after the prefetcher), ``samples``, ``tokens`` and
        ``padding_fraction`` its rows.
        """
        out = self.multiplexer.metrics()
        st = self._steps
        out.update(
            step=int(self._state["step"]),
            data_wait_s=st.wait_s,
            samples=st.samples,
            tokens=st.tokens,
            padding_fraction=st.padding_fraction,
            data_wait_s_total=st.total_wait_s,
            samples_total=st.total_samples,
            tokens_total=st.total_tokens,
        )
        return out

    def pop_dataset_ids(self) -> list[torch.Tensor]:
        """Return the ``dataset_ids`` of the micro-batches yielded since the last call.

        Each is int64 ``[local_batch_size, seq_len]``: the recipe dataset index of every
        label token, -1 on padding. TorchTitan passes every ``input_dict`` key to the
        model, so the loader keeps this field aside for controllers (per-domain loss).
        """
        out, self._dataset_ids = self._dataset_ids, []
        return out

    @property
    def mixture_log(self) -> list[tuple[int, dict[str, float]]]:
        """The decisions made so far: ``[(step, {dataset: weight}), ...]`` (normalized)."""
        state = self._restore if self._restore is not None else self._state
        log = (state.get(MIXTURE_KEY) or {}).get("log", [])
        return [(int(e["step"]), dict(e["weights"])) for e in log]

    def set_mixture(self, weights: Mapping[str, float], *, group: Any = None) -> None:
        """Change the mixture after the step just consumed (call between steps).

        The decision ``(step, weights)`` joins the log kept in the checkpoint and takes
        effect in each lane from the first flush window after the lane's position at this
        step (see :mod:`zephon_nodes.engine.mixture_log`); micro-batches prefetched under the
        old weights are thrown away and recomputed. With ``torch.distributed`` initialized,
        one all-gather on ``group`` (default: the whole job; pass the data-parallel group)
        checks that every rank makes the same decision at the same step.

        Args:
            weights: ``{dataset: weight}`` for every recipe dataset (0 pauses one);
                renormalized.
            group: Process group to check agreement on.

        Raises:
            RecipeError: On an unknown or missing dataset, a bad weight, a call in the
                middle of a step, a full log (``dataloader.max_decisions``), or when ranks
                disagree (naming both weight sets).
        """
        state = self._restore if self._restore is not None else self._state
        # A re-laned stream refuses, and so does one whose recipe changed (a stage or an
        # amendment), also before iteration reaches the node.
        segment_for_state(self.pipeline, state).work_source.refuse_decisions()
        names = [d.name for d in self.pipeline.recipe.datasets]
        normalized = normalize_weights(names, weights, where="ZephonDataLoader.set_mixture")
        log = (state.get(MIXTURE_KEY) or {}).get("log", [])
        if len(log) >= self.max_decisions:
            raise RecipeError(
                f"set_mixture: the decision log is full ({len(log)} decisions, "
                f"dataloader.max_decisions={self.max_decisions}); raise it"
            )
        check_agreement(int(state["step"]), len(log), normalized, group)
        new = with_decision(state, normalized)
        self._restore = new
        self._state = new

    def state_dict(self) -> dict[str, Any]:
        """Return the checkpoint: one ``lane_NNNNN`` tensor per owned lane + replicated keys.

        On a freshly built loader this is a placeholder of the right keys and shapes for the
        lanes this rank owns, which is what DCP needs to load a checkpoint written at
        another dp size.
        """
        state = self._restore if self._restore is not None else self._state
        if self.config.amend_from and not self._started and self._restore is None:
            return self._amend_keys()  # what DCP reads: the old recipe's checkpoint keys
        if self.config.relane_from and not self._started and self._restore is None:
            state = self._relane_template()  # what DCP reads: the old checkpoint's keys
        if state["micro"]:
            logger.warning(
                "checkpoint taken after micro-batch %d of a recipe step: %s is not a "
                "multiple of the recipe's global_batch_size=%d, so this checkpoint resumes "
                "only on the same dp size and micro-batch size",
                state["micro"],
                self.STEP.name,
                self.pipeline.recipe.global_batch_size,
            )
        t0 = time.perf_counter()
        out = to_dcp_state(
            state,
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            dataset_names=[d.name for d in self.pipeline.recipe.datasets],
            max_decisions=self.max_decisions,
            lineage_bytes=self._lineage_room(state),
            stage_room=self._stage_room(state),
        )
        # A loader that has not started and has nothing to restore is asked for the keys a
        # checkpoint load fills: no checkpoint of its own.
        level = logging.INFO if self._started or self._restore is not None else logging.DEBUG
        logger.log(
            level,
            "zephon checkpoint: rank %d saved the state of step %d at dp %d (lanes %s, "
            "%d key(s)) in %.3f s",
            self.dp_rank,
            int(state["step"]),
            self.dp_world_size,
            self._lane_span(),
            len(out),
            time.perf_counter() - t0,
        )
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from a checkpoint written at any dp size with the same recipe.

        The state is validated here (so a mismatch fails at load time); the lanes replay
        their flush windows when iteration starts.

        Raises:
            CheckpointError: Naming what differs (recipe fields, lanes, step, layout).
        """
        if not state_dict:
            return
        self._loaded = True
        dp = state_dict.get(DP_KEY)
        self._saved_dp = int(dp.reshape(-1)[0]) if isinstance(dp, torch.Tensor) else -1
        room = self.config.max_lineage_bytes if self.config.relaned else 0
        if self.config.relane_from:
            state = self._relane(state_dict, room)
        elif self.config.amend_from:
            state = self._amend(state_dict)
        else:
            state = from_dcp_state(
                state_dict,
                self.pipeline,
                self.lanes,
                dp_world_size=self.dp_world_size,
                local_batch_size=self.local_batch_size,
                max_decisions=self.max_decisions,
                lineage_bytes=room,
                stage_room=self._stage_room(),
            )
            self._read_relaned(state)
        check_rank_state(self.pipeline, state, self.lanes)  # what the rank node checks
        self._restore = state
        self._state = state

    def _relane(self, state_dict: dict[str, Any], room: int) -> dict[str, Any]:
        """Re-lane the loaded checkpoint of ``dataloader.relane_from`` lanes (every rank alike)."""
        old_lanes = self.config.relane_from
        old = pipeline_at(self.pipeline, old_lanes)
        saved = from_dcp_state(
            state_dict,
            old,
            list(range(old_lanes)),
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            max_decisions=self.max_decisions,
            lineage_bytes=room,
            stage_room=self._stage_room(),
        )
        new = relane_state(self.pipeline, saved, self.pipeline.num_lanes)
        logger.warning(
            "dataloader.relane_from=%d: re-laned the checkpoint of step %d from %d to %d lanes "
            "(each new lane first replays the rest of its old lanes' flush windows, then takes "
            "the untouched work items; no document lost or repeated). Checkpoints from now on "
            "carry the lineage: resume them with dataloader.relane_from = 0 and "
            "dataloader.relaned = true",
            old_lanes,
            new["step"],
            old_lanes,
            new["num_lanes"],
        )
        self._read_relaned(new)
        new["lanes"] = {str(i): new["lanes"][str(i)] for i in self.lanes}
        return new

    def _amend(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Amend the loaded checkpoint of ``dataloader.amend_from`` to this job's recipe.

        Every rank computes the same state (each lane's cut window is replayed, a pure
        function of the checkpoint) and keeps its own lanes.
        """
        old = self._amend_old
        assert old is not None
        where = f"dataloader.amend_from={self.config.amend_from}"
        fp = state_dict.get("fingerprint")
        written = (
            bytes(fp.tolist()).hex()
            if isinstance(fp, torch.Tensor) and fp.dtype == torch.uint8 and fp.numel() == 32
            else None
        )
        if written == self.pipeline.fingerprint != old.fingerprint:
            raise CheckpointError(
                f"{where} but the checkpoint was written with this job's recipe "
                f"{self.config.recipe} (after the amendment): resume it with "
                f"dataloader.amend_from unset and dataloader.amended = true"
            )
        saved = from_dcp_state(
            state_dict,
            old,
            list(range(old.num_lanes)),
            dp_world_size=self.dp_world_size,
            local_batch_size=self.local_batch_size,
            **self._amend_layout(),
        )
        if saved["micro"]:
            raise CheckpointError(
                f"{where}: the checkpoint was taken after micro-batch {saved['micro']} of step "
                f"{saved['step'] + 1}; a recipe changes only after a whole step (resume it "
                f"with the old recipe to the next step boundary and amend a checkpoint there)"
            )
        new = amend_state(old, saved, self.pipeline)
        logger.warning(
            "%s: amended the checkpoint of step %d from recipe %s to %s (each lane's current "
            "flush window is cut: its samples not yet handed out are dropped and counted; "
            "kept datasets continue where each lane left them, added ones start at their "
            "beginning). Checkpoints from now on carry the stage section: resume them with "
            "dataloader.amend_from unset and dataloader.amended = true",
            where,
            new["step"],
            self.config.amend_from,
            self.config.recipe,
        )
        new["lanes"] = {str(i): new["lanes"][str(i)] for i in self.lanes}
        section = new[STAGE_KEY]
        section["lanes"] = {str(i): section["lanes"][str(i)] for i in self.lanes}
        return new

    def close(self) -> None:
        """Stop the worker pools."""
        self.step_check.close()
        self.multiplexer.close()
        if self.pool is not None:
            self.pool.close()


def _every_lane_at_start(pipeline: Any) -> dict[str, Any]:
    """A state of ``pipeline``'s recipe holding every lane (the keys of an old checkpoint)."""
    return {
        "format": FORMAT,
        "fingerprint": pipeline.fingerprint,
        "recipe": dict(pipeline.summary),
        "num_lanes": pipeline.num_lanes,
        "step": 0,
        "micro": 0,
        "lanes": {str(i): [0, 0] for i in range(pipeline.num_lanes)},
    }
