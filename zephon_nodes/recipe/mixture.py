"""The recipe's ``[mixture]`` table: how several datasets are mixed, and the weight schedule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon_nodes.errors import RecipeError
from zephon_nodes.recipe.bounds import SETTINGS, check_setting

__all__ = ["SCHEDULE_UNITS", "MixtureSpec"]

SCHEDULE_UNITS = ("steps", "tokens")


@dataclass(frozen=True)
class MixtureSpec:
    """How several datasets are mixed (ignored with a single dataset).

    Weights are *token* shares. Without a schedule each dataset's ``weight`` is used; a
    schedule gives the weights at points of training progress, interpolated linearly
    between points and held after the last one.

    Args:
        schedule: ``((at, {dataset name: weight, ...}), ...)``, ``at`` strictly increasing from
            0; every point names every dataset.
        unit: Unit of ``at``: ``"steps"`` (global batches) or ``"tokens"``.
        estimate_records: Records sampled (seeded) per dataset to estimate tokens per record.
        tokens_per_record: Stored estimate per dataset name; skips the sampling when given.
        block: Work items per plan block (a power of two): the plan is exact per block, and
            the order inside a block is shuffled so lanes see a mix.
    """

    schedule: tuple[tuple[float, Mapping[str, float]], ...] | None = None
    unit: str = "steps"
    estimate_records: int = 512
    tokens_per_record: Mapping[str, float] | None = None
    block: int = 1024

    def __post_init__(self) -> None:
        if self.unit not in SCHEDULE_UNITS:
            raise RecipeError(f"mixture.unit={self.unit!r} must be one of {SCHEDULE_UNITS}")
        check_setting("mixture.estimate_records", self.estimate_records)
        if not 1 <= self.block <= 1 << 20 or self.block & (self.block - 1):
            raise RecipeError(f"mixture.block={self.block} must be a power of two <= 2**20")
        if self.tokens_per_record is not None:
            for name, value in self.tokens_per_record.items():
                check_setting(
                    f"mixture.tokens_per_record[{name!r}]",
                    value,
                    bound=SETTINGS["mixture.tokens_per_record"],
                )
        if self.schedule is not None:
            if not self.schedule:
                raise RecipeError("mixture.weights must hold at least one point")
            last = None
            for k, (at, weights) in enumerate(self.schedule):
                check_setting(f"mixture.weights[{k}].at", at)
                if k == 0 and at != 0:
                    raise RecipeError(f"mixture.weights[0].at={at!r} must be 0")
                if last is not None and not at > last:
                    raise RecipeError(
                        f"mixture.weights[{k}].at={at!r} must be > the previous point's {last!r}"
                    )
                last = at
                for name, w in weights.items():
                    check_setting(
                        f"mixture.weights[{k}].{name}", w, bound=SETTINGS["mixture.weights.weight"]
                    )
                if not sum(weights.values()) > 0:
                    raise RecipeError(f"mixture.weights[{k}]: the weights sum to 0")

    def check(self, names: Sequence[str]) -> None:
        """Check the schedule and stored estimate against the recipe's dataset names."""
        expected = sorted(names)
        if self.schedule is not None:
            for k, (_, weights) in enumerate(self.schedule):
                if sorted(weights) != expected:
                    raise RecipeError(
                        f"mixture.weights[{k}] names {sorted(weights)}; every point must give "
                        f"a weight to each dataset {expected}"
                    )
        if self.tokens_per_record is not None and sorted(self.tokens_per_record) != expected:
            raise RecipeError(
                f"mixture.tokens_per_record names {sorted(self.tokens_per_record)}, expected "
                f"{expected}"
            )

    def canonical(self) -> dict[str, Any]:
        """Data-defining fields of the mixture plan."""
        return {
            "plan": "split-tree/1",
            "block": self.block,
            "unit": self.unit,
            "estimate_records": self.estimate_records,
            "tokens_per_record": (
                {k: float(v) for k, v in sorted(self.tokens_per_record.items())}
                if self.tokens_per_record is not None
                else None
            ),
            "schedule": (
                [
                    {"at": float(at), "weights": {k: float(v) for k, v in sorted(w.items())}}
                    for at, w in self.schedule
                ]
                if self.schedule is not None
                else None
            ),
        }
