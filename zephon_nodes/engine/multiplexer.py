"""The multiplexer: one rank's view of the global batches, with the lane-keyed checkpoint."""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torchdata.nodes import BaseNode

from zephon_nodes.core.errors import CheckpointError, DataError, RecipeError
from zephon_nodes.engine.lane import Lane
from zephon_nodes.engine.metrics import StepMetrics, rank_metrics
from zephon_nodes.engine.parallel_map import prime_lanes, reset_lanes
from zephon_nodes.engine.replay_check import check_by_replay
from zephon_nodes.engine.restore_checks import check_rank_state
from zephon_nodes.engine.timeline import Timeline
from zephon_nodes.engine.unread import previous_stage
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.io.nodecache.workercounts import bad_cache_entries
from zephon_nodes.operators.batch import collate
from zephon_nodes.recipe import Recipe
from zephon_nodes.recipe.bounds import check_setting
from zephon_nodes.state.last_sample import (
    check_last_samples,
    sample_check,
)
from zephon_nodes.state.mixture import (
    MixtureLog,
    normalize_weights,
    with_decision,
)
from zephon_nodes.state.schema import (
    LAYOUT_KEY,
    LAYOUT_LANES_KEY,
    LINEAGE_KEY,
    LOCAL_BATCH_SIZE_KEY,
    MICRO_KEY,
    PASS_KEY,
    STEP_KEY,
    RankState,
)
from zephon_nodes.state.stage import summarize_changes

__all__ = ["LANE_KEY", "CompiledRecipe", "Multiplexer"]

LANE_KEY = "lane"


class Closable(Protocol):
    """A resource a node can own (a worker pool): closing twice is harmless."""

    def close(self) -> None:
        """Release the resource."""


def _close_all(resources: list[Closable]) -> None:
    for r in resources:
        r.close()


def _close_collected(resources: list[Closable]) -> None:
    """Finalizer: close in the main thread, else in a new thread.

    Garbage collection may run in any thread, even a pool's own, which must not wait for
    itself.
    """
    if not resources:
        return
    if threading.current_thread() is threading.main_thread():
        _close_all(resources)
    else:
        threading.Thread(target=_close_all, args=(resources,), daemon=True).start()


class CompiledRecipe(Protocol):
    """What a multiplexer needs of a compiled recipe (a :class:`~zephon_nodes.Pipeline`)."""

    recipe: Recipe
    fingerprint: str
    summary: dict[str, Any]
    work_source: WorkSource
    #: The re-lane lineage of the streams it reads (plain JSON), None if never re-laned.
    lineage: dict[str, Any] | None
    #: A recipe changing mid-run (engine/stages.py): the run's pipeline, the stage section
    #: of the stage this one runs (None: the base recipe), the step it started after and the
    #: step the next stage starts after (None: no more change).
    run: Any
    stage: Any
    base_step: int
    next_change: int | None

    @property
    def num_lanes(self) -> int:
        """The recipe's lane count."""

    def cache_stats(self) -> dict[str, int] | None:
        """The node cache's counters (None without a cache limit)."""


