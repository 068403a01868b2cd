"""The work item: a run of consecutive records of one shard, the unit operators run on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: core sits below io
    from zephon_nodes.io.shards import Shard

__all__ = ["WorkItem"]


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
    """

    dataset: int
    dataset_name: str
    text_field: str
    item: int
    epoch: int
    shard: Shard
    start: int
    stop: int
    lane: int
    position: int

    def describe(self) -> str:
        """Say where the item's records are, for error messages."""
        return (
            f"dataset {self.dataset_name!r}, {self.shard.path} records [{self.start}, "
            f"{self.stop}) (lane {self.lane}, work item {self.position})"
        )
