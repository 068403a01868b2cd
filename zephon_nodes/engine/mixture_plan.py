"""The integer plan of a mixture: two-way splits whose counts stay within one item of ideal.

See :mod:`zephon_nodes.engine.mixing`. A node's ratio is a 32-bit fraction; the items sent
left among the first ``n`` are ``floor(X / 2**32)`` with ``X`` accumulating ``n * a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["ONE", "ScheduledLanePlan", "StaticPlan", "counts", "ratios", "split"]

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
