"""The work source of a stage: every dataset's stream continued in each lane where it was.

Every dataset ``d`` has one stream per lane, whatever the stage: the lane's ``t``-th work
item of ``d`` is the dataset's global item ``k = t * L + lane`` of its seeded epoch
permutations (:class:`~zephon_nodes.engine.work.DatasetWorkSource` with the dataset's
*stream key*: its index in the base recipe, or, for a dataset added by a stage or an
amendment, a key derived from its name, so that its order does not depend on when it was
added). A plain recipe's lanes read exactly these streams (one dataset: ``t`` is the lane
position; a mixture: its plan interleaves them).

A stage that starts with lane ``lane`` having read ``o_d`` items of each dataset ``d`` reads,
at its lane position ``i``: the dataset ``d`` and count ``t`` that the stage's own mixing plan
(its weights; its block shuffles seeded by a salt of the stage) puts there, and then item
``o_d + t`` of ``d``'s stream. So a kept dataset continues where it was, a removed one is no
longer read, an added one starts at its beginning, and no item is read twice. A lane whose
change cut a work item in two first reads that item's records not yet used (its *head*,
position 0), then the plan from position 1.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.engine.mixing import MixingWorkSource
from zephon_nodes.engine.unread import UnreadStream, item_at, stream_global
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.recipe.schedule import WeightSchedule
from zephon_nodes.state.stage import Unread, UnreadState, lane_suffixes

__all__ = ["StageWorkSource", "added_stream_key", "dataset_counts"]

_ADDED_KEY_BASE = 1 << 32


def added_stream_key(name: str) -> int:
    """The stream key of a dataset first read after a change: a function of its name."""
    return _ADDED_KEY_BASE + zlib.crc32(name.encode("utf-8"))


def dataset_counts(source: WorkSource, lane: int, n: int, names: Sequence[str]) -> list[int]:
    """Work items of each of ``names`` (the source's datasets) among ``lane``'s first ``n``.

    Raises:
        RecipeError: If the source's lanes are not made of per-dataset streams (a stream
            dealt by size or wrapped; a re-laned one is continued by engine/unread.py).
    """
    if isinstance(source, StageWorkSource):
        return source.counts(lane, n)
    if isinstance(source, MixingWorkSource):
        return list(source.counts(lane, n))
    if type(source) is DatasetWorkSource and len(names) == 1:
        return [n]
    raise RecipeError(
        f"a recipe change needs lanes that read each dataset's own stream (dealt round-robin); "
        f"this run's streams are {type(source).__name__} (dealt by size or wrapped at the "
        f"end of data), which a change cannot continue"
    )


@dataclasses.dataclass(frozen=True)
class _Stream:
    """One dataset of the stage: its stream, and per lane the items read before the stage."""

    source: DatasetWorkSource | UnreadStream
    offsets: Mapping[int, int]
    weight: float


class StageWorkSource(WorkSource):
    """The work of one stage, continuing each dataset's per-lane stream (module docstring).

    Args:
        datasets: The stage recipe's datasets, in its order.
        keys: Each dataset's stream key.
        epochs: Per dataset, its epochs (None: endless, ``on_exhausted = "repeat"``).
        weights: Per dataset, its token share.
        tokens_per_item: Per dataset, estimated tokens per work item (for the plan).
        offsets: Per lane, per dataset, work items read before the stage.
        heads: Per lane with a head: ``(dataset, count, first record, global)`` of the cut
            item (``global``: ``count`` is the item's global index in the dataset's stream,
            a change after a re-lane cut it).
        seed: The recipe's seed (every dataset's permutations).
        salt: The stage's seed of its mixing plan's block shuffles and of its shuffle buffers.
        num_lanes: Lanes ``L``.
        block: Work items per plan block (the recipe's ``mixture.block``).
        unread: Per dataset (index) whose stream is its unread items after a re-lane, the
            set (:mod:`zephon_nodes.engine.unread`); the offsets count into that stream.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        keys: Sequence[int],
        epochs: Sequence[int | None],
        weights: Sequence[float],
        tokens_per_item: Sequence[float],
        offsets: Mapping[int, Sequence[int]],
        seed: int,
        salt: int,
        num_lanes: int,
        block: int,
        heads: Mapping[int, tuple[int, int, int, bool]] | None = None,
        unread: Mapping[int, Unread] | None = None,
    ) -> None:
        super().__init__(num_lanes)
        self.datasets = list(datasets)
        self.keys = [int(k) for k in keys]
        self.salt = salt
        self.heads = dict(heads or {})
        unread = dict(unread or {})
        self.streams = []
        for d, (ds, key, ep, w) in enumerate(zip(datasets, keys, epochs, weights, strict=True)):
            own = DatasetWorkSource(ds, seed, num_lanes, ep, dataset_index=key)
            stream = own if d not in unread else UnreadStream(own, unread[d], num_lanes)
            self.streams.append(
                _Stream(stream, {lane: int(row[d]) for lane, row in offsets.items()}, float(w))
            )
        self.plan: MixingWorkSource | None = None
        if len(self.datasets) > 1:
            total = float(sum(weights))
            schedule = WeightSchedule(((0.0, tuple(float(w) / total for w in weights)),))
            self.plan = MixingWorkSource(
                self.datasets,
                salt,
                num_lanes,
                None,
                ["repeat"] * len(self.datasets),
                schedule,
                tokens_per_item,
                block,
            )
        self._ends: dict[int, int | None] = {}

    # -- geometry ----------------------------------------------------------------------------

    def _offset(self, d: int, lane: int) -> int:
        try:
            return self.streams[d].offsets[lane]
        except KeyError:
            raise RecipeError(
                f"lane {lane} has no start point in this stage (the stage was entered by "
                f"ranks that do not own it)"
            ) from None

    def _head(self, lane: int) -> int:
        return 1 if lane in self.heads else 0

    def locate(self, lane: int, i: int) -> tuple[int, int]:
        """``(dataset, t)``: plan position ``i`` of ``lane`` is the ``t``-th of ``dataset``."""
        if self.plan is None:
            return 0, i
        return self.plan.locate(i, lane)

    def counts(self, lane: int, n: int) -> list[int]:
        """Items of each dataset the lane has read after its first ``n`` stage positions.

        Counted from the dataset's start (the items before the stage included, a head's
        item too), so a later stage continues from these.
        """
        n = max(0, n - self._head(lane))
        inside = [n] if self.plan is None else list(self.plan.counts(lane, n))
        return [self._offset(d, lane) + c for d, c in enumerate(inside)]

    def lane_end(self, lane: int) -> int | None:
        """The first position past the end of ``lane``'s stream (None: endless)."""
        if lane in self._ends:
            return self._ends[lane]
        end: int | None = None
        for d, stream in enumerate(self.streams):
            length = stream.source.lane_length(lane)
            if length is None or stream.weight <= 0:
                continue
            left = max(0, length - self._offset(d, lane))
            if self.plan is None:
                n: int | None = left + 1
            else:
                n = self.plan.first_reaching(lane, d, left + 1)
            if n is not None and (end is None or n - 1 < end):
                end = n - 1
        if end is not None:
            end += self._head(lane)
        self._ends[lane] = end
        return end

    def lane_length(self, lane: int) -> int | None:
        """Work items of ``lane`` in the stage (None: endless)."""
        return self.lane_end(lane)

    def shuffle_parts(self, seed: int, lane: int, window: int) -> tuple[int, int, int]:
        """The stage's shuffle buffers are seeded by its salt (never an earlier stage's)."""
        return self.salt, lane, window

    def refuse_decisions(self) -> None:
        """Refuse ``set_mixture`` after a recipe change.

        Raises:
            RecipeError: Always.
        """
        raise RecipeError(
            "set_mixture is not supported after a recipe change (a stage or an amendment): "
            "give the new weights as a stage's `weights` or amend the recipe"
        )

    # -- the WorkSource ----------------------------------------------------------------------

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return work item ``i`` of ``lane`` in the stage, or None past the lane's end."""
        end = self.lane_end(lane)
        if end is not None and i >= end:
            return None
        head = self.heads.get(lane)
        if head is not None and i == 0:
            d, t, record, whole = head
            stream = self.streams[d].source
            if whole:
                base = stream.base if isinstance(stream, UnreadStream) else stream
                item = item_at(base, t)
            else:
                item = stream.work(lane, t)
            if item is None or not item.start <= record < item.stop:
                raise RecipeError(
                    f"lane {lane}: the work item cut by the recipe change (item {t} of dataset "
                    f"{self.datasets[d].name!r}, from record {record}) does not exist"
                )
            return dataclasses.replace(item, dataset=d, lane=lane, position=0, start=record)
        d, t = self.locate(lane, i - self._head(lane))
        item = self.streams[d].source.work(lane, self._offset(d, lane) + t)
        if item is None:
            return None
        return dataclasses.replace(item, dataset=d, position=i)

    # -- where items are in their datasets' streams (a change after a re-lane) -----------------

    def global_index(self, lane: int, i: int) -> tuple[int, int]:
        """``(stream key, global item)`` of item ``i`` of ``lane``."""
        head = self.heads.get(lane)
        if head is not None and i == 0:
            d, t, _, whole = head
            return self.keys[d], t if whole else stream_global(self.streams[d].source, lane, t)
        d, t = self.locate(lane, i - self._head(lane))
        stream = self.streams[d].source
        return self.keys[d], stream_global(stream, lane, self._offset(d, lane) + t)

    def unread_sets(self, resume: Mapping[int, int]) -> UnreadState:
        """Per stream key, the items not read with each lane ``l`` at position ``resume[l]``.

        A lane still at position 0 has not read its head: the head is *pending*.
        """
        per_lane = {lane: self.counts(lane, n) for lane, n in resume.items()}
        pending = {
            self.global_index(lane, 0) for lane, n in resume.items() if n == 0 and self._head(lane)
        }
        sets: dict[int, Unread] = {}
        for d, stream in enumerate(self.streams):
            got = lane_suffixes({lane: c[d] for lane, c in per_lane.items()}, self.num_lanes)
            if isinstance(stream.source, UnreadStream):
                got = got.mapped(stream.source.unread)
            sets[self.keys[d]] = got
        return UnreadState(sets, pending)
