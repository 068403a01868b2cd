"""Datasets: shards cut into numbered work items of ``chunk_size`` records."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephon_nodes.io.shards import Shard, memory_shard, open_shard
from zephon_nodes.recipe.spec import DatasetSpec

__all__ = ["Dataset"]


@dataclass(frozen=True)
class Dataset:
    """A dataset's shards, cut into work items (a shard's last item may be shorter).

    Work item ``k`` of the dataset is found in O(log shards) through cumulative counts, so
    any item can be reached without reading the items before it. An empty shard contributes
    no work items.

    Attributes:
        name: Dataset name.
        text_field: JSON field holding the text.
        shards: The shards in recipe order (sorted glob matches).
        chunk_size: Records per work item.
    """

    name: str
    text_field: str
    shards: tuple[Shard, ...]
    chunk_size: int

    @classmethod
    def from_spec(cls, spec: DatasetSpec, chunk_size: int) -> Dataset:
        """Open (and index, once per machine) every shard of a dataset spec."""
        if spec.records is not None:
            shards: tuple[Shard, ...] = (memory_shard(spec.name, spec.records),)
        else:
            shards = tuple(open_shard(p) for p in spec.files())
        return cls(spec.name, spec.text_field, shards, chunk_size)

    def __post_init__(self) -> None:
        per_shard = [-(-s.num_records // self.chunk_size) for s in self.shards]
        object.__setattr__(self, "_ends", np.cumsum(np.asarray(per_shard, dtype=np.int64)))

    @property
    def num_work_items(self) -> int:
        """Number of work items over all shards."""
        ends: np.ndarray = self._ends  # type: ignore[attr-defined]
        return int(ends[-1]) if len(ends) else 0

    @property
    def num_records(self) -> int:
        """Number of records over all shards."""
        return sum(s.num_records for s in self.shards)

    def locate(self, item: int) -> tuple[int, int, int]:
        """Return ``(shard index, first record, end record)`` of work item ``item``."""
        ends: np.ndarray = self._ends  # type: ignore[attr-defined]
        if not 0 <= item < self.num_work_items:
            raise IndexError(f"{item=} out of range for {self.num_work_items} work items")
        shard = int(np.searchsorted(ends, item, side="right"))
        first_item = int(ends[shard - 1]) if shard else 0
        start = (item - first_item) * self.chunk_size
        stop = min(start + self.chunk_size, self.shards[shard].num_records)
        return shard, start, stop
