"""Checksums of the dataset-index table kept in the cache, verified where it is read.

The columns of a dataset index (:mod:`zephon_nodes.io.index.table`) are derived from the
checked manifest once per machine and memory-mapped by every later build. A bit flipped in
them on disk (a failing disk, a half-restored backup, a hand edit) would silently change the
record counts, the file list or the identities of a dataset on one machine only. So the table
folder holds ``sums.json``: the content checksum (xxh3-128) of every column file and of
``directory.txt``, written with the table and checked once per process before the table is
used; a cached pattern match ends with the xxh3-64 of its rows. A table or match that fails
its check is dropped, made again from the manifest and counted (``bad_cache_entries``, as a
bad copy of a shard is, :mod:`zephon_nodes.io.formats.entrysums`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from zephon_nodes.io.formats.entrysums import count_bad
from zephon_nodes.io.storage.checksum import Hasher

__all__ = ["SUMS_FILE", "drop_table", "sums_hold", "tag_rows", "untag_rows", "write_table_sums"]

SUMS_FILE = "sums.json"
_TAG_MASK = (1 << 63) - 1
_CHECKED: set[str] = set()  # table folders whose sums held in this process


def _file_sum(path: Path) -> str:
    h = Hasher()  # the content checksum of shards, here of the table's files
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_table_sums(folder: Path, names: Sequence[str]) -> None:
    """Write ``sums.json`` for the files ``names`` of a table being built in ``folder``."""
    sums = {name: _file_sum(folder / name) for name in names}
    (folder / SUMS_FILE).write_text(json.dumps(sums, sort_keys=True), encoding="utf-8")


def sums_hold(folder: Path, names: Sequence[str]) -> bool:
    """Whether every file ``names`` of the table in ``folder`` has the checksum written with it.

    Checked once per process (each column read once; xxh3 reads gigabytes per second).
    """
    if str(folder) in _CHECKED:
        return True
    try:
        sums = json.loads((folder / SUMS_FILE).read_text(encoding="utf-8"))
        ok = isinstance(sums, dict) and all(
            sums.get(name) == _file_sum(folder / name) for name in names
        )
    except (OSError, ValueError):
        ok = False
    if ok:
        _CHECKED.add(str(folder))
    return ok


def drop_table(folder: Path) -> None:
    """Remove a table folder that failed its sums, and count it (another process may map it)."""
    aside = folder.with_name(f"{folder.name}.bad.{os.getpid()}")
    with contextlib.suppress(OSError):
        os.rename(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)
    _CHECKED.discard(str(folder))
    count_bad()


def tag_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` (int64) followed by a 63-bit share of their xxh3-64, as they are cached."""
    return np.append(rows, np.int64(xxhash.xxh3_64_intdigest(rows.tobytes()) & _TAG_MASK))


def untag_rows(cached: np.ndarray) -> np.ndarray | None:
    """The rows of a cached match if its tag holds; None (counted) if it does not."""
    if cached.dtype == np.int64 and cached.ndim == 1 and len(cached) >= 1:
        body = cached[:-1]
        if int(cached[-1]) == xxhash.xxh3_64_intdigest(body.tobytes()) & _TAG_MASK:
            return body
    count_bad()
    return None
