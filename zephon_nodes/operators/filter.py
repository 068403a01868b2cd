"""Filter: drop documents for which a registered user predicate returns False."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zephon_nodes.operators.documents import TextBatch, add_skipped
from zephon_nodes.operators.registered import RegisteredTextOperator

__all__ = ["Filter"]


@dataclass(frozen=True)
class Filter(RegisteredTextOperator):
    """Stateless operator keeping the texts ``fn(text, **params) -> bool`` accepts.

    Dropped documents are counted under ``"filter:<name>"`` in :attr:`TextBatch.skipped`.
    See :class:`~zephon_nodes.operators.registered.RegisteredTextOperator` for the fields.
    """

    KIND: ClassVar[str] = "filter"

    def apply(self, batch: TextBatch, kwargs: dict[str, Any]) -> TextBatch:
        """Keep the texts the predicate accepts."""
        kept = [t for t in batch.texts if self.fn(t, **kwargs)]
        dropped = len(batch.texts) - len(kept)
        if not dropped:
            return batch
        skipped = add_skipped(batch.skipped, self.name, dropped)
        return TextBatch(kept, batch.source, batch.dataset, skipped)
