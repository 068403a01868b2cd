"""Mixture weights over training progress: static, or piecewise-linear (curriculum).

Progress is measured in *estimated tokens* (the mixing plan's own token estimate, see
:mod:`zephon_nodes.engine.mixing`), so the weights at any point are a pure function of the recipe.
A schedule in steps is converted at ``global_batch_size * seq_len`` tokens per step; with
padding, real steps run slightly ahead of that estimate.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from zephon_nodes.recipe.recipe import Recipe

__all__ = ["WeightSchedule"]


def _normalize(weights: tuple[float, ...]) -> tuple[float, ...]:
    total = float(sum(weights))
    return tuple(float(w) / total for w in weights)


@dataclass(frozen=True)
class WeightSchedule:
    """Token-share weights per dataset (recipe order) as a function of estimated tokens.

    Attributes:
        points: ``((tokens, weights), ...)``: strictly increasing token positions from 0 and
            the weights there (normalized to sum to 1).
    """

    points: tuple[tuple[float, tuple[float, ...]], ...]

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> WeightSchedule:
        """Return the recipe's schedule, or its static per-dataset weights as one point."""
        names = [d.name for d in recipe.datasets]
        schedule = recipe.mixture.schedule
        if schedule is None:
            return cls(((0.0, _normalize(tuple(d.weight for d in recipe.datasets))),))
        scale = 1.0
        if recipe.mixture.unit == "steps":
            scale = float(recipe.global_batch_size * recipe.seq_len)
        return cls(
            tuple(
                (float(at) * scale, _normalize(tuple(float(w[n]) for n in names)))
                for at, w in schedule
            )
        )

    @property
    def last(self) -> float:
        """Token position after which the weights stay constant."""
        return self.points[-1][0]

    def weights_at(self, tokens: float) -> tuple[float, ...]:
        """Return the weights at ``tokens`` estimated tokens (linear between points)."""
        pts = self.points
        if tokens >= pts[-1][0]:
            return pts[-1][1]
        for (t0, w0), (t1, w1) in itertools.pairwise(pts):
            if t0 <= tokens < t1:
                f = (tokens - t0) / (t1 - t0)
                return tuple(a + (b - a) * f for a, b in zip(w0, w1, strict=True))
        return pts[0][1]
