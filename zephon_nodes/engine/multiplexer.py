"""The multiplexer: one rank's view of the global batches, with the lane-keyed checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torchdata.nodes import BaseNode

from zephon_nodes.engine.checkpoint import FORMAT, validate_state
from zephon_nodes.engine.lane import Lane
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.errors import CheckpointError, RecipeError
from zephon_nodes.operators.batch import collate
from zephon_nodes.recipe.spec import Recipe

__all__ = ["LANE_KEY", "CompiledRecipe", "Multiplexer"]

LANE_KEY = "lane"


class CompiledRecipe(Protocol):
    """What a multiplexer needs of a compiled recipe (a :class:`~zephon_nodes.Pipeline`)."""

    recipe: Recipe
    fingerprint: str
    summary: dict[str, Any]
    work_source: WorkSource

    @property
    def num_lanes(self) -> int:
        """The recipe's lane count."""


class Multiplexer(BaseNode[dict[str, torch.Tensor]]):
    """Yield one rank's micro-batches: ``G/L`` samples from each owned lane per step.

    For every optimizer step it takes the next ``G/L`` samples of each owned lane, in lane
    order, and cuts them into micro-batches of ``local_batch_size`` rows (dicts of
    ``LongTensor``: ``input``, ``labels``, ``positions``, plus ``lane``, the lane of each
    row). Reassembled in lane order, the ranks' rows are exactly the global batch, whatever
    the number of ranks.

    State (plain JSON-safe data): format, recipe fingerprint and summary, lane count, step,
    micro-batches already yielded in the current step, and per owned lane
    ``[window, consumed]`` as of the start of the current step. Positions are committed when
    the step's last micro-batch is handed out, so a prefetcher above cannot skew them. A
    state taken in the middle of a step resumes only on the same lanes and micro-batch size.

    Args:
        lanes: The rank's lanes by lane index.
        pipeline: The compiled recipe (fingerprint, lane count, batch geometry).
        local_batch_size: Rows per micro-batch; default ``G/R`` (one micro-batch per step).
    """

    def __init__(
        self,
        lanes: Mapping[int, Lane],
        pipeline: CompiledRecipe,
        local_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.lanes = dict(sorted(lanes.items()))
        self.pipeline = pipeline
        recipe = pipeline.recipe
        self.samples_per_lane = recipe.samples_per_lane
        per_step = self.samples_per_lane * len(self.lanes)
        if not self.lanes:
            raise RecipeError("a rank needs at least one lane")
        self.local_batch_size = local_batch_size or per_step
        if per_step % self.local_batch_size:
            raise RecipeError(
                f"this rank's share of a step ({per_step} samples: {len(self.lanes)} lanes x "
                f"{self.samples_per_lane}) must be a multiple of local_batch_size="
                f"{self.local_batch_size}"
            )
        self.micro_per_step = per_step // self.local_batch_size
        self._step = 0
        self._micro = 0
        self._positions: dict[int, tuple[int, int]] = {}
        self._pending: list[dict[str, torch.Tensor]] = []
        self._pending_end: dict[int, tuple[int, int]] = {}
        self._exhausted = False
        #: Called with ``{lane: next work item index}`` (start of the lane's current flush
        #: window) after a reset and after each step, e.g. to plan a node cache's future.
        self.position_hooks: list[Callable[[dict[int, int]], None]] = []

    def _notify_positions(self) -> None:
        k = self.pipeline.recipe.flush_every
        positions = {i: w * k for i, (w, _) in self._positions.items()}
        for hook in self.position_hooks:
            hook(positions)

    @property
    def step(self) -> int:
        """Number of steps whose micro-batches were all handed out."""
        return self._step

    def _layout(self) -> dict[str, Any]:
        return {"lanes": list(self.lanes), "local_batch_size": self.local_batch_size}

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start from step 0, or restore a state (validated first; raises CheckpointError)."""
        super().reset(initial_state)
        self._pending, self._pending_end, self._exhausted = [], {}, False
        if initial_state is None:
            self._positions = {i: (0, 0) for i in self.lanes}
            self._notify_positions()
            for lane in self.lanes.values():
                lane.reset(None)
            self._step, self._micro = 0, 0
            return
        p = self.pipeline
        positions = validate_state(
            initial_state,
            fingerprint=p.fingerprint,
            summary=p.summary,
            num_lanes=p.num_lanes,
            lanes=self.lanes,
        )
        flush_every = p.recipe.flush_every
        for i in self.lanes:
            w = positions[i][0]
            if w > 0 and p.work_source.work(i, (w - 1) * flush_every) is None:
                raise CheckpointError(
                    f"checkpoint lane {i}: window {w} is beyond the end of the lane's stream "
                    f"(its work item {(w - 1) * flush_every} does not exist)"
                )
        micro = initial_state["micro"]
        if micro:
            if initial_state.get("layout") != self._layout():
                raise CheckpointError(
                    f"the checkpoint was taken after micro-batch {micro} of step "
                    f"{initial_state['step'] + 1}; it can resume only on the same layout "
                    f"{initial_state.get('layout')!r}, this rank has {self._layout()!r}"
                )
            if micro >= self.micro_per_step:
                raise CheckpointError(f"checkpoint micro={micro} >= {self.micro_per_step}")
        self._positions = {i: positions[i] for i in self.lanes}
        self._notify_positions()
        for i, lane in self.lanes.items():
            w, c = positions[i]
            lane.reset({Lane.WINDOW_KEY: w, Lane.CONSUMED_KEY: c})
        self._step = initial_state["step"]
        self._micro = 0
        if micro:
            self._build_step()
            self._micro = micro

    def _build_step(self) -> None:
        rows: list[dict[str, np.ndarray]] = []
        lane_ids: list[int] = []
        end: dict[int, tuple[int, int]] = {}
        for i, lane in self.lanes.items():
            for _ in range(self.samples_per_lane):
                rows.append(next(lane))
                lane_ids.append(i)
            st = lane.get_state()
            end[i] = (st[Lane.WINDOW_KEY], st[Lane.CONSUMED_KEY])
        b = self.local_batch_size
        lane_arr = np.asarray(lane_ids, dtype=np.int64)
        self._pending = []
        for k in range(self.micro_per_step):
            batch = collate(rows[k * b : (k + 1) * b])
            batch[LANE_KEY] = torch.from_numpy(lane_arr[k * b : (k + 1) * b].copy())
            self._pending.append(batch)
        self._pending_end = end

    def next(self) -> dict[str, torch.Tensor]:
        """Return the next micro-batch; StopIteration after the last full global batch."""
        if self._exhausted:
            raise StopIteration
        if self._micro == 0:
            try:
                self._build_step()
            except StopIteration:
                self._exhausted = True
                raise
        batch = self._pending[self._micro]
        self._micro += 1
        if self._micro == self.micro_per_step:
            self._positions = dict(self._pending_end)
            self._pending, self._pending_end = [], {}
            self._step += 1
            self._micro = 0
            self._notify_positions()
        return batch

    def get_state(self) -> dict[str, Any]:
        """Return the checkpoint state (a fresh, JSON-safe dict)."""
        p = self.pipeline
        state: dict[str, Any] = {
            "format": FORMAT,
            "fingerprint": p.fingerprint,
            "recipe": dict(p.summary),
            "num_lanes": p.num_lanes,
            "step": self._step,
            "micro": self._micro,
            "lanes": {str(i): [w, c] for i, (w, c) in self._positions.items()},
        }
        if self._micro:
            state["layout"] = self._layout()
        return state
