"""The base of the operators a recipe names by a registered function (``filter``, ``map``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from zephon_nodes.operators.documents import TextBatch
from zephon_nodes.recipe import OperatorSpec
from zephon_nodes.recipe.registry import lookup

__all__ = ["RegisteredTextOperator"]


@dataclass(frozen=True)
class RegisteredTextOperator:
    """Stateless ``TextBatch -> TextBatch`` operator around a registered user function.

    Runs on the worker pool inside the fused chain, one call per work item, so its output
    depends only on the work item, never on the number of workers. Subclasses set
    :attr:`KIND` (the registry kind and the recipe key) and implement :meth:`apply`.

    Args:
        fn_name: Registered name of the function.
        fn: The function; deterministic, picklable for the process runner.
        params: Keyword arguments, as sorted ``(key, value)`` pairs.
        datasets: Indexes of the datasets it applies to; ``None``: all.
    """

    KIND: ClassVar[str] = ""

    fn_name: str
    fn: Callable[..., Any]
    params: tuple[tuple[str, Any], ...] = ()
    datasets: frozenset[int] | None = None

    @classmethod
    def from_spec(cls, spec: OperatorSpec, dataset_index: Mapping[str, int]) -> Self:
        """Build the operator a recipe's ``[[operators]] <KIND> = ...`` entry names."""
        fn = lookup(cls.KIND, spec.name).obj
        datasets = None
        if spec.datasets is not None:
            datasets = frozenset(dataset_index[d] for d in spec.datasets)
        return cls(spec.name, fn, tuple(sorted(spec.params.items())), datasets)

    @property
    def name(self) -> str:
        """Operator name used in messages and counts."""
        return f"{self.KIND}:{self.fn_name}"

    def __call__(self, batch: TextBatch) -> TextBatch:
        """Apply the operator to a batch of one of its datasets; pass others through."""
        if self.datasets is not None and batch.dataset not in self.datasets:
            return batch
        return self.apply(batch, dict(self.params))

    def apply(self, batch: TextBatch, kwargs: dict[str, Any]) -> TextBatch:
        """Transform ``batch`` with ``fn(text, **kwargs)``."""
        raise NotImplementedError
