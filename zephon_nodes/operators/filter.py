"""Filter: drop documents for which a registered user predicate returns False."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.operators.documents import TextBatch, add_skipped
from zephon_nodes.recipe.registry import lookup
from zephon_nodes.recipe.spec import OperatorSpec

__all__ = ["Filter"]


@dataclass(frozen=True)
class Filter:
    """Stateless operator: ``TextBatch -> TextBatch`` keeping the texts ``fn`` accepts.

    Runs on the worker pool inside the fused chain, one call per work item, so the kept
    documents depend only on the work item, never on the number of workers. Dropped
    documents are counted under ``"filtered:<name>"`` in :attr:`TextBatch.skipped`.

    Args:
        fn_name: Registered name of the predicate.
        fn: ``fn(text, **params) -> bool``; deterministic, picklable for the process runner.
        params: Keyword arguments, as sorted ``(key, value)`` pairs.
        datasets: Indexes of the datasets it applies to; ``None``: all.
    """

    fn_name: str
    fn: Callable[..., Any]
    params: tuple[tuple[str, Any], ...] = ()
    datasets: frozenset[int] | None = None

    @classmethod
    def from_spec(cls, spec: OperatorSpec, dataset_index: Mapping[str, int]) -> Filter:
        """Build the operator a recipe's ``[[operators]] filter = ...`` entry names."""
        fn = lookup("filter", spec.name).obj
        datasets = None
        if spec.datasets is not None:
            datasets = frozenset(dataset_index[d] for d in spec.datasets)
        return cls(spec.name, fn, tuple(sorted(spec.params.items())), datasets)

    @property
    def name(self) -> str:
        """Operator name used in messages and counts."""
        return f"filter:{self.fn_name}"

    def __call__(self, batch: TextBatch) -> TextBatch:
        """Keep the texts the predicate accepts."""
        if self.datasets is not None and batch.dataset not in self.datasets:
            return batch
        kwargs = dict(self.params)
        kept = [t for t in batch.texts if self.fn(t, **kwargs)]
        dropped = len(batch.texts) - len(kept)
        if not dropped:
            return batch
        skipped = add_skipped(batch.skipped, self.name, dropped)
        return TextBatch(kept, batch.source, batch.dataset, skipped)
