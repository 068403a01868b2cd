"""Lane sources over plain lists, for testing operators and nodes outside a recipe.

:func:`list_source` is the node a lane starts from, over a list and with a flush marker every
few items, so an operator or accumulator built on it restores exactly as it does inside a
real lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon_nodes.engine.lane import WorkItemNode
from zephon_nodes.engine.work import WorkSource

__all__ = ["ListWorkSource", "list_source"]


class ListWorkSource(WorkSource):
    """A one-lane work source over a list: ``work(0, i)`` is ``items[i]``.

    Args:
        items: The items, in order.
    """

    def __init__(self, items: Sequence[Any]) -> None:
        super().__init__(num_lanes=1)
        self.items = list(items)

    def work(self, lane: int, i: int) -> Any:
        """Return item ``i``, or None past the end."""
        return self.items[i] if i < len(self.items) else None


def list_source(items: Sequence[Any], flush_every: int) -> WorkItemNode:
    """A lane source over ``items`` with a flush marker every ``flush_every`` items.

    It is the node a lane starts from (a :class:`~zephon_nodes.engine.lane.WorkItemNode`), so
    operators built on it restore exactly as they do inside a real lane.
    """
    return WorkItemNode(ListWorkSource(items), 0, flush_every)
