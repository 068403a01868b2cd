"""The eviction policies: which unpinned entry leaves first when room is needed.

- ``"belady"``: the entry whose next use, by any process on the node, is farthest away
  (Belady's rule, optimal for a known sequence; the uses come from the node's plans, see
  :mod:`~zephon_nodes.io.nodecache.plans`); entries no process will use again go first,
  ties by name.
- ``"lru"``: the least recently used entry (the comparison policy); the cache stamps an
  entry's modification time each time it is used.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal

from zephon_nodes.io.nodecache.plans import Plan

__all__ = ["Policy", "victims"]

Policy = Literal["belady", "lru"]

_INF = float("inf")


def victims(
    data: Path, policy: Policy, plan: Plan, unplanned_only: bool = False
) -> list[tuple[str, float]]:
    """Return eviction candidates, best victim first (pins are checked by the caller).

    Args:
        data: The cache's folder of entries.
        policy: ``"belady"`` or ``"lru"``.
        plan: This process's plan (with ``"belady"``, the node's plans give the distances).
        unplanned_only: Only entries no process plans to use (the prefetcher's evictions).

    Returns:
        ``(name, distance)`` pairs: the next use in accesses from now (infinite: none), 0.0
        under ``"lru"``.
    """
    names = [e.name for e in os.scandir(data)]
    if policy == "lru":
        order = []
        for n in names:
            with contextlib.suppress(FileNotFoundError):
                order.append((os.stat(data / n).st_mtime_ns, n))
        order.sort()
        return [(n, 0.0) for _, n in order]
    dist = plan.distances()
    ranked = sorted(((dist.get(n, _INF), n) for n in names), key=lambda t: (-t[0], t[1]))
    if unplanned_only:  # the prefetcher: only what no process plans to use
        ranked = [t for t in ranked if t[0] == _INF]
    return [(n, d) for d, n in ranked]
