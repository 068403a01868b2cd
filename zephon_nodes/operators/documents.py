"""Batches of documents passed between operators (text or token ids)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DocBatch", "Skipped", "TextBatch", "add_skipped"]

# ``((reason, count), ...)`` sorted by reason: what a stateless operator dropped from a work
# item (bad records under ``on_error = "skip"``, filtered documents). It travels with the
# batch so that counts come out in stream order, whatever the number of workers.
Skipped = tuple[tuple[str, int], ...]


def add_skipped(skipped: Skipped, reason: str, count: int) -> Skipped:
    """Return ``skipped`` with ``count`` more under ``reason`` (kept sorted)."""
    if count <= 0:
        return skipped
    counts = dict(skipped)
    counts[reason] = counts.get(reason, 0) + count
    return tuple(sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class TextBatch:
    """The texts of one work item, in record order.

    Attributes:
        texts: Document texts.
        source: Where the batch came from (for messages), e.g. a work item's description.
        dataset: Index of the dataset in the recipe (-1: unknown).
        skipped: Records or documents dropped so far, by reason.
        shard: The work item's shard, by its index in the dataset (-1: unknown).
        records: Each text's record number in the shard (None: not tracked).
    """

    texts: list[str]
    source: str = ""
    dataset: int = -1
    skipped: Skipped = ()
    shard: int = -1
    records: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class DocBatch:
    """The token ids of a work item's documents, concatenated.

    Attributes:
        tokens: All documents' ids, one after another (int32).
        lengths: Length of each document (int64); they sum to ``len(tokens)``.
        dataset: Index of the dataset in the recipe (-1: unknown).
        skipped: Records or documents dropped so far, by reason.
        mask: Per token, whether it is trained as a label (bool; chat recipes); ``None``:
            every token is.
        shard: The work item's shard, by its index in the dataset (-1: unknown).
        records: Each document's record number in the shard (None: not tracked).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    dataset: int = -1
    skipped: Skipped = ()
    mask: np.ndarray | None = None
    shard: int = -1
    records: np.ndarray | None = None

    def documents(self) -> list[np.ndarray]:
        """Split back into one array per document."""
        return np.split(self.tokens, np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []
