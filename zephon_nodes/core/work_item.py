"""The work item: a group of consecutive records of one shard, the unit operators run on.

A :class:`~zephon_nodes.engine.work.WorkSource` deals work items to lanes; operators read
their records through :class:`ShardReader`, the part of a shard (every format of
:mod:`zephon_nodes.io.formats`) they use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ShardReader", "WorkItem"]


class ShardReader(Protocol):
    """What operators use of a shard: its records by index, and where a record is."""

    @property
    def path(self) -> str:
        """Path or URI of the shard, for messages."""

    @property
    def num_records(self) -> int:
        """Number of records in the shard."""

    def read(self, start: int, stop: int) -> Sequence[tuple[int, Any]]:
        """Return ``(record number, record)`` for the records in ``[start, stop)``."""

    def where(self, record: int) -> str:
        """Say where record ``record`` is (file and line or row), for error messages."""


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A group of consecutive records of one shard: the unit operators run on.

    Attributes:
        dataset: Index of the dataset in the recipe.
        dataset_name: Name of the dataset.
        text_field: JSON field holding the text.
        item: Index of the work item within its dataset.
        epoch: Epoch of the dataset this item belongs to.
        shard: The shard to read.
        start: First record (inclusive).
        stop: End record (exclusive).
        lane: Lane the item was dealt to.
        position: Index of the item in its lane's stream.
        shard_index: Index of the shard in its dataset's shard list (-1: unknown).
    """

    dataset: int
    dataset_name: str
    text_field: str
    item: int
    epoch: int
    shard: ShardReader
    start: int
    stop: int
    lane: int
    position: int
    shard_index: int = -1

    def describe(self) -> str:
        """Say where the item's records are, for error messages."""
        return (
            f"dataset {self.dataset_name!r}, {self.shard.path} records [{self.start}, "
            f"{self.stop}) (lane {self.lane}, work item {self.position})"
        )
