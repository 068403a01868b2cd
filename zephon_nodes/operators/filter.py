"""Filter: drop documents for which a registered user predicate returns False."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

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
        keep = [bool(self.fn(t, **kwargs)) for t in batch.texts]
        kept = [t for t, k in zip(batch.texts, keep, strict=True) if k]
        dropped = len(batch.texts) - len(kept)
        if not dropped:
            return batch
        skipped = add_skipped(batch.skipped, self.name, dropped)
        records = batch.records[np.asarray(keep, dtype=bool)] if batch.records is not None else None
        return TextBatch(kept, batch.source, batch.dataset, skipped, batch.shard, records)
