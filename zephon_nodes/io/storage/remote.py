"""Remote shards without a dataset index: fetched once, checksummed, indexed, remembered.

The first use of a remote shard on a machine streams it once (visibly: one line per shard
on stderr) into a temporary file in the cache, computes its content checksum and lets the
format build its record index from the local bytes. The checksum is then remembered under
the URI, size and version tag (ETag, generation), so later runs reach it with one ``stat``
call; a changed version tag or size makes the shard be fetched and checksummed again.
``zephon index`` does the same work ahead of time for a whole dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import DataError
from zephon_nodes.core.progress import Progress
from zephon_nodes.io.storage import storage
from zephon_nodes.io.storage.cache import atomic_write, cache_dir
from zephon_nodes.io.storage.checksum import Hasher

__all__ = ["content_checksum", "fetched", "finish_progress", "known_checksum", "remember"]


def _memo_key(uri: str, st: storage.FileStat) -> str:
    return f"{storage.redact(uri)}|{st.size}|{st.version}"


def _memo(uri: str, st: storage.FileStat) -> Path:
    text = _memo_key(uri, st)
    return cache_dir() / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.remote.json"


def known_checksum(uri: str, st: storage.FileStat) -> str | None:
    """The remembered checksum of ``uri`` at this size and version tag, if any.

    A file whose backend reports no version tag has none remembered: nothing would show
    that its content changed. A memo holds the key it was written for (URI, size, version
    tag): one swapped or copied from another object's, or of the older keyless layout, is
    not trusted (the object is fetched again).
    """
    if not st.version:
        return None
    memo = _memo(uri, st)
    try:
        data = json.loads(memo.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != _memo_key(uri, st):
        return None
    value = data.get("checksum")
    return value if isinstance(value, str) else None


_PROGRESS: dict[bool, Any] = {}


def _announce(uri: str, st: storage.FileStat, whole: bool) -> None:
    """Say what is fetched and why: the first shard by name, then a progress bar on stderr.

    ``whole``: a single-frame ``.zst`` (its records already counted), fetched to be read
    whole.
    """
    bar = _PROGRESS.get(whole)
    if bar is None:
        first = f"(first: {storage.redact(uri)}, {st.size:,} bytes)"
        line = (
            f"zephon: fetching single-frame .zst shards to read them whole from the node cache "
            f"{first}; `zephon recompress` makes them readable in part"
            if whole
            else f"zephon: fetching and indexing remote shards without a dataset index {first}; "
            "`zephon index` builds one"
        )
        print(line, file=sys.stderr)
        what = "fetching whole" if whole else "fetching and indexing"
        bar = _PROGRESS[whole] = Progress(None, what, "shard")
    bar.update(1)


def finish_progress() -> None:
    """Close the progress bars of remote shards fetched so far (if any)."""
    for whole in (False, True):
        bar = _PROGRESS.pop(whole, None)
        if bar is not None:
            bar.close()


def remember(uri: str, st: storage.FileStat, checksum: str) -> None:
    """Remember ``checksum`` for ``uri`` at this size and version tag (not without a tag)."""
    if st.version:
        key = _memo_key(uri, st)
        blob = json.dumps({"key": key, "checksum": checksum, "size": st.size}).encode()
        atomic_write(_memo(uri, st), lambda f: f.write(blob))


def content_checksum(uri: str, st: storage.FileStat) -> str:
    """The checksum of ``uri``'s content: remembered, or fetched once, hashed and remembered.

    Raises:
        DataError: If the fetch fails (after retries) or the size changes meanwhile.
    """
    known = known_checksum(uri, st)
    if known is not None:
        return known
    h = Hasher()
    if storage.fetch(uri, h.update, st=st) != st.size:
        raise DataError(f"{storage.redact(uri)}: size changed while fetching")
    checksum = h.hexdigest()
    remember(uri, st, checksum)
    return checksum


@contextmanager
def fetched(
    uri: str,
    st: storage.FileStat,
    sink: Callable[[bytes], Any] | None = None,
    *,
    indexed: bool = False,
) -> Iterator[tuple[Path, str]]:
    """Fetch ``uri`` whole into a temporary cache file; yield ``(path, checksum)``.

    The checksum is remembered for :func:`known_checksum`. The file is deleted afterwards.
    Every request is conditional on ``st.version``: the bytes hashed are that version's.
    ``indexed``: the shard's records are known (from a dataset index or an earlier fetch) and
    it is fetched only to be read whole (what stderr says).

    Raises:
        ObjectChanged: The object is no longer ``st.version``.
        DataError: If the fetch fails (after retries) or the file changes meanwhile.
    """
    _announce(uri, st, indexed)
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), prefix="fetch.", suffix=".tmp")
    try:
        h = Hasher()
        with os.fdopen(fd, "wb") as f:

            def write(block: bytes) -> None:
                h.update(block)
                f.write(block)
                if sink is not None:
                    sink(block)

            n = storage.fetch(uri, write, st=st)
        if n != st.size:
            raise DataError(f"{storage.redact(uri)}: size changed while fetching")
        checksum = h.hexdigest()
        remember(uri, st, checksum)
        yield Path(tmp), checksum
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
