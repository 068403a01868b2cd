"""Work items and the WorkSource: a pure function from (lane, index) to a work item."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.seeding import permutation
from zephon_nodes.core.work_item import WorkItem
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.state.stage import UnreadState, lane_suffixes

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

    # -- lane geometry: the defaults are right for a source of plain K-item windows --------

    def lane_length(self, lane: int) -> int | None:
        """Number of work items of ``lane`` (None: endless).

        The default finds it from :meth:`work` alone (probe, then bisect: O(log n) calls); a
        source that knows it in O(1) overrides this.
        """
        return probe_lane_length(self, lane, _PROBE_LIMIT)

    def window_bounds(self, lane: int, window: int, flush_every: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of flush window ``window`` of ``lane`` (before its end).

        Default: windows of ``flush_every`` items, cut at the lane's end.
        """
        start, stop = window * flush_every, (window + 1) * flush_every
        n = self.lane_length(lane)
        if n is not None:
            start, stop = min(start, n), min(stop, n)
        return start, stop

    def window_start(self, lane: int, window: int, flush_every: int) -> int:
        """Position of the first work item of ``window`` of ``lane`` (default ``window * K``)."""
        return window * flush_every

    def has_window(self, lane: int, window: int, flush_every: int) -> bool:
        """Whether flush window ``window`` of ``lane`` exists (default: it holds an item)."""
        return self.work(lane, window * flush_every) is not None

    def lane_item_sizes(self, lane: int) -> np.ndarray | None:
        """Size of each of ``lane``'s items if the stream was dealt by size (default None)."""
        return None

    def leftovers(self, lane: int) -> int:
        """Leftover windows ``lane`` replays first (a re-laned pass; default 0)."""
        return 0

    def leftover_drop(self, lane: int, window: int) -> int:
        """Samples a lane drops at the start of ``window`` (a re-laned leftover; default 0)."""
        return 0

    def shuffle_parts(self, seed: int, lane: int, window: int) -> tuple[int, int, int]:
        """The ``(seed, lane, window)`` seeding the shuffle buffer of ``window`` of ``lane``."""
        return seed, lane, window

    # -- dynamic-mixture decisions and rank copies ------------------------------------------

    #: Whether :meth:`set_decisions` installs a decision log (a mixture of datasets).
    takes_decisions = False
    #: The recipe pass this source's pass 0 is (a re-laned source: the pass it re-laned).
    base_pass = 0

    def set_decisions(
        self, weights: Sequence[Sequence[float]], starts: Mapping[int, Sequence[int]]
    ) -> None:
        """Install a dynamic-mixture decision log (weights per decision, starts per lane).

        Default: nothing to install (a stream without a mixture plan follows none).
        """
        return None

    def refuse_decisions(self) -> None:
        """Raise if this stream cannot take a new mixture decision (default: it can)."""
        return None

    def fork(self) -> WorkSource:
        """Return the copy one rank node reads (its decisions are its own; default ``self``)."""
        return self

    # -- where items are in their datasets' streams (a recipe change continues them) ---------

    #: Whether this is a re-laned pass (its lanes read the old lanes' leftovers first).
    relaned = False
    #: Estimated tokens per work item of each dataset, where a mixing plan was made with them.
    tokens_per_item: Sequence[float] | None = None

    def global_index(self, lane: int, i: int) -> tuple[int, int]:
        """``(stream key, global item)`` of item ``i`` of ``lane``: where a change continues.

        Raises:
            RecipeError: If this source's items are not per-dataset streams (default).
        """
        raise RecipeError(REFUSE_CHANGE.format(kind=type(self).__name__))

    def unread_sets(self, resume: Mapping[int, int]) -> UnreadState:
        """Per stream key, the global items not read with each lane ``l`` at ``resume[l]``.

        ``resume`` holds every lane of the source.

        Raises:
            RecipeError: If this source's items are not per-dataset streams (default).
        """
        raise RecipeError(REFUSE_CHANGE.format(kind=type(self).__name__))


REFUSE_CHANGE = (
    "a recipe change needs lanes that read each dataset's own stream (dealt round-robin); "
    "this run's streams are {kind} (dealt by size or wrapped at the end of data), which a "
    "change cannot continue"
)


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

    def lane_length(self, lane: int) -> int | None:
        """Number of work items of ``lane`` (None: endless), in O(1)."""
        total = self.total_items
        if total is None:
            return None
        return max(0, -(-(total - lane) // self.num_lanes))

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
            shard_index=shard,
        )

    def global_index(self, lane: int, i: int) -> tuple[int, int]:
        """``(stream key, global item)``: lane ``l`` of ``L`` reads ``g = i * L + l``."""
        return self.dataset_index, i * self.num_lanes + lane

    def unread_sets(self, resume: Mapping[int, int]) -> UnreadState:
        """The stream's items past each lane's position (see :meth:`WorkSource.unread_sets`)."""
        return UnreadState({self.dataset_index: lane_suffixes(dict(resume), self.num_lanes)}, set())


def lane_length(source: WorkSource, lane: int) -> int | None:
    """Number of work items of ``lane`` in ``source`` (None: endless)."""
    return source.lane_length(lane)
