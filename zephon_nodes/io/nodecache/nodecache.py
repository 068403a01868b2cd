"""The process's node cache: one :class:`NodeCache` per process and settings.

:func:`node_cache` opens the cache the physical settings describe (``<cache_dir>/node``,
``cache_limit``, ``cache_policy``) once per process and keeps it for its threads;
:func:`set_cache_limit` changes those settings for the process and :func:`check_fits`
refuses at start-up a cache too small for the largest shard it must hold.

The cache itself, a bounded directory shared by the node's ranks with exact-future
eviction, is :mod:`zephon_nodes.io.nodecache.cache`; this module also exports its names
(:class:`NodeCache`, :class:`Cacheable`, :data:`Fetch`, :class:`CacheFullError`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from zephon_nodes.core import settings as _settings
from zephon_nodes.core.errors import DataError
from zephon_nodes.core.settings import Settings, parse_size
from zephon_nodes.io.nodecache.cache import NodeCache
from zephon_nodes.io.nodecache.entries import Cacheable, CacheFullError, Fetch

__all__ = [
    "LIMIT_ENV",
    "POLICY_ENV",
    "PREFETCH_ENV",
    "CacheFullError",
    "Cacheable",
    "Fetch",
    "NodeCache",
    "check_fits",
    "node_cache",
    "parse_size",
    "prefetch_depth",
    "set_cache_limit",
]

LIMIT_ENV = "ZEPHON_CACHE_LIMIT"
POLICY_ENV = "ZEPHON_CACHE_POLICY"
PREFETCH_ENV = "ZEPHON_CACHE_PREFETCH"

_SHARED: dict[tuple[int, str, int | None, int | None, str], NodeCache] = {}
_SHARED_LOCK = threading.Lock()


def set_cache_limit(
    limit: str | int | None, policy: str | None = None, prefetch: int | None = None
) -> None:
    """Change this process's node-cache limit, policy and prefetch depth (settings updates).

    Each is an :func:`~zephon_nodes.core.settings.update` of the process's settings, which
    pools send to their workers with every call. None leaves a setting as the environment
    or the default has it (``limit=None``: ``ZEPHON_CACHE_LIMIT``, else the automatic
    default, see :meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`).

    Raises:
        RecipeError: ``limit`` is not a byte size, ``policy`` unknown or ``prefetch`` < 0.
    """
    _settings.update(cache_limit=limit, cache_policy=policy, cache_prefetch=prefetch)


def prefetch_depth(settings: Settings | None = None) -> int:
    """Return the prefetch depth: upcoming shards kept fetched ahead of use.

    From :attr:`Settings.cache_prefetch <zephon_nodes.core.settings.Settings>`
    (``ZEPHON_CACHE_PREFETCH``, default 4; 0 disables the prefetcher).
    """
    return (settings or _settings.current()).cache_prefetch


def node_cache(settings: Settings | None = None) -> NodeCache:
    """Return this process's node cache for ``settings`` (default: the current settings).

    The cache lives in ``<cache_dir>/node`` with the limit of ``cache_limit``
    (``--cache-limit`` / ``ZEPHON_CACHE_LIMIT``, e.g. ``50G``; without one, a share of the
    disk's free space computed once per process, see
    :meth:`~zephon_nodes.core.settings.Settings.cache_limit_bytes`) and the policy of
    ``cache_policy`` (default ``belady``); one instance per process and settings, shared by
    its threads.
    """
    s = settings or _settings.current()
    root = str(Path(s.cache_dir) / "node")
    key = (os.getpid(), root, s.cache_limit, s.cache_free_bytes, s.cache_policy)
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            try:
                cache = NodeCache(root, s.cache_limit_bytes(), s.cache_policy)
            except OSError as e:
                raise DataError(
                    f"node cache {root}: cannot use the directory ({e.strerror or e}); the "
                    "cache directory (ZEPHON_CACHE_DIR) must be writable with --cache-limit"
                ) from None
            cache.settings = s
            _SHARED[key] = cache
    return cache


def check_fits(largest: int, what: str, settings: Settings | None = None) -> None:
    """Refuse at start-up a node cache too small for the largest entry it must hold.

    Args:
        largest: Bytes of the largest shard read through the node cache (or a lower bound).
        what: That shard, for the message.
        settings: The settings (default: the current ones).

    Raises:
        DataError: Naming the shard, its size, the limit and where the limit comes from.
    """
    s = settings or _settings.current()
    limit = node_cache(s).limit_bytes
    if largest > limit:
        raise CacheFullError(
            f"node cache {Path(s.cache_dir) / 'node'}: {what} needs {largest} bytes, more than "
            f"its limit of {limit} bytes ({s.limit_source()}); free space on that disk, point "
            "ZEPHON_CACHE_DIR at a larger one or set a larger --cache-limit"
        )
