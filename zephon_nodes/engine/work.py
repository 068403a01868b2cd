"""Work items and the WorkSource: a pure function from (lane, index) to a work item."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from zephon_nodes.engine.seeding import permutation
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.formats.shards import Shard

__all__ = ["DatasetWorkSource", "WorkItem", "WorkSource", "lane_length", "probe_lane_length"]

_PERMUTATION_TAG = 0x5045524D  # "PERM"
# Data epochs between two passes of an endless stream: pass p reads epochs from p * 2**32.
ENDLESS_PASS_STRIDE = 1 << 32
# A lane found to hold more items than this by probing is treated as endless.
_PROBE_LIMIT = 1 << 40


def pass_epoch_offset(epochs: int | None, p: int) -> int:
    """First data epoch of pass ``p``: ``p * epochs``, or ``p * 2**32`` for an endless stream."""
    return p * (epochs if epochs is not None else ENDLESS_PASS_STRIDE)


def probe_lane_length(source: WorkSource, lane: int, limit: int | None = None) -> int | None:
    """Number of work items of ``lane``, found from ``work()`` alone (probe, then bisect).

    ``work(lane, i)`` is None from the lane's end on. O(log n) calls. Returns None if the
    lane holds more than ``limit`` items (treated as endless).
    """
    if source.work(lane, 0) is None:
        return 0
    hi = 1
    while source.work(lane, hi) is not None:
        hi *= 2
        if limit is not None and hi > limit:
            return None
    lo = hi // 2  # work(lo) exists, work(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if source.work(lane, mid) is None:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A group of consecutive records of one shard: the unit operators run on.

    Attributes:
        dataset: Index of the dataset in the recipe.
        dataset_name: Name of the dataset.
        text_field: JSON field holding the text.
        item: Index of the work item within its dataset.
        epoch: Epoch of the dataset this item belongs to.
        shard: The shard to read.
        start: First record (inclusive).
        stop: End record (exclusive).
        lane: Lane the item was dealt to.
        position: Index of the item in its lane's stream.
    """

    dataset: int
    dataset_name: str
    text_field: str
    item: int
    epoch: int
    shard: Shard
    start: int
    stop: int
    lane: int
    position: int

    def describe(self) -> str:
        """Say where the item's records are, for error messages."""
        return (
            f"dataset {self.dataset_name!r}, {self.shard.path} records [{self.start}, "
            f"{self.stop}) (lane {self.lane}, work item {self.position})"
        )


class WorkSource(ABC):
    """Decides which work item each lane processes at each position.

    Implementations must be pure functions of the recipe: ``work(lane, i)`` returns the same
    item whatever the number of ranks, workers or restarts, and costs O(1) or O(log n), so a
    lane can jump to any position on restore.

    Args:
        num_lanes: Number of lanes items are dealt to.
    """

    def __init__(self, num_lanes: int) -> None:
        self.num_lanes = num_lanes

    @abstractmethod
    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return work item ``i`` of ``lane``, or None when the lane's stream has ended."""

    def for_pass(self, p: int) -> WorkSource | None:
        """Return the work source of pass ``p`` (a new ``iter()`` over the rank node).

        Pass 0 is this source. Pass ``p`` reads the recipe's data again from data epoch
        ``p * epochs`` on (``p * 2**32`` if endless), so each pass has its own seeded order
        and never repeats an earlier one. Cached. A work source that does not override
        :meth:`make_pass` has a single pass: None (the stream ends) for ``p > 0``.
        """
        if p == 0:
            return self
        cache: dict[int, WorkSource | None] = self.__dict__.setdefault("_pass_cache", {})
        if p not in cache:
            cache.clear()  # one pass at a time is in use
            cache[p] = self.make_pass(p)
        return cache[p]

    def make_pass(self, p: int) -> WorkSource | None:
        """Build the work source of pass ``p > 0`` (None: this source has a single pass)."""
        return None


class DatasetWorkSource(WorkSource):
    """Work items of one dataset: a seeded permutation per epoch, dealt round-robin to lanes.

    (A finite stream is re-dealt by tokens by default, ``work.deal = "auto"``: see
    :class:`~zephon_nodes.engine.balance.BalancedWorkSource`.)

    Global item ``g`` is item ``perm_e[g mod N]`` of epoch ``e = g // N``; lane ``l`` takes
    global items ``l, l + L, l + 2L, ...``. None of this depends on the number of ranks.

    Args:
        dataset: The dataset.
        seed: Recipe seed.
        num_lanes: Number of lanes.
        epochs: Number of epochs, or None for an endless stream.
        dataset_index: Index of the dataset in the recipe (mixed into the seed).
    """

    def __init__(
        self,
        dataset: Dataset,
        seed: int,
        num_lanes: int,
        epochs: int | None,
        dataset_index: int = 0,
    ) -> None:
        super().__init__(num_lanes)
        self.dataset = dataset
        self.seed = seed
        self.epochs = epochs
        self.dataset_index = dataset_index
        self.epoch_offset = 0
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def with_epoch_offset(self, offset: int) -> DatasetWorkSource:
        """Return a copy whose data epoch ``e`` is this source's epoch ``e + offset``."""
        other = copy.copy(self)
        other.__dict__.pop("_pass_cache", None)
        other.epoch_offset = self.epoch_offset + offset
        other._perms = OrderedDict()
        return other

    def make_pass(self, p: int) -> DatasetWorkSource:
        """Pass ``p``: the same stream over data epochs ``p * epochs ...``."""
        return self.with_epoch_offset(pass_epoch_offset(self.epochs, p))

    @property
    def total_items(self) -> int | None:
        """Items over all epochs, or None if endless."""
        if self.epochs is None:
            return None
        return self.epochs * self.dataset.num_work_items

    def permutation(self, epoch: int) -> np.ndarray:
        """Return the seeded order of the dataset's work items in ``epoch`` (+ the offset)."""
        perm = self._perms.get(epoch)
        if perm is None:
            perm = permutation(
                self.dataset.num_work_items,
                self.seed,
                self.dataset_index,
                epoch + self.epoch_offset,
                _PERMUTATION_TAG,
            )
            self._perms[epoch] = perm
            while len(self._perms) > 4:
                self._perms.popitem(last=False)
        return perm

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return work item ``i`` of ``lane``, or None past the last epoch."""
        n = self.dataset.num_work_items
        if n == 0:
            return None
        g = i * self.num_lanes + lane
        total = self.total_items
        if total is not None and g >= total:
            return None
        epoch, pos = divmod(g, n)
        item = int(self.permutation(epoch)[pos])
        shard, start, stop = self.dataset.locate(item)
        return WorkItem(
            dataset=self.dataset_index,
            dataset_name=self.dataset.name,
            text_field=self.dataset.text_field,
            item=item,
            epoch=epoch + self.epoch_offset,
            shard=self.dataset.shards[shard],
            start=start,
            stop=stop,
            lane=lane,
            position=i,
        )


def lane_length(source: WorkSource, lane: int) -> int | None:
    """Number of work items of ``lane`` in ``source`` (None: endless)."""
    own = getattr(source, "lane_length", None)
    if callable(own):
        got: int | None = own(lane)
        return got
    if type(source) is DatasetWorkSource:
        total = source.total_items
        if total is None:
            return None
        return max(0, -(-(total - lane) // source.num_lanes))
    end = getattr(source, "lane_end", None)  # MixingWorkSource: None when endless
    if callable(end):
        e: int | None = end(lane)
        return e
    # Any other source: work() is None from the lane's end on.
    return probe_lane_length(source, lane, _PROBE_LIMIT)
