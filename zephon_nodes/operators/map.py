"""Map: transform document texts with a registered user function."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon_nodes.core.errors import DataError
from zephon_nodes.operators.documents import TextBatch
from zephon_nodes.operators.registered import RegisteredTextOperator

__all__ = ["Map"]


@dataclass(frozen=True)
class Map(RegisteredTextOperator):
    """Stateless operator replacing every text by ``fn(text, **params) -> str``.

    See :class:`~zephon_nodes.operators.registered.RegisteredTextOperator` for the fields.
    """

    KIND: ClassVar[str] = "map"

    def apply(self, batch: TextBatch, kwargs: dict[str, Any]) -> TextBatch:
        """Apply the function to every text.

        Raises:
            DataError: If the function returns something other than a string.
        """
        out = []
        for t in batch.texts:
            new = self.fn(t, **kwargs)
            if not isinstance(new, str):
                raise DataError(
                    f"map {self.fn_name!r} returned {type(new).__name__}, expected str "
                    f"({batch.source})"
                )
            out.append(new)
        return dataclasses.replace(batch, texts=out)
