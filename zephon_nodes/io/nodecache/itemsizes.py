"""Work-item sizes kept per node: computed by one process, read by every later build.

Dealing by tokens (:mod:`zephon_nodes.engine.balance`) sizes each work item of a small dataset
by parsing and tokenizing every record when a pipeline is built. Those sizes are a pure
function of the records and of the parse and tokenizer, so they are kept in the node's cache
directory (``sizes/<key>.npy``, one int64 per work item) under a key the caller makes of
exactly that (the shards' content identities, the work items' record ranges, the text field,
the error policy, the tokenizer's identity and the version of the parse and tokenize code):
every later build on the node (each rank of a job, each restart) reads one small file instead.
The first build of a node computes them while the node's other processes wait for it (a file
lock), as the shard table of a dataset index is made once per node.

Each file ends with a 63-bit share of the xxh3-64 of its values, checked on every read: a
file that fails it (a failing disk, a hand edit) is dropped, counted (``bad_cache_entries``)
and computed again, so a damaged file can never change a deal: all three under the file
lock, once the file is found still bad there, so the node's processes that found it bad at
once count it once and none unlinks the sizes another has just written. A cache directory
that cannot be written only costs the computation at every build.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from zephon_nodes.core import settings
from zephon_nodes.core.errors import DataError
from zephon_nodes.io.formats.entrysums import count_bad
from zephon_nodes.io.nodecache.locks import entry_lock
from zephon_nodes.io.storage.cache import atomic_write, cache_dir

__all__ = ["node_sizes"]

_MASK = (1 << 63) - 1


def _folder() -> Path | None:
    if not settings.current().item_sizes:  # ZEPHON_ITEM_SIZES=off
        return None
    try:
        folder = cache_dir() / "sizes"
        folder.mkdir(exist_ok=True)
    except (DataError, OSError):
        return None
    return folder


def _tag(values: np.ndarray) -> np.int64:
    return np.int64(xxhash.xxh3_64_intdigest(values.tobytes()) & _MASK)


def _read(path: Path) -> tuple[np.ndarray | None, bool]:
    """``(sizes, bad)``: the sizes stored at ``path`` if they are there and hold their check.

    ``bad`` is True for a file that is there but not what was written (no sizes then).
    """
    try:
        stored = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None, False
    except (OSError, ValueError):
        stored = None
    if (
        isinstance(stored, np.ndarray)
        and stored.dtype == np.int64
        and stored.ndim == 1
        and len(stored) >= 1
        and int(stored[-1]) == int(_tag(stored[:-1]))
    ):
        return np.array(stored[:-1]), False
    return None, True


def node_sizes(
    key: str | None, compute: Callable[[], tuple[np.ndarray, bool]]
) -> tuple[np.ndarray, bool]:
    """The sizes kept under ``key``, else ``compute()``'s (kept when it says they may be).

    Args:
        key: What the sizes are a function of (a short file-name-safe digest); None: not
            kept (computed every time).
        compute: Returns ``(sizes, keep)``: ``keep`` False for sizes that may differ next
            time (a file that could not be read yet).

    Returns:
        ``(sizes, computed)``: ``computed`` False when they were read from the node cache.
    """
    folder = None if key is None else _folder()
    if folder is None or key is None:
        return compute()[0], True
    path = folder / f"{key}.npy"
    found, _ = _read(path)  # a bad file is judged again under the lock
    if found is not None:
        return found, False
    with entry_lock(path.with_suffix(".lock")):
        found, bad = _read(path)  # another process of the node made them meanwhile
        if found is not None:
            return found, False
        if bad:  # not what was written: dropped, made again, counted once
            count_bad()
            with contextlib.suppress(OSError):
                path.unlink()
        sizes, keep = compute()
        if keep:
            values = np.asarray(sizes, dtype=np.int64)
            with contextlib.suppress(OSError):  # a read-only cache only costs the next build
                atomic_write(
                    path, lambda f: np.save(f, np.append(values, _tag(values)), allow_pickle=False)
                )
    return sizes, True
