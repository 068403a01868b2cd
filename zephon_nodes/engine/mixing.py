"""Mixing WorkSource: several datasets, mixed so that *token* shares follow the weights.

The plan is a pure function of the recipe and of the decision log (dynamic mixtures, see
:mod:`zephon_nodes.engine.mixture_log`). Each dataset ``d`` gets an estimate ``c_d`` of tokens
per work item (from a seeded sample, see :func:`estimate_tokens_per_record`), so a token
share ``w_d`` means an item share ``p_d`` proportional to ``w_d / c_d``.

Every lane runs the same plan over its own item index ``i`` (lane-local). Item ``i`` is placed
by a chain of two-way splits: node ``j`` sends its items either to dataset ``j`` or on to node
``j + 1``. At each node the number of items sent to the left among the first ``n`` is
``floor(X / 2**32)`` where ``X`` accumulates ``n * a`` with ``a`` the node's ratio as a 32-bit
fraction: pure integer arithmetic, so every dataset's item count stays within one item of
its ideal at every node, and position ``i`` is found in O(number of datasets) without
looking at earlier items. Items are planned in blocks of ``block`` items: the weights (from
the schedule) are read at each block's estimated middle (progress is the lane's estimated
tokens times the lane count, an estimate of the global tokens), and the positions inside a
block are shuffled by a permutation seeded by the lane and the block, so that lanes do not
see the same sequence (each dataset's items keep their order inside the block). Before the
schedule's last point the integer accumulators at block starts are precomputed (a few
integers per block); after it they are closed-form.

The ``t``-th item of dataset ``d`` taken by lane ``l`` is the dataset's global item
``k = t * L + l`` (the dataset's items are dealt round-robin to the lanes, so lanes never
share an item), which is item ``perm_e[k mod n_d]`` of epoch ``e = k // n_d``, as in
:class:`~zephon_nodes.engine.work.DatasetWorkSource`. When a dataset with
``on_exhausted = "end"`` would start epoch ``work.epochs`` in a lane, that lane's stream ends
there (the multiplexer stops at the first global batch a lane cannot fill).

Decisions: decision ``j`` (weights ``W_j``) starts in lane ``l`` at lane item ``b_j(l)`` (a
flush-window start, chosen by the rank that made the decision). From there the lane follows
a static plan with weights ``W_j`` (its own accumulators, started at zero, its own block
shuffle), continuing each dataset's count ``t`` where the previous segment left it: no item
of any dataset is skipped or taken twice.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.seeding import permutation
from zephon_nodes.engine.estimate import estimate_tokens_per_record
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource, pass_epoch_offset
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.recipe.schedule import WeightSchedule
from zephon_nodes.state.stage import UnreadState, lane_suffixes

__all__ = ["MixingWorkSource", "estimate_tokens_per_record"]

_BLOCK_TAG = 0x4D495842  # "MIXB"
_DECISION_TAG = 0x44454349  # "DECI"
_MAX_PLANNED_BLOCKS = 2_000_000

# -- the integer plan: two-way splits whose counts stay within one item of ideal ------------
# A node's ratio is a 32-bit fraction; the items sent left among the first ``n`` are
# ``floor(X / 2**32)`` with ``X`` accumulating ``n * a``.

ONE = 1 << 32


def ratios(weights: Sequence[float], tokens_per_item: Sequence[float]) -> list[int]:
    """Per node, the 32-bit share of its items that go to its own dataset."""
    p = [w / c if w > 0 else 0.0 for w, c in zip(weights, tokens_per_item, strict=True)]
    out = []
    for j in range(len(p) - 1):
        rest = sum(p[j:])
        out.append(ONE if rest <= 0 else min(ONE, max(0, round(p[j] / rest * ONE))))
    return out


def counts(x: Sequence[int], n: int) -> list[int]:
    """Items per dataset among the first ``n`` items, given the accumulators ``x`` there."""
    per = []
    for xj in x:
        left = xj // ONE
        per.append(left)
        n -= left
    per.append(n)
    return per


def split(x: Sequence[int], a: Sequence[int], size: int) -> np.ndarray:
    """Dataset of each position of a block (canonical order) starting at accumulators ``x``."""
    D = len(a) + 1
    labels = np.full(size, D - 1, dtype=np.int64)
    where = np.arange(size, dtype=np.int64)
    local = np.arange(size, dtype=np.int64)
    for j in range(D - 1):
        carry, aj = x[j] % ONE, a[j]
        lb = (carry + local * aj) // ONE
        left = (carry + (local + 1) * aj) // ONE > lb
        labels[where[left]] = j
        where, local = where[~left], (local - lb)[~left]
    return labels


class StaticPlan:
    """A plan with static ratios (a decision, or a recipe without schedule), closed-form.

    Lane ``l`` starts every node's accumulator at ``l / L`` (as a 32-bit fraction): summed
    over the lanes, a dataset's count at equal lane positions is then exactly the count of
    one plan over all lanes' items (Hermite's identity), so lanes do not take a rare
    dataset's items all at once.
    """

    def __init__(self, a: list[int], weights: tuple[float, ...], block: int, carry: int):
        self.weights = weights
        self.block = block
        self.a = a
        self.carry = carry

    def state(self, seg: int) -> tuple[tuple[int, ...], list[int]]:
        """Return the accumulators at the start of block ``seg`` and the ratios."""
        n, x = seg * self.block, []
        for aj in self.a:
            xj = self.carry + aj * n
            x.append(xj)
            n -= xj // ONE
        return tuple(x), self.a

    def items_before(self, seg: int) -> list[int]:
        """Return the items of each dataset in the blocks before ``seg``."""
        return counts(self.state(seg)[0], seg * self.block)

    def uses(self, d: int) -> bool:
        """Whether the plan gives dataset ``d`` items."""
        return self.weights[d] > 0


class SchedulePhases(Protocol):
    """What a lane's plan reads of its scheduled mixture (a ``MixingWorkSource``)."""

    @property
    def datasets(self) -> Sequence[Any]: ...

    @property
    def block(self) -> int: ...

    def state(self, seg: int) -> tuple[tuple[int, ...], list[int]]: ...

    def uses(self, d: int) -> bool: ...


