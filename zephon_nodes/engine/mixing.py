"""Mixing WorkSource: several datasets, mixed so that *token* shares follow the weights.

The plan is a pure function of the recipe. Each dataset ``d`` gets an estimate ``c_d`` of
tokens per work item (from a seeded sample, see :func:`estimate_tokens_per_record`), so a
token share ``w_d`` means an item share ``p_d`` proportional to ``w_d / c_d``.

Global work item ``g`` (dealt to lane ``g % L``, as for one dataset) is placed by a chain of
two-way splits: node ``j`` sends its items either to dataset ``j`` or on to node ``j + 1``.
At each node the number of items sent to the left among the first ``n`` is
``floor(X / 2**32)`` where ``X`` accumulates ``n * a`` with ``a`` the node's ratio as a 32-bit
fraction: pure integer arithmetic, so every dataset's item count stays within one item of
its ideal at every node, and position ``g`` is found in O(number of datasets) without
looking at earlier items. Items are planned in blocks of ``block`` items: the weights (from
the schedule) are read at each block's estimated middle, and the positions inside a block
are shuffled by a seeded permutation so that no lane sees a periodic pattern (each
dataset's items keep their order inside the block). Before the schedule's last point the
integer accumulators at block starts are precomputed (a few integers per block); after it
they are closed-form.

The ``k``-th item of dataset ``d`` is item ``perm_e[k mod n_d]`` of epoch ``e = k // n_d``,
as in :class:`~zephon_nodes.engine.work.DatasetWorkSource`. When a dataset with
``on_exhausted = "end"`` would start epoch ``work.epochs``, the whole stream ends there.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon_nodes.engine.seeding import permutation
from zephon_nodes.engine.work import DatasetWorkSource, WorkItem, WorkSource, pass_epoch_offset
from zephon_nodes.errors import RecipeError
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.recipe.schedule import WeightSchedule

__all__ = ["MixingWorkSource", "estimate_tokens_per_record"]

_ONE = 1 << 32
_BLOCK_TAG = 0x4D495842  # "MIXB"
_ESTIMATE_TAG = 0x45535449  # "ESTI"
_MAX_PLANNED_BLOCKS = 2_000_000


def _round6(x: float) -> float:
    return float(f"{x:.6g}")


def estimate_tokens_per_record(
    datasets: Sequence[Dataset],
    chain: Callable[[WorkItem], Any],
    seed: int,
    records: int,
) -> list[float]:
    """Estimate non-padding tokens per record of each dataset from a seeded sample.

    Work items are drawn in a seeded order until ``records`` records are read; each is run
    through ``chain`` (parse, filters, maps, tokenize: the lane's stateless operators), and
    the ``n - 1`` (input, label) pairs of every document are counted. Records skipped or
    filtered count as records with no token. Values are rounded to 6 significant digits.

    Returns:
        Tokens per record, per dataset (recipe order).
    """
    out = []
    for d, ds in enumerate(datasets):
        order = permutation(ds.num_work_items, seed, d, _ESTIMATE_TAG)
        tokens = read = 0
        for item in order.tolist():
            shard, start, stop = ds.locate(item)
            work = WorkItem(d, ds.name, ds.text_field, item, 0, ds.shards[shard], start, stop, 0, 0)
            batch = chain(work)
            tokens += int(np.maximum(batch.lengths - 1, 0).sum())
            read += stop - start
            if read >= records:
                break
        out.append(_round6(tokens / read) if read else 0.0)
    return out


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
        block: Work items per plan block (a power of two).
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
        self.block = block
        self.schedule = schedule
        self.tokens_per_item = [float(c) for c in tokens_per_item]
        self.sources = [
            DatasetWorkSource(ds, seed, num_lanes, None, dataset_index=d)
            for d, ds in enumerate(self.datasets)
        ]
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        for d, (ds, c) in enumerate(zip(self.datasets, self.tokens_per_item, strict=True)):
            used = any(w[d] > 0 for _, w in schedule.points)
            if used and ds.num_work_items == 0:
                raise RecipeError(f"dataset {ds.name!r} has weight > 0 but no record")
            if used and not c > 0:
                raise RecipeError(
                    f"dataset {ds.name!r} has weight > 0 but its estimate is {c} tokens per "
                    f"work item (are all its documents filtered out?)"
                )
        self._plan()
        self.end = self._find_end(epochs, on_exhausted)

    # -- the plan -------------------------------------------------------------------------

    def _ratios(self, weights: Sequence[float]) -> list[int]:
        """Per node, the 32-bit share of its items that go to its own dataset."""
        p = [w / c if w > 0 else 0.0 for w, c in zip(weights, self.tokens_per_item, strict=True)]
        out = []
        for j in range(len(p) - 1):
            rest = sum(p[j:])
            out.append(_ONE if rest <= 0 else min(_ONE, max(0, round(p[j] / rest * _ONE))))
        return out

    def _plan(self) -> None:
        """Precompute the accumulators at block starts up to the schedule's last point."""
        D, S = len(self.datasets), self.block
        x = [0] * (D - 1)
        tokens = 0.0
        self._x: list[tuple[int, ...]] = []
        self._a: list[list[int]] = []
        while True:
            if tokens >= self.schedule.last:
                a = self._ratios(self.schedule.weights_at(tokens))
            else:
                # Weights at the block's estimated middle (its size taken at its start).
                a = self._ratios(self.schedule.weights_at(tokens))
                middle = tokens + self._block_tokens(x, a) / 2
                a = self._ratios(self.schedule.weights_at(middle))
            self._x.append(tuple(x))
            self._a.append(a)
            if tokens >= self.schedule.last:
                break
            if len(self._x) > _MAX_PLANNED_BLOCKS:
                raise RecipeError(
                    f"the mixture schedule spans more than {_MAX_PLANNED_BLOCKS} plan blocks "
                    f"of {S} work items; raise mixture.block"
                )
            n = S
            for j in range(D - 1):
                before = x[j] // _ONE
                x[j] += n * a[j]
                left = x[j] // _ONE - before
                tokens += left * self.tokens_per_item[j]
                n -= left
            tokens += n * self.tokens_per_item[D - 1]
        self._tail = len(self._x) - 1
        self._tail_n = self._counts_from(self._tail, self._x[self._tail])[1]

    def _block_tokens(self, x: Sequence[int], a: Sequence[int]) -> float:
        """Estimated tokens of a block starting at accumulators ``x`` with ratios ``a``."""
        n, tokens = self.block, 0.0
        for j, (xj, aj) in enumerate(zip(x, a, strict=True)):
            left = (xj + n * aj) // _ONE - xj // _ONE
            tokens += left * self.tokens_per_item[j]
            n -= left
        return tokens + n * self.tokens_per_item[-1]

    def _counts_from(self, seg: int, x: Sequence[int]) -> tuple[list[int], list[int]]:
        """Return (items per dataset, items reaching each node) before block ``seg``."""
        D = len(self.datasets)
        n = seg * self.block
        reach, per = [], []
        for j in range(D - 1):
            reach.append(n)
            left = x[j] // _ONE
            per.append(left)
            n -= left
        per.append(n)
        reach.append(n)
        return per, reach

    def _state(self, seg: int) -> tuple[tuple[int, ...], list[int]]:
        """Return the accumulators at the start of block ``seg`` and the ratios used in it."""
        if seg <= self._tail:
            return self._x[seg], self._a[seg]
        a = self._a[self._tail]
        x0 = self._x[self._tail]
        n = seg * self.block
        x = []
        for j in range(len(a)):
            xj = x0[j] + a[j] * (n - self._tail_n[j])
            x.append(xj)
            n -= xj // _ONE
        return tuple(x), a

    def items_before(self, seg: int) -> list[int]:
        """Return how many items of each dataset the blocks before ``seg`` hold."""
        return self._counts_from(seg, self._state(seg)[0])[0]

    def _block(self, seg: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (dataset, k) of every position of block ``seg`` (cached)."""
        got = self._blocks.get(seg)
        if got is not None:
            return got
        S, D = self.block, len(self.datasets)
        x, a = self._state(seg)
        # The split tree over the block's canonical order 0..S-1.
        labels = np.full(S, D - 1, dtype=np.int64)
        where = np.arange(S, dtype=np.int64)
        local = np.arange(S, dtype=np.int64)
        for j in range(D - 1):
            carry, aj = x[j] % _ONE, a[j]
            lb = (carry + local * aj) // _ONE
            left = (carry + (local + 1) * aj) // _ONE > lb
            labels[where[left]] = j
            where, local = where[~left], (local - lb)[~left]
        # Shuffle the labels over the block's positions; each dataset's items keep their
        # order, so item k of a dataset always comes before item k + 1.
        labels = labels[permutation(S, self.seed, seg, _BLOCK_TAG)]
        before = self.items_before(seg)
        ks = np.empty(S, dtype=np.int64)
        for d in range(D):
            mask = labels == d
            ks[mask] = before[d] + np.arange(int(mask.sum()), dtype=np.int64)
        got = (labels, ks)
        self._blocks[seg] = got
        while len(self._blocks) > 16:
            self._blocks.popitem(last=False)
        return got

    def locate(self, g: int) -> tuple[int, int]:
        """Return ``(dataset, k)``: global item ``g`` is the ``k``-th item of ``dataset``."""
        seg, r = divmod(g, self.block)
        labels, ks = self._block(seg)
        return int(labels[r]), int(ks[r])

    def _find_end(self, epochs: int | None, on_exhausted: Sequence[str]) -> int | None:
        """Return the first global item past the end of the stream (None: endless)."""
        if epochs is None:
            return None
        end: int | None = None
        for d, mode in enumerate(on_exhausted):
            if mode != "end":
                continue
            limit = epochs * self.datasets[d].num_work_items
            hi = 1
            while self.items_before(hi)[d] <= limit:
                hi *= 2
                if hi > 1 << 62:
                    break
            else:
                lo = 0  # items_before(lo) <= limit < items_before(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if self.items_before(mid)[d] <= limit:
                        lo = mid
                    else:
                        hi = mid
                for g in range(lo * self.block, (lo + 1) * self.block):
                    dd, k = self.locate(g)
                    if dd == d and k >= limit and (end is None or g < end):
                        end = g
        return end

    # -- the WorkSource ---------------------------------------------------------------------

    def make_pass(self, p: int) -> MixingWorkSource:
        """Pass ``p``: the same plan, every dataset read from data epoch ``p * epochs`` on."""
        other = copy.copy(self)
        other.__dict__.pop("_pass_cache", None)
        offset = pass_epoch_offset(self.epochs, p)
        other.sources = [s.with_epoch_offset(offset) for s in self.sources]
        return other

    def work(self, lane: int, i: int) -> WorkItem | None:
        """Return work item ``i`` of ``lane``, or None past the end of the stream."""
        g = i * self.num_lanes + lane
        if self.end is not None and g >= self.end:
            return None
        d, k = self.locate(g)
        src = self.sources[d]
        ds = src.dataset
        epoch, pos = divmod(k, ds.num_work_items)
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
        )