class Multiplexer(BaseNode[dict[str, torch.Tensor]]):
    """Yield one rank's micro-batches: ``G/L`` samples from each owned lane per step.

    For every optimizer step it takes the next ``G/L`` samples of each owned lane, in lane
    order, and cuts them into micro-batches of ``local_batch_size`` rows (dicts of
    ``LongTensor``: ``input``, ``labels``, ``positions``, ``dataset_ids``, plus ``lane``, the
    lane of each row). Reassembled in lane order, the ranks' rows are exactly the global
    batch, whatever the number of ranks.

    :meth:`set_mixture` changes the mixture between steps (a dynamic mixture, see
    :mod:`zephon_nodes.engine.mixture_log`); the decision log is part of the state.

    State (plain JSON-safe data): format, recipe fingerprint and summary, lane count, step,
    micro-batches already yielded in the current step, and per owned lane
    ``[window, consumed]`` as of the start of the current step. Positions are committed when
    the step's last micro-batch is handed out, so a prefetcher above cannot skew them. A
    state taken in the middle of a step resumes only on the same lanes and micro-batch size.

    Passes: a reset without a state (torchdata's "new epoch", a second ``iter(loader)``) after
    the node was used starts the recipe's next pass, with its own seeded order (see
    :meth:`~zephon_nodes.engine.work.WorkSource.for_pass`); the state then carries
    ``"pass": p`` and the step count restarts at 0. Pass 0 states have no ``pass`` key.

    Args:
        lanes: The rank's lanes by lane index.
        pipeline: The compiled recipe (fingerprint, lane count, batch geometry).
        local_batch_size: Rows per micro-batch; default ``G/R`` (one micro-batch per step).
        work_source: The work source the lanes read (default the pipeline's); decisions are
            installed into it, so each rank node should have its own (``fork()``).
        lane_builder: Builds lane ``i`` of another segment (``lane_builder(segment, i)``);
            without it the node cannot change segment (a stage, a re-laned state).
        timeline: The run's timeline (default ``Timeline(pipeline)``): the segment each
            state resumes, re-laned or in a stage, is the timeline's to say.
    """

    def __init__(
        self,
        lanes: Mapping[int, Lane],
        pipeline: CompiledRecipe,
        local_batch_size: int | None = None,
        work_source: WorkSource | None = None,
        lane_builder: Callable[[Any, int], Lane] | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        super().__init__()
        # A node stacked under torchdata's ParallelMapper can be reset by a new iterator
        # while the old one's read thread (joined with a timeout) is still inside next():
        # the two never interleave (tests/torchdata/test_loader_state.py).
        self._driving = threading.RLock()
        self.lanes = dict(sorted(lanes.items()))
        self.pipeline = pipeline
        #: The run's timeline: which segment a state resumes, and the planned stages.
        self.timeline = timeline if timeline is not None else Timeline(pipeline)
        self.work_source = work_source if work_source is not None else pipeline.work_source
        self._mixture = MixtureLog()
        if not self.lanes:
            raise RecipeError("a rank needs at least one lane")
        if local_batch_size is not None:
            check_setting("local_batch_size", local_batch_size)
        self._local_batch_size = local_batch_size
        self._geometry()
        #: Builds lane ``lane`` of another stage's pipeline (a recipe changing mid-run).
        self._lane_builder = lane_builder
        self._step = 0
        self._micro = 0
        self._positions: dict[int, tuple[int, int]] = {}
        self._pending: list[dict[str, torch.Tensor]] = []
        self._pending_end: dict[int, tuple[int, int]] = {}
        # Per owned lane, the last sample it handed out as of self._positions (a reference),
        # and its check once a state asked for it (state/last_sample.py).
        self._last: dict[int, Any] = {}
        self._pending_last: dict[int, Any] = {}
        self._last_checks: dict[int, int] | None = None
        self._exhausted = False
        self._pass = 0
        self._used = False
        self._partial: dict[int, int] = {}
        self._unused: dict[int, int] | None = None
        self._metrics = StepMetrics()
        self._own_state = False
        self._owned: list[Closable] = []
        # Closes what the node owns when it is garbage-collected (e.g. its Loader dropped).
        self._finalizer = weakref.finalize(self, _close_collected, self._owned)
        #: Called with ``{lane: next work item index}`` (start of the lane's current flush
        #: window) after a reset and after each step, e.g. to plan a node cache's future.
        self.position_hooks: list[Callable[[dict[int, int]], None]] = []

    def _geometry(self) -> None:
        """Samples per lane and micro-batches per step of the recipe in force."""
        self.samples_per_lane = self.pipeline.recipe.samples_per_lane
        per_step = self.samples_per_lane * len(self.lanes)
        lbs = self._local_batch_size
        self.local_batch_size = lbs if lbs is not None else per_step
        if per_step % self.local_batch_size:
            raise RecipeError(
                f"this rank's share of a step ({per_step} samples: {len(self.lanes)} lanes x "
                f"{self.samples_per_lane}) must be a multiple of local_batch_size="
                f"{self.local_batch_size}"
            )
        self.micro_per_step = per_step // self.local_batch_size

    def _switch(self, segment: Any) -> None:
        """Run another stage of the run's recipe: its lanes, work source and batch geometry."""
        if segment is self.pipeline:
            return
        if self._lane_builder is None:
            raise RecipeError(
                "this rank node cannot change its recipe mid-run (it was built without a lane "
                "builder; build it with Pipeline.rank_node)"
            )
        self.pipeline = segment
        self.lanes = {i: self._lane_builder(segment, i) for i in self.lanes}
        self.work_source = segment.work_source.fork()
        self._geometry()

    @property
    def positions(self) -> dict[int, tuple[int, int]]:
        """Per owned lane, ``(window, consumed)`` as of the start of the current step."""
        return dict(self._positions)

    @property
    def micro(self) -> int:
        """Micro-batches of the current step already handed out."""
        return self._micro

    def own(self, resources: Iterable[Closable]) -> None:
        """Close ``resources`` with this node (:meth:`close`, ``with``, or garbage collection).

        :meth:`~zephon_nodes.Pipeline.rank_node` hands over the pools it creates; a pool the
        caller passed in stays the caller's.
        """
        self._owned.extend(resources)

    def close(self) -> None:
        """Stop the worker pools this node owns (idempotent; a later ``reset`` restarts them)."""
        _close_all(self._owned)

    def __enter__(self) -> Multiplexer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pass_index(self) -> int:
        """The pass being read (0 until a reset without a state follows a used pass)."""
        return self._pass

    def _notify_positions(self) -> None:
        k = self.pipeline.recipe.flush_every
        ws = self.work_source
        positions = {  # a re-laned pass's windows vary; later passes are plain
            i: w * k if self._pass else ws.window_start(i, w, k)
            for i, (w, _) in self._positions.items()
        }
        for hook in self.position_hooks:
            hook(positions)

    @property
    def step(self) -> int:
        """Number of steps whose micro-batches were all handed out."""
        return self._step

    def _layout(self) -> dict[str, Any]:
        return {LAYOUT_LANES_KEY: list(self.lanes), LOCAL_BATCH_SIZE_KEY: self.local_batch_size}

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start from step 0, or restore a state (validated first; raises CheckpointError)."""
        with self._driving:
            t0 = time.perf_counter()
            self._restore(initial_state)
            elapsed = time.perf_counter() - t0
            self._metrics.restore_s = elapsed if initial_state is not None else 0.0

    def metrics(self) -> dict[str, Any]:
        """Return this rank's run metrics as a plain dict (see ``docs/cli.md``, Metrics)."""
        out = rank_metrics(self._metrics, self.lanes.values())
        out["step"] = self._step
        cache = self.pipeline.cache_stats()
        if cache is not None:  # with a node-cache limit; process workers' counters included
            out["node_cache"] = cache
        tokens = getattr(self.pipeline, "token_cache_stats", lambda: None)()
        if tokens is not None:  # with the token cache on
            out["token_cache"] = tokens

        out["bad_cache_entries"] = bad_cache_entries()  # dropped and made again, never served
        change = summarize_changes([self._changes_section()])
        if change is not None:  # the recipe changed mid-run (engine/stages.py)
            out["recipe_change"] = change
        return out

    def _restore(self, initial_state: dict[str, Any] | None) -> None:
        super().reset(initial_state)
        self._pending, self._pending_end, self._exhausted = [], {}, False
        self._partial, self._unused = {}, None
        self._last, self._pending_last, self._last_checks = {}, {}, None
        if initial_state is None:
            self._switch(self.timeline.segment(None))
            if self._used and self.pipeline.recipe.stages:
                raise RecipeError(
                    "a second pass (a new iter() without a state) over a recipe with [[stages]] "
                    "is not supported: its stages are steps of one run"
                )
            if self._used:
                self._pass += 1
            self._used = False
            self._install(MixtureLog())
            for lane in self.lanes.values():
                if self._pass:
                    lane.reset(
                        {Lane.WINDOW_KEY: 0, Lane.CONSUMED_KEY: 0, Lane.PASS_KEY: self._pass}
                    )
                else:
                    lane.reset(None)
            self._step, self._micro = 0, 0
            self._positions = {i: (0, 0) for i in self.lanes}
            self._notify_positions()
            return
        # The checks every caller shares (engine/restore_checks.py: the TorchTitan loaders too).
        checked = check_rank_state(self.timeline.run, initial_state, self.lanes)
        self._switch(checked.segment)
        p = self.pipeline
        positions, mixture = checked.positions, checked.mixture
        step = initial_state[STEP_KEY]
        self._install(mixture)
        flush_every = p.recipe.flush_every
        pass_index = initial_state.get(PASS_KEY, 0)
        source = self.work_source.for_pass(pass_index)
        for i in self.lanes:
            w = positions[i][0]
            if w > 0 and (source is None or not source.has_window(i, w - 1, flush_every)):
                raise CheckpointError(
                    f"checkpoint lane {i}: window {w} is beyond the end of the lane's stream "
                    f"(its work item {(w - 1) * flush_every} does not exist)"
                )
        micro = initial_state[MICRO_KEY]
        if micro:
            if initial_state.get(LAYOUT_KEY) != self._layout():
                raise CheckpointError(
                    f"the checkpoint was taken after micro-batch {micro} of step "
                    f"{step + 1}; it can resume only on the same layout "
                    f"{initial_state.get(LAYOUT_KEY)!r}, this rank has {self._layout()!r}"
                )
            if micro >= self.micro_per_step:
                raise CheckpointError(f"checkpoint micro={micro} >= {self.micro_per_step}")
        # A state this node just made (set_mixture) needs no replay. A check that replayed
        # leaves every lane at its saved position: the lanes are not replayed twice.
        placed = not self._own_state and check_by_replay(
            self, positions, step, pass_index, initial_state.get(LINEAGE_KEY)
        )
        self._positions = {i: positions[i] for i in self.lanes}
        self._notify_positions()
        # The lanes replay their windows together (engine/parallel_map.py: reset_lanes).
        if not placed:
            reset_lanes(
                [
                    (lane, {Lane.WINDOW_KEY: w, Lane.CONSUMED_KEY: c, Lane.PASS_KEY: pass_index})
                    for lane, (w, c) in ((lane, positions[i]) for i, lane in self.lanes.items())
                ]
            )
        self._pass, self._used = pass_index, True
        self._positions = {i: positions[i] for i in self.lanes}
        self._step = step
        self._check_last_samples(checked.last_sample)
        self._micro = 0
        if micro:
            self._build_step()
            self._micro = micro

    def _check_last_samples(self, saved: Mapping[int, int] | None) -> None:
        """Compare the lanes' replayed last samples with the state's ``last_sample`` checks.

        Called after the lanes replayed their windows (``self._step``, ``self._pass`` and
        ``self._positions`` are the state's); see :mod:`zephon_nodes.state.last_sample`.
        """
        self._last = {
            i: lane.last_sample for i, lane in self.lanes.items() if lane.last_sample is not None
        }
        if saved is None:  # a state written before the section existed: checked as before
            return
        checks = self._sample_checks()
        reached = {i: checks.get(i) for i in self.lanes}
        if self.pipeline.stage is not None:
            # States of a changed recipe written before the stage row was in the check
            # (2026-12-03/04): their lanes' checks without it (the same bar: a value that
            # needs the replayed sample, which the state does not hold).
            unfolded = {
                i: sample_check(self._pass, self._step, i, self._positions[i], sample)
                for i, sample in self._last.items()
            }
            reached = {
                i: unfolded[i] if i in unfolded and saved.get(i) == unfolded[i] else v
                for i, v in reached.items()
            }
        check_last_samples(saved, reached, self._positions, self._step)

    def _sample_checks(self) -> dict[int, int]:
        """Per owned lane with a last sample, its check (computed once per committed step).

        After a recipe change the lane's row of the ``stage`` section (its dataset counts,
        head and drops) and the section's shared values are in the check too, so an edited
        stage count or drop counter is refused like an edited position.
        """
        if self._last_checks is None:
            stage = self._stage_section()
            rows = {} if stage is None else stage.pop("lanes")
            self._last_checks = {
                i: sample_check(
                    self._pass,
                    self._step,
                    i,
                    self._positions[i],
                    sample,
                    stage=None if stage is None else {"row": rows.get(str(i)), "section": stage},
                )
                for i, sample in sorted(self._last.items())
            }
        return dict(self._last_checks)

    def _install(self, mixture: MixtureLog) -> None:
        """Install a decision log into this rank's work source."""
        names = [d.name for d in self.pipeline.recipe.datasets]
        if self.work_source.takes_decisions:
            k = self.pipeline.recipe.flush_every
            self.work_source.set_decisions(
                [tuple(w[n] for n in names) for _, w in mixture.entries],
                {i: [e * k for e in mixture.effects.get(i, [])] for i in self.lanes},
            )
        self._mixture = mixture

    @property
    def mixture_log(self) -> list[tuple[int, dict[str, float]]]:
        """The decisions in force: ``[(step, {dataset: weight}), ...]`` (normalized)."""
        return [(s, dict(w)) for s, w in self._mixture.entries]

    def set_mixture(self, weights: Mapping[str, float]) -> None:
        """Change the mixture after the current step: a weight per recipe dataset.

        Weights are token shares (0 pauses a dataset) and are renormalized. The decision is
        logged as ``(step, weights)`` and takes effect in each lane from the first flush
        window that begins after the lane's position now (see
        :mod:`zephon_nodes.engine.mixture_log`); work computed ahead is recomputed. Every rank
        must make the same decision after the same step.

        Raises:
            RecipeError: If a dataset is unknown or missing, a weight is invalid, or the
                call comes in the middle of a step.
        """
        self.work_source.refuse_decisions()  # a re-laned stream refuses
        names = [d.name for d in self.pipeline.recipe.datasets]
        normalized = normalize_weights(names, weights, where="set_mixture")
        with self._driving:  # between two next() calls, whichever thread calls it
            self.reset_own(with_decision(self._get_state(), normalized))

    def reset_own(self, state: dict[str, Any]) -> None:
        """Restore a state this node just made itself (no replay check: it is its own)."""
        self._own_state = True
        try:
            self.reset(state)
        finally:
            self._own_state = False

    def _build_step(self) -> None:
        prime_lanes(self.lanes.values())  # every lane's work queued now (first step first)
        rows: list[dict[str, np.ndarray]] = []
        lane_ids: list[int] = []
        end: dict[int, tuple[int, int]] = {}
        last: dict[int, Any] = {}
        for i, lane in self.lanes.items():
            for _ in range(self.samples_per_lane):
                try:
                    rows.append(next(lane))
                except StopIteration:
                    # The rows of this unfinished step are never delivered: count them.
                    self._partial = dict(Counter(lane_ids))
                    raise
                lane_ids.append(i)
            st = lane.get_state()
            end[i] = (st[Lane.WINDOW_KEY], st[Lane.CONSUMED_KEY])
            last[i] = rows[-1]
        b = self.local_batch_size
        lane_arr = np.asarray(lane_ids, dtype=np.int64)
        self._pending = []
        for k in range(self.micro_per_step):
            batch = collate(rows[k * b : (k + 1) * b])
            batch[LANE_KEY] = torch.from_numpy(lane_arr[k * b : (k + 1) * b].copy())
            self._pending.append(batch)
        self._pending_end, self._pending_last = end, last

    def next(self) -> dict[str, torch.Tensor]:
        """Return the next micro-batch; StopIteration after the last full global batch."""
        with self._driving:
            return self._next()

    def _next(self) -> dict[str, torch.Tensor]:
        self._used = True
        if self._exhausted:
            raise StopIteration
        if self._micro == 0:
            if self.pipeline.next_change == self._step:
                self._enter_stage()
            t0 = time.perf_counter()
            try:
                self._build_step()
            except StopIteration:
                self._exhausted = True
                if self.pipeline.recipe.work.end_of_data == "error":
                    self._refuse_unused()
                raise
            self._metrics.step(self._pending, time.perf_counter() - t0)
        batch = self._pending[self._micro]
        self._micro += 1
        if self._micro == self.micro_per_step:
            self._positions = dict(self._pending_end)
            self._last, self._last_checks = dict(self._pending_last), None
            self._pending, self._pending_end, self._pending_last = [], {}, {}
            self._step += 1
            self._micro = 0
            self._notify_positions()
        return batch

    def _enter_stage(self) -> None:
        """Move to the recipe's stage starting now (see :mod:`zephon_nodes.engine.stages`)."""
        self.timeline.enter_planned_stage(self)

    def unused_samples(self) -> dict[int, int]:
        """Count, per owned lane that ends, the samples of this pass never delivered.

        A finite stream stops after its last full global batch: the rows already taken for
        the unfinished step and everything the lanes still hold are not delivered. Call
        after ``next()`` raised StopIteration; the lanes are drained to count (the same
        work as reading them). The counts do not depend on the dp size or workers. A lane
        that never ends (:meth:`endless_lanes`: its ``"end"`` datasets paused by a
        decision while a repeating one goes on) holds no count: it has no end to count to.

        Raises:
            RuntimeError: If the stream has not ended.
        """
        if not self._exhausted:
            raise RuntimeError("unused_samples() is known only after the stream has ended")
        if self._unused is None:
            unused = {}
            endless = set(self.endless_lanes())
            for i, lane in self.lanes.items():
                if i in endless:
                    continue
                n = self._partial.get(i, 0)
                while True:
                    try:
                        next(lane)
                    except StopIteration:
                        break
                    n += 1
                unused[i] = n
            self._unused = unused
        return dict(self._unused)

    def endless_lanes(self) -> list[int]:
        """The owned lanes whose stream of this pass never ends (sorted).

        A mixture's lane ends where it would take an item of an ``"end"`` dataset's next
        pass; after a decision (or a schedule) that gives every such dataset weight 0 while
        a ``"repeat"`` one goes on, it never does. The data still ends when another lane
        runs dry.
        """
        source = self.work_source.for_pass(self._pass)
        if source is None:
            return []
        return sorted(i for i in self.lanes if source.lane_length(i) is None)

    def _refuse_unused(self) -> None:
        endless = self.endless_lanes()
        unused = {i: n for i, n in self.unused_samples().items() if n}
        if unused or endless:
            never = f"; lanes {endless} never end" if endless else ""
            raise DataError(
                f"work.end_of_data='error': the data ended after step {self._step} with "
                f"{sum(unused.values())} samples not delivered (per lane: {unused}{never}); "
                f"the lanes hold different amounts of data"
            )

    def get_state(self) -> dict[str, Any]:
        """Return the checkpoint state (a fresh, JSON-safe dict).

        Safe to call from another thread than the one calling :meth:`next`: it waits for a
        step being committed, so positions, step and sample checks are of one moment.
        """
        with self._driving:
            return self._get_state()

    def _get_state(self) -> dict[str, Any]:
        p = self.pipeline
        return RankState(
            fingerprint=p.fingerprint,
            recipe=p.summary,
            num_lanes=p.num_lanes,
            step=self._step,
            micro=self._micro,
            lanes=self._positions,
            layout=self._layout() if self._micro else None,
            pass_index=self._pass,
            mixture=self._mixture.to_state(list(self.lanes)) if self._mixture else None,
            lineage=p.lineage,  # a re-laned stream (engine/relane/)
            stage=self._stage_section(),
            last_sample=self._sample_checks(),
        ).to_dict()

    def _stage_section(self) -> dict[str, Any] | None:
        """The stage section of this rank's lanes (None before any recipe change)."""
        stage = self.pipeline.stage
        return None if stage is None else stage.to_state(lanes=self.lanes)

    def _changes_section(self) -> dict[str, Any] | None:
        """What the recipe changes so far dropped in this rank's lanes, as a stage section.

        A re-laned run before its next change reports the section its lineage keeps: the
        rows of the old lanes this rank's lanes replay.
        """
        own = self._stage_section()
        if own is not None:
            return own
        kept, lane_of = previous_stage(self.pipeline)
        if kept is None or lane_of is None:
            return None
        return kept.to_state(lanes=[old for old in kept.lanes if lane_of(old) in self.lanes])
