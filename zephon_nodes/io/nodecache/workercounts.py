"""Node-cache counters of process workers, sent back with their results and added up.

A process worker (``WorkerPool(runner="process")``) reads shards through its own
:class:`~zephon_nodes.io.nodecache.cache.NodeCache` instance (one per process), so its hits,
misses and bytes fetched are counted in that process. :class:`CountedCall` wraps each call
sent to a worker: it returns the call's result with the change of the worker's counters
during the call, and :func:`collect` (run in the rank's process when the result arrives)
unwraps it and adds the change to this process's totals, which
:func:`zephon_nodes.engine.pipeline.Pipeline.cache_stats` and the loader's metrics include.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.operator import operator_name
from zephon_nodes.io.formats.entrysums import bad_entries
from zephon_nodes.io.nodecache import nodecache, tokenstore

__all__ = [
    "CountedCall",
    "CountedResult",
    "bad_cache_entries",
    "collect",
    "merged",
    "merged_tokens",
    "worker_totals",
]

# Counters that add up over processes (peak_bytes and limit_bytes do not).
ADDITIVE = (
    "hits",
    "misses",
    "fetches",
    "prefetches",
    "bytes_fetched",
    "bytes_read",
    "evictions",
    "waits",
    "bad_cache_entries",
)
_LOCK = threading.Lock()
_TOTALS: dict[str, int] = {}


# Prefix of the token cache's counters (zephon_nodes.io.nodecache.tokenstore) among them.
TOKENS = "tokens."


def _own() -> dict[str, int]:
    """The counters of this process's node caches and token stores, and its bad entries."""
    out: dict[str, int] = {"bad_cache_entries": bad_entries()}
    with nodecache._SHARED_LOCK:
        caches = [c for k, c in nodecache._SHARED.items() if k[0] == os.getpid()]
    for cache in caches:
        stats = cache.stats()
        for key in ADDITIVE:
            out[key] = out.get(key, 0) + int(stats.get(key, 0))
        out["peak_bytes"] = max(out.get("peak_bytes", 0), int(stats.get("peak_bytes", 0)))
    for key, value in tokenstore.process_stats().items():
        if key != "limit_bytes":
            out[TOKENS + key] = value
    return out


@dataclass(frozen=True)
class CountedResult:
    """A worker's result and the change of its node-cache counters during the call.

    Attributes:
        result: What the call returned.
        delta: Counter changes (only those that changed).
    """

    result: Any
    delta: dict[str, int]


@dataclass(frozen=True)
class CountedCall:
    """A picklable wrapper run in a worker process: ``fn(arg)`` and its counter changes.

    Args:
        fn: The call (an operator chain, possibly wrapped for shared memory).
    """

    fn: Callable[[Any], Any]

    def __call__(self, arg: Any) -> Any:
        """Run ``fn``; return its result, in a :class:`CountedResult` if counters moved."""
        before = _own()
        result = self.fn(arg)
        after = _own()
        delta = {k: v - before.get(k, 0) for k, v in after.items() if k != "peak_bytes"}
        delta = {k: v for k, v in delta.items() if v}
        if after.get("peak_bytes", 0) > before.get("peak_bytes", 0):
            delta["peak_bytes"] = after["peak_bytes"]
        return CountedResult(result, delta) if delta else result

    @property
    def name(self) -> str:
        """The wrapped call's name (messages)."""
        return operator_name(self.fn)


def collect(result: Any) -> Any:
    """Unwrap a worker's result, adding its counter changes to this process's totals."""
    if not isinstance(result, CountedResult):
        return result
    with _LOCK:
        for key, value in result.delta.items():
            if key == "peak_bytes":
                _TOTALS[key] = max(_TOTALS.get(key, 0), value)
            else:
                _TOTALS[key] = _TOTALS.get(key, 0) + value
    return result.result


def merged_tokens(stats: Mapping[str, int]) -> dict[str, int]:
    """This process's token-cache ``stats`` plus its process workers' (all additive)."""
    out = dict(stats)
    for key, value in worker_totals().items():
        if key.startswith(TOKENS):
            name = key[len(TOKENS) :]
            out[name] = int(out.get(name, 0)) + value
    return out


def worker_totals() -> dict[str, int]:
    """The counters process workers of this process reported so far."""
    with _LOCK:
        return dict(_TOTALS)


def merged(stats: Mapping[str, int]) -> dict[str, int]:
    """This process's cache ``stats`` plus its process workers' counters.

    Additive counters are summed; ``peak_bytes`` is the largest any process saw.
    """
    out = dict(stats)
    for key, value in worker_totals().items():
        if key.startswith(TOKENS):
            continue
        if key == "peak_bytes":
            out[key] = max(int(out.get(key, 0)), value)
        else:
            out[key] = int(out.get(key, 0)) + value
    return out


def bad_cache_entries() -> int:
    """Damaged cache entries dropped and made again, by this process and its workers."""
    return bad_entries() + worker_totals().get("bad_cache_entries", 0)
