"""The flush marker that travels down a lane's operator chain at every flush point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Flush", "is_flush"]


@dataclass(frozen=True, slots=True)
class Flush:
    """Marks the end of flush window ``window`` in a lane's stream.

    Every ``flush_every`` work items the lane's work source emits one. Stateless operators
    pass it on untouched; accumulators emit everything they hold, reset, then pass it on.

    Attributes:
        window: Index of the window that ends here.
    """

    window: int


def is_flush(item: Any) -> bool:
    """Return True if ``item`` is a :class:`Flush` marker."""
    return type(item) is Flush
