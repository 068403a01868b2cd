"""The recipe's ``[[operators]]`` tables: user filters and maps over document texts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.registry import lookup

__all__ = ["OPERATOR_KINDS", "OperatorSpec"]

OPERATOR_KINDS = ("filter", "map")


@dataclass(frozen=True)
class OperatorSpec:
    """A user filter or map over document texts, registered in Python by name.

    Args:
        kind: ``"filter"`` (keep documents for which the function returns True) or ``"map"``.
        name: Name given to :func:`~zephon_nodes.register_filter` / ``register_map``.
        params: Keyword arguments passed to the function (JSON-safe values).
        datasets: Names of the datasets it applies to; ``None``: all.
    """

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    datasets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in OPERATOR_KINDS:
            raise RecipeError(f"operator kind={self.kind!r} must be one of {OPERATOR_KINDS}")
        try:
            json.dumps(dict(self.params), sort_keys=True)
        except (TypeError, ValueError) as e:
            raise RecipeError(f"{self.kind} {self.name!r}: params must be JSON-safe: {e}") from None

    def canonical(self) -> dict[str, Any]:
        """Name, registered version, parameters and datasets."""
        return {
            "kind": self.kind,
            "name": self.name,
            "version": lookup(self.kind, self.name).version,
            "params": json.loads(json.dumps(dict(self.params), sort_keys=True)),
            "datasets": list(self.datasets) if self.datasets is not None else None,
        }
