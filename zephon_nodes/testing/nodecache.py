"""Run a pipeline with its file shards read from whole copies in the node cache.

:func:`through_node_cache` turns a :class:`~zephon_nodes.Pipeline` over local ``.jsonl``
shards into one whose shards are fetched whole into the node cache
(:func:`~zephon_nodes.io.nodecache.nodecache.node_cache`) before each read, the way remote shards
without range reads, or single-frame ``.zst`` shards, are read. Tests and benchmarks use it to
check that the cache never changes a byte, keeps to its limit, and to count fetches (each
fetch appends the shard's key to ``fetch_log``, from any process).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zephon_nodes.core.errors import DataError
from zephon_nodes.engine.assembly import work_source
from zephon_nodes.engine.balance import BalancedWorkSource
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.work import DatasetWorkSource
from zephon_nodes.io.dataset import Dataset
from zephon_nodes.io.formats.shards import FileShard, Shard
from zephon_nodes.io.nodecache.nodecache import node_cache

__all__ = ["CachedCopyShard", "through_node_cache"]

_INDEXES: dict[str, np.ndarray] = {}


@dataclass(frozen=True)
class CachedCopyShard:
    """A local ``.jsonl`` shard read from its whole copy in the node cache (picklable).

    Attributes:
        path: The shard as named by the recipe.
        source: The uncompressed file the copy is fetched from.
        index_path: ``.npy`` record index (byte ranges, valid in the copy).
        num_records: Number of records.
        cache_key: Content identity of the copy (SHA-256 of the file, truncated).
        cache_size: Bytes of the copy.
        fetch_log: File each fetch appends the key to (empty: no log).
        latency_s: Seconds each fetch waits first (a remote store's round trip).
    """

    path: str
    source: str
    index_path: str
    num_records: int
    cache_key: str
    cache_size: int
    fetch_log: str = ""
    latency_s: float = 0.0

    def cache_fetch(self, dest: Path) -> None:
        """Copy the shard to ``dest`` (and log the fetch)."""
        if self.fetch_log:
            fd = os.open(self.fetch_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{self.cache_key}\n".encode())
            finally:
                os.close(fd)
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        shutil.copyfile(self.source, dest)

    def read(self, start: int, stop: int) -> list[tuple[int, bytes]]:
        """Return records ``[start, stop)`` from the cached copy."""
        cache = node_cache()
        if start == stop:
            return []
        index = _INDEXES.get(self.index_path)
        if index is None:
            index = _INDEXES.setdefault(self.index_path, np.load(self.index_path))
        lo, hi = int(index[start, 0]), int(index[stop - 1, 1])
        with (
            cache.open(self.cache_key, self.cache_size, self.cache_fetch) as local,
            open(local, "rb") as f,
        ):
            f.seek(lo)
            blob = f.read(hi - lo)
        if len(blob) != hi - lo:
            raise DataError(f"{self.path}: cached copy is shorter than its index")
        rows = index[start:stop] - lo
        return [(start + k, blob[a:b]) for k, (a, b) in enumerate(rows.tolist())]

    def where(self, record: int) -> str:
        """Describe a record's place for error messages."""
        return f"{self.path} record {record}"


def _wrap(shard: Shard, fetch_log: str, latency_s: float) -> Shard | CachedCopyShard:
    if not isinstance(shard, FileShard) or not os.path.isfile(shard.data_path):
        return shard
    data = Path(shard.data_path).read_bytes()
    return CachedCopyShard(
        path=shard.path,
        source=shard.data_path,
        index_path=shard.index_path,
        num_records=shard.num_records,
        cache_key="sha256-" + hashlib.sha256(data).hexdigest()[:32],
        cache_size=len(data),
        fetch_log=fetch_log,
        latency_s=latency_s,
    )


def through_node_cache(
    pipeline: Pipeline, fetch_log: str | os.PathLike[str] = "", latency_s: float = 0.0
) -> Pipeline:
    """Return a copy of ``pipeline`` whose local file shards are read through the node cache.

    ``fetch_log`` names a file each fetch appends its key to; ``latency_s`` delays each fetch.

    The shards go through the node cache of the pipeline's settings (its ``cache_limit``,
    else the default limit); the fingerprint and every output byte are the pipeline's own.
    """
    log = os.fspath(fetch_log)
    datasets = []
    for d in pipeline.datasets:
        shards: tuple[Any, ...] = tuple(_wrap(s, log, latency_s) for s in d.shards)
        datasets.append(Dataset(d.name, d.text_field, shards, d.chunk_size))
    src = pipeline.work_source
    if isinstance(src, BalancedWorkSource):
        # The same records, so the same item sizes: reuse them rather than read every item
        # through the cache again when the pipeline is built (before any limit is set).
        inner = src.inner
        same = DatasetWorkSource(
            datasets[0], inner.seed, inner.num_lanes, inner.epochs, inner.dataset_index
        )
        source: Any = BalancedWorkSource(same, src.item_sizes, src.measure)
    else:
        source, _ = work_source(pipeline.recipe, datasets, pipeline.stateless)
    return pipeline.derive(datasets=datasets, work_source=source)