class ScheduledLanePlan:
    """A lane's view of the schedule plan (shared, precomputed for every lane).

    With two datasets the lane's phase goes into the single node's accumulator, as in
    :class:`StaticPlan` (consistent, since every item reaches that node). With more
    datasets the later nodes' accumulators depend on the earlier ones', so the lanes share
    the phase (their rounding errors line up; each lane still stays within one item of its
    ideal count per dataset).
    """

    def __init__(self, base: SchedulePhases, carry: int) -> None:
        self.base = base
        self.carry = carry if len(base.datasets) == 2 else 0

    def state(self, seg: int) -> tuple[tuple[int, ...], list[int]]:
        """Return the accumulators at the start of block ``seg`` (lane's phase) and ratios."""
        x, a = self.base.state(seg)
        if self.carry:
            x = (x[0] + self.carry, *x[1:])
        return x, a

    def items_before(self, seg: int) -> list[int]:
        """Return the items of each dataset in the blocks before ``seg``."""
        return counts(self.state(seg)[0], seg * self.block)

    @property
    def block(self) -> int:
        """Work items per block of the lane."""
        return self.base.block

    def uses(self, d: int) -> bool:
        """Whether the schedule gives dataset ``d`` items after its last point."""
        return self.base.uses(d)


class MixingWorkSource(WorkSource):
    """Work items of several datasets, mixed by token share (see the module docstring).

    Args:
        datasets: The datasets, in recipe order.
        seed: Recipe seed.
        num_lanes: Number of lanes.
        epochs: Passes a dataset with ``on_exhausted = "end"`` makes before the stream ends
            (None: endless).
        on_exhausted: ``"end"`` or ``"repeat"`` per dataset.
        schedule: Token-share weights over estimated tokens.
        tokens_per_item: Estimated tokens per work item, per dataset.
        block: Work items per plan block (a power of two), over all lanes: each lane plans
            in blocks of ``max(1, block // num_lanes)`` of its own items.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        seed: int,
        num_lanes: int,
        epochs: int | None,
        on_exhausted: Sequence[str],
        schedule: WeightSchedule,
        tokens_per_item: Sequence[float],
        block: int = 1024,
    ) -> None:
        super().__init__(num_lanes)
        self.datasets = list(datasets)
        self.seed = seed
        self.epochs = epochs
        self.block = max(1, block // num_lanes)
        self.schedule = schedule
        self.epochs = epochs
        self.on_exhausted = list(on_exhausted)
        self.tokens_per_item: list[float] = [float(c) for c in tokens_per_item]
        self.sources = [
            DatasetWorkSource(ds, seed, num_lanes, None, dataset_index=d)
            for d, ds in enumerate(self.datasets)
        ]
        used = [any(w[d] > 0 for _, w in schedule.points) for d in range(len(self.datasets))]
        self.check_weights(used)
        self._plan()
        self._decisions: list[tuple[tuple[float, ...], list[int]]] = []
        self._starts: dict[int, list[int]] = {}
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._blocks: OrderedDict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        # The rank's lanes restore on a thread each (engine.parallel_map.run_together) and
        # share this source: a block one lane looks up may be evicted by another meanwhile.
        self._blocks_lock = threading.Lock()
        self._bases: dict[int, list[list[int]]] = {}
        self._plans: dict[tuple[int, int], ScheduledLanePlan | StaticPlan] = {}
        self._ends: dict[int, int | None] = {}

    def check_weights(self, used: Sequence[bool | float]) -> None:
        """Refuse a dataset with a weight > 0 that has no record or no estimated token.

        Raises:
            RecipeError: Naming the dataset.
        """
        for ds, c, u in zip(self.datasets, self.tokens_per_item, used, strict=True):
            if u and ds.num_work_items == 0:
                raise RecipeError(f"dataset {ds.name!r} has weight > 0 but no record")
            if u and not c > 0:
                raise RecipeError(
                    f"dataset {ds.name!r} has weight > 0 but its estimate is {c} tokens per "
                    f"work item (are all its documents filtered out?)"
                )

    takes_decisions = True

    def fork(self) -> MixingWorkSource:
        """Return a copy sharing the recipe's plan, with no decision (one per rank node)."""
        other = object.__new__(MixingWorkSource)
        other.__dict__.update(self.__dict__)
        other._decisions, other._starts = [], {}
        other._reset_caches()
        return other

    # -- decisions --------------------------------------------------------------------------

    @property
    def decisions(self) -> list[tuple[float, ...]]:
        """The weights of the decisions in force (recipe order), oldest first."""
        return [w for w, _ in self._decisions]

    def set_decisions(
        self, weights: Sequence[Sequence[float]], starts: Mapping[int, Sequence[int]]
    ) -> None:
        """Install the decision log: weights per decision and, per lane, its start items.

        Args:
            weights: Normalized weights of each decision, in recipe order.
            starts: For each lane this process reads, the lane item where each decision
                starts (non-decreasing, one per decision).

        Raises:
            RecipeError: If a dataset with weight > 0 cannot be read, or starts are invalid.
        """
        plans = []
        for w in weights:
            w = tuple(float(v) for v in w)
            if len(w) != len(self.datasets):
                raise RecipeError(f"a decision needs {len(self.datasets)} weights, got {len(w)}")
            self.check_weights([v > 0 for v in w])
            plans.append((w, ratios(w, self.tokens_per_item)))
        for lane, s in starts.items():
            s = list(s)
            if len(s) != len(plans) or any(b < 0 for b in s) or s != sorted(s):
                raise RecipeError(
                    f"lane {lane}: decision starts {s} must be {len(plans)} non-decreasing "
                    f"item indices >= 0"
                )
        self._decisions = plans
        self._starts = {int(lane): [int(b) for b in s] for lane, s in starts.items()}
        self._reset_caches()
        # A later pass is a copy made by for_pass: drop it, so it is made with this log.
        self.__dict__.pop("_pass_cache", None)

    def _segment_starts(self, lane: int) -> list[int]:
        if not self._decisions:
            return [0]
        starts = self._starts.get(lane)
        if starts is None:
            raise RecipeError(
                f"lane {lane} has no start point for the {len(self._decisions)} mixture "
                f"decision(s) in force (decisions are applied per rank node)"
            )
        return [0, *starts]

    # -- the base plan (recipe schedule) ----------------------------------------------------

    def _plan(self) -> None:
        """Precompute the accumulators at block starts up to the schedule's last point."""
        D, S, L = len(self.datasets), self.block, self.num_lanes
        x = [0] * (D - 1)
        tokens = 0.0
        self._x: list[tuple[int, ...]] = []
        self._a: list[list[int]] = []
        tpi = self.tokens_per_item
        while True:
            if tokens >= self.schedule.last:
                a = ratios(self.schedule.weights_at(tokens), tpi)
            else:
                # Weights at the block's estimated middle (its size taken at its start).
                a = ratios(self.schedule.weights_at(tokens), tpi)
                middle = tokens + L * self._block_tokens(x, a) / 2
                a = ratios(self.schedule.weights_at(middle), tpi)
            self._x.append(tuple(x))
            self._a.append(a)
            if tokens >= self.schedule.last:
                break
            if len(self._x) > _MAX_PLANNED_BLOCKS:
                raise RecipeError(
                    f"the mixture schedule spans more than {_MAX_PLANNED_BLOCKS} plan blocks "
                    f"of {S} work items per lane; raise mixture.block"
                )
            tokens += L * self._block_tokens(x, a)
            n = S
            for j in range(D - 1):
                before = x[j] // ONE
                x[j] += n * a[j]
                n -= x[j] // ONE - before
        self._tail = len(self._x) - 1
        self._tail_n = self._reach(self._tail, self._x[self._tail])

    def _block_tokens(self, x: Sequence[int], a: Sequence[int]) -> float:
        """Estimated tokens of a block starting at accumulators ``x`` with ratios ``a``."""
        n, tokens = self.block, 0.0
        for j, (xj, aj) in enumerate(zip(x, a, strict=True)):
            left = (xj + n * aj) // ONE - xj // ONE
            tokens += left * self.tokens_per_item[j]
            n -= left
        return tokens + n * self.tokens_per_item[-1]

    def _reach(self, seg: int, x: Sequence[int]) -> list[int]:
        """Items reaching each node before block ``seg``."""
        n, reach = seg * self.block, []
        for xj in x:
            reach.append(n)
            n -= xj // ONE
        return reach

    def state(self, seg: int) -> tuple[tuple[int, ...], list[int]]:
        """Return the base plan's accumulators at the start of block ``seg`` and its ratios."""
        if seg <= self._tail:
            return self._x[seg], self._a[seg]
        a = self._a[self._tail]
        x0 = self._x[self._tail]
        n = seg * self.block
        x = []
        for j in range(len(a)):
            xj = x0[j] + a[j] * (n - self._tail_n[j])
            x.append(xj)
            n -= xj // ONE
        return tuple(x), a

    def items_before(self, seg: int) -> list[int]:
        """Return how many items of each dataset a lane takes in base-plan blocks before ``seg``."""
        return counts(self.state(seg)[0], seg * self.block)

    def uses(self, d: int) -> bool:
        """Whether the base plan gives dataset ``d`` items after the schedule's last point."""
        return self.schedule.points[-1][1][d] > 0

    # -- segments and blocks ----------------------------------------------------------------

    def _plan_of(self, lane: int, j: int) -> ScheduledLanePlan | StaticPlan:
        got = self._plans.get((lane, j))
        if got is not None:
            return got
        carry = (lane * ONE) // self.num_lanes
        if j == 0 and self.schedule.last > 0:
            plan: ScheduledLanePlan | StaticPlan = ScheduledLanePlan(self, carry)
        else:
            if j == 0:
                w = self.schedule.points[0][1]
                a = self._a[0]
            else:
                w, a = self._decisions[j - 1]
            plan = StaticPlan(a, w, self.block, carry)
        self._plans[lane, j] = plan
        return plan

    def _block(self, lane: int, j: int, seg: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (dataset, count within segment) of every position of a block (cached)."""
        key = (lane, j, seg)
        with self._blocks_lock:
            got = self._blocks.get(key)
            if got is not None:
                self._blocks.move_to_end(key)
                return got
        S, D = self.block, len(self.datasets)
        plan = self._plan_of(lane, j)
        x, a = plan.state(seg)
        labels = split(x, a, S)
        # Shuffle the labels over the block's positions; each dataset's items keep their
        # order, so item t of a dataset always comes before item t + 1.
        if j == 0:
            perm = permutation(S, self.seed, seg, lane, _BLOCK_TAG)
        else:
            perm = permutation(S, self.seed, seg, lane, j, _DECISION_TAG)
        labels = labels[perm]
        before = plan.items_before(seg)
        ks = np.empty(S, dtype=np.int64)
        for d in range(D):
            mask = labels == d
            ks[mask] = before[d] + np.arange(int(mask.sum()), dtype=np.int64)
        got = (labels, ks)
        with self._blocks_lock:
            self._blocks[key] = got
            while len(self._blocks) > 2 * self.num_lanes + 16:
                self._blocks.popitem(last=False)
        return got

    def _plan_counts(self, lane: int, j: int, n: int) -> list[int]:
        """Items per dataset among the first ``n`` positions of plan ``j`` (lane's shuffle)."""
        plan = self._plan_of(lane, j)
        seg, r = divmod(n, self.block)
        out = plan.items_before(seg)
        if r:
            labels = self._block(lane, j, seg)[0][:r]
            for d, c in enumerate(np.bincount(labels, minlength=len(out)).tolist()):
                out[d] += c
        return out

    def _segment_counts(self, lane: int, j: int, u: int) -> list[int]:
        """Items per dataset among the first ``u`` items of segment ``j`` of ``lane``."""
        return self._plan_counts(lane, j, u)

    def _segment_bases(self, lane: int) -> list[list[int]]:
        """Per segment of ``lane``: items per dataset the lane took before it starts."""
        got = self._bases.get(lane)
        if got is None:
            starts = self._segment_starts(lane)
            got = [[0] * len(self.datasets)]
            for j in range(1, len(starts)):
                c = self._segment_counts(lane, j - 1, starts[j] - starts[j - 1])
                got.append([b + x for b, x in zip(got[-1], c, strict=True)])
            self._bases[lane] = got
        return got

    def counts(self, lane: int, i: int) -> list[int]:
        """Items of each dataset among the first ``i`` items of ``lane``."""
        starts = self._segment_starts(lane)
        j = _find_segment(starts, i)
        base = self._segment_bases(lane)[j]
        c = self._segment_counts(lane, j, i - starts[j])
        return [b + x for b, x in zip(base, c, strict=True)]

    def locate(self, i: int, lane: int = 0) -> tuple[int, int]:
        """Return ``(dataset, t)``: item ``i`` of ``lane`` is the lane's ``t``-th of ``dataset``."""
        starts = self._segment_starts(lane)
        j = _find_segment(starts, i)
        seg, r = divmod(i - starts[j], self.block)
        labels, ks = self._block(lane, j, seg)
        d = int(labels[r])
        return d, int(ks[r]) + self._segment_bases(lane)[j][d]

    def global_index(self, lane: int, i: int) -> tuple[int, int]:
        """``(dataset, global item)``: a lane's ``t``-th item of a dataset is its ``t * L + l``."""
        d, t = self.locate(i, lane)
        return d, t * self.num_lanes + lane

    def unread_sets(self, resume: Mapping[int, int]) -> UnreadState:
        """Per dataset, its items past each lane's count (see :meth:`WorkSource.unread_sets`)."""
        per_lane = {lane: self.counts(lane, n) for lane, n in resume.items()}
        return UnreadState(
            {
                d: lane_suffixes({lane: c[d] for lane, c in per_lane.items()}, self.num_lanes)
                for d in range(len(self.datasets))
            },
            set(),
        )

    # -- end of the stream ------------------------------------------------------------------

    def _first_reaching(self, lane: int, d: int, target: int) -> int | None:
        """Smallest ``n`` with ``counts(lane, n)[d] >= target``, or None if never."""
        starts = self._segment_starts(lane)
        bases = self._segment_bases(lane)
        for j in range(len(starts)):
            if bases[j][d] >= target:
                return starts[j]
            last = j == len(starts) - 1
            if not last and bases[j + 1][d] < target:
                continue
            plan = self._plan_of(lane, j)
            need = target - bases[j][d]
            if not last:
                hi_seg = -(-(starts[j + 1] - starts[j]) // self.block)
            elif plan.uses(d):
                hi_seg = 1
                while plan.items_before(hi_seg)[d] < need:
                    hi_seg *= 2
                    if hi_seg > 1 << 62:
                        return None
            elif j == 0 and plan.items_before(self._tail + 1)[d] >= need:
                hi_seg = self._tail + 1  # the schedule takes d before its tail, never after
            else:
                return None
            # Blocks: items_before(lo)[d] < need <= items_before(hi)[d].
            lo = 0
            while hi_seg - lo > 1:
                mid = (lo + hi_seg) // 2
                if plan.items_before(mid)[d] < need:
                    lo = mid
                else:
                    hi_seg = mid
            labels, ks = self._block(lane, j, lo)
            hits = np.nonzero((labels == d) & (ks == need - 1))[0]
            if len(hits):
                n = starts[j] + lo * self.block + int(hits[0]) + 1
                if last or n <= starts[j + 1]:
                    return n
        return None

    def first_reaching(self, lane: int, d: int, target: int) -> int | None:
        """Smallest ``n`` with ``counts(lane, n)[d] >= target``, or None if never."""
        return self._first_reaching(lane, d, target)

    def lane_end(self, lane: int) -> int | None:
        """Return the first item index past the end of ``lane``'s stream (None: endless)."""
        if lane in self._ends:
            return self._ends[lane]
        end: int | None = None
        if self.epochs is not None:
            L = self.num_lanes
            for d, mode in enumerate(self.on_exhausted):
                if mode != "end":
                    continue
                limit = self.epochs * self.datasets[d].num_work_items
                allowed = max(0, -(-(limit - lane) // L))  # t with t * L + lane < limit
                n = self._first_reaching(lane, d, allowed + 1)
                if n is not None and (end is None or n - 1 < end):
                    end = n - 1
        self._ends[lane] = end
        return end

    def lane_length(self, lane: int) -> int | None:
        """Work items of ``lane`` (None: endless): :meth:`lane_end`."""
        return self.lane_end(lane)

    # -- the WorkSource ---------------------------------------------------------------------

    def make_pass(self, p: int) -> MixingWorkSource:
        """Pass ``p``: the same plan, every dataset read from data epoch ``p * epochs`` on."""
        other = copy.copy(self)
        other.__dict__.pop("_pass_cache", None)
        offset = pass_epoch_offset(self.epochs, p)
        other.sources = [s.with_epoch_offset(offset) for s in self.sources]
        return other

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return work item ``i`` of ``lane``, or None past the end of the lane's stream."""
        end = self.lane_end(lane)
        if end is not None and i >= end:
            return None
        d, t = self.locate(i, lane)
        src = self.sources[d]
        ds = src.dataset
        epoch, pos = divmod(t * self.num_lanes + lane, ds.num_work_items)
        item = int(src.permutation(epoch)[pos])
        shard, start, stop = ds.locate(item)
        return WorkItem(
            dataset=d,
            dataset_name=ds.name,
            text_field=ds.text_field,
            item=item,
            epoch=epoch + src.epoch_offset,
            shard=ds.shards[shard],
            start=start,
            stop=stop,
            lane=lane,
            position=i,
            shard_index=shard,
        )


def _find_segment(starts: Sequence[int], i: int) -> int:
    """Index of the last segment starting at or before item ``i``."""
    j = len(starts) - 1
    while starts[j] > i:
        j -= 1
    return j
