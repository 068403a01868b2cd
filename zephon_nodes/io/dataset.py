"""Datasets: shards cut into numbered work items of ``chunk_size`` records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephon_nodes.io.discovery import RecipeDataset, dataset_files
from zephon_nodes.io.formats.shards import Shard, memory_shard, open_shard
from zephon_nodes.io.nodecache.wholeshard import open_whole_shard

__all__ = ["Dataset"]


@dataclass(frozen=True)
class Dataset:
    """A dataset's shards, cut into work items (a shard's last item may be shorter).

    Work item ``k`` of the dataset is found in O(log shards) through cumulative counts, so
    any item can be reached without reading the items before it. An empty shard contributes
    no work items. ``shards`` may be a :class:`~zephon_nodes.io.index.lazyshards.LazyShards` (from
    a dataset index): its record counts come from the index, and a shard is opened when a
    work item of it is first read.

    Attributes:
        name: Dataset name.
        text_field: JSON field holding the text.
        shards: The shards in recipe order (sorted glob matches).
        chunk_size: Records per work item.
    """

    name: str
    text_field: str
    shards: Sequence[Shard]
    chunk_size: int

    @classmethod
    def from_spec(cls, spec: RecipeDataset, chunk_size: int) -> Dataset:
        """Open (and index, once per machine) every shard of a dataset spec."""
        if spec.records is not None:
            shards: tuple[Shard, ...] = (memory_shard(spec.name, spec.records),)
        else:
            shards = tuple(_open(p) for p in dataset_files(spec))
        return cls(spec.name, spec.text_field, shards, chunk_size)

    def __post_init__(self) -> None:
        counts = getattr(self.shards, "records", None)
        if not isinstance(counts, np.ndarray):
            counts = np.asarray([s.num_records for s in self.shards], dtype=np.int64)
        per_shard = -(-counts.astype(np.int64) // self.chunk_size)
        object.__setattr__(self, "_counts", counts.astype(np.int64))
        object.__setattr__(self, "_ends", np.cumsum(per_shard, dtype=np.int64))

    @property
    def num_work_items(self) -> int:
        """Number of work items over all shards."""
        ends: np.ndarray = self._ends  # type: ignore[attr-defined]
        return int(ends[-1]) if len(ends) else 0

    @property
    def shard_records(self) -> np.ndarray:
        """Records of each shard (int64), without opening any."""
        counts: np.ndarray = self._counts  # type: ignore[attr-defined]
        return counts

    @property
    def num_records(self) -> int:
        """Number of records over all shards."""
        counts: np.ndarray = self._counts  # type: ignore[attr-defined]
        return int(counts.sum())

    def locate(self, item: int) -> tuple[int, int, int]:
        """Return ``(shard index, first record, end record)`` of work item ``item``."""
        ends: np.ndarray = self._ends  # type: ignore[attr-defined]
        if not 0 <= item < self.num_work_items:
            raise IndexError(f"{item=} out of range for {self.num_work_items} work items")
        shard = int(np.searchsorted(ends, item, side="right"))
        first_item = int(ends[shard - 1]) if shard else 0
        start = (item - first_item) * self.chunk_size
        counts: np.ndarray = self._counts  # type: ignore[attr-defined]
        stop = min(start + self.chunk_size, int(counts[shard]))
        return shard, start, stop


def _open(path: str) -> Any:
    """A shard; a ``.zst`` one is decompressed into the bounded node cache, never beside it."""
    if str(path).endswith(".zst"):
        return open_whole_shard(path)
    return open_shard(path)
