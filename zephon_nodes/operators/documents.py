"""Batches of documents passed between operators (text or token ids)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DocBatch", "TextBatch"]


@dataclass(frozen=True, slots=True)
class TextBatch:
    """The texts of one work item, in record order.

    Attributes:
        texts: Document texts.
        source: Where the batch came from (for messages), e.g. a work item's description.
    """

    texts: list[str]
    source: str = ""


@dataclass(frozen=True, slots=True)
class DocBatch:
    """The token ids of a work item's documents, concatenated.

    Attributes:
        tokens: All documents' ids, one after another (int32).
        lengths: Length of each document (int64); they sum to ``len(tokens)``.
    """

    tokens: np.ndarray
    lengths: np.ndarray

    def documents(self) -> list[np.ndarray]:
        """Split back into one array per document."""
        return np.split(self.tokens, np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []
