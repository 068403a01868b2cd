"""Map: transform document texts with a registered user function."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.errors import DataError
from zephon_nodes.operators.documents import TextBatch
from zephon_nodes.recipe.registry import lookup
from zephon_nodes.recipe.spec import OperatorSpec

__all__ = ["Map"]


@dataclass(frozen=True)
class Map:
    """Stateless operator: ``TextBatch -> TextBatch`` applying ``fn`` to every text.

    Runs on the worker pool inside the fused chain, one call per work item; the output
    depends only on the work item.

    Args:
        fn_name: Registered name of the function.
        fn: ``fn(text, **params) -> str``; deterministic, picklable for the process runner.
        params: Keyword arguments, as sorted ``(key, value)`` pairs.
        datasets: Indexes of the datasets it applies to; ``None``: all.
    """

    fn_name: str
    fn: Callable[..., Any]
    params: tuple[tuple[str, Any], ...] = ()
    datasets: frozenset[int] | None = None

    @classmethod
    def from_spec(cls, spec: OperatorSpec, dataset_index: Mapping[str, int]) -> Map:
        """Build the operator a recipe's ``[[operators]] map = ...`` entry names."""
        fn = lookup("map", spec.name).obj
        datasets = None
        if spec.datasets is not None:
            datasets = frozenset(dataset_index[d] for d in spec.datasets)
        return cls(spec.name, fn, tuple(sorted(spec.params.items())), datasets)

    @property
    def name(self) -> str:
        """Operator name used in messages."""
        return f"map:{self.fn_name}"

    def __call__(self, batch: TextBatch) -> TextBatch:
        """Apply the function to every text.

        Raises:
            DataError: If the function returns something other than a string.
        """
        if self.datasets is not None and batch.dataset not in self.datasets:
            return batch
        kwargs = dict(self.params)
        out = []
        for t in batch.texts:
            new = self.fn(t, **kwargs)
            if not isinstance(new, str):
                raise DataError(
                    f"map {self.fn_name!r} returned {type(new).__name__}, expected str "
                    f"({batch.source})"
                )
            out.append(new)
        return TextBatch(out, batch.source, batch.dataset, batch.skipped)
