"""The bytes a node cache holds: its entries, and the reservations of fetches in flight.

A fetch first reserves an upper bound of its entry's size (``root/resv/<name>``), writes the
entry under ``root/part/`` and renames it into ``root/data/``. The entries' total is recorded
in ``root/.usage``: every change to data/ is made under the cache's global lock and recorded
with data/'s modification time after it, so while that time is unchanged the recorded total
is exact and a cache of many small entries need not list data/ on every miss.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from zephon_nodes.io.nodecache.locks import fetch_in_flight

__all__ = ["UsageRecord", "drop_reservation", "reserved_bytes"]


class UsageRecord:
    """The record of the bytes in a cache's data/ (read and changed under its global lock).

    Args:
        root: The cache directory.
    """

    RESCAN_EVERY = 64
    """A full listing of data/ at least every this many decisions of a process, whatever the
    record says (bounds the drift a crash between a change and its record could leave)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._unscanned = 0  # decisions since this process last listed data/

    def data_mtime(self) -> int:
        """Return data/'s modification time (ns); take it before a change to record it."""
        return os.stat(self.root / "data").st_mtime_ns

    def _read(self) -> tuple[int, int] | None:
        try:
            mtime, total = (self.root / ".usage").read_text().split()
            return int(mtime), int(total)
        except (FileNotFoundError, ValueError):
            return None

    def _write(self, mtime: int, total: int) -> None:
        (self.root / ".usage").write_text(f"{mtime} {total}")

    def record_change(self, before: int, delta: int) -> None:
        """After adding (``delta`` > 0) or removing an entry of data/: keep the record exact.

        Under the global lock. The record holds data/'s modification time and total bytes as
        of the last recorded change; it is updated only if it was current just before this
        change (``before``, from :meth:`data_mtime`), else dropped (the next decision lists
        data/).
        """
        rec = self._read()
        if rec is not None and rec[0] == before:
            self._write(self.data_mtime(), rec[1] + delta)
        elif rec is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.root / ".usage").unlink()

    def data_bytes(self) -> int:
        """Bytes of the entries in data/ (under the global lock).

        The recorded total while data/'s modification time is the recorded one. A change the
        record does not know (a process that died between the two, a file removed by hand)
        changes the time: then, and every :attr:`RESCAN_EVERY` decisions anyway, data/ is
        listed again.
        """
        self._unscanned += 1
        rec = self._read()
        fresh = rec is not None and self._unscanned < self.RESCAN_EVERY
        if fresh and rec is not None and rec[0] == self.data_mtime():
            return rec[1]
        mtime = self.data_mtime()
        total = 0
        for entry in os.scandir(self.root / "data"):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
        self._write(mtime, total)
        self._unscanned = 0
        return total


def drop_reservation(root: Path, name: str) -> None:
    """Remove the reservation and partial files a dead fetcher of ``name`` left behind."""
    with contextlib.suppress(FileNotFoundError):
        (root / "resv" / name).unlink()
    for part in (root / "part").glob(f"{name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def reserved_bytes(root: Path) -> int:
    """Bytes reserved by fetches in flight (under the global lock).

    The reservation of a fetcher that died is dropped and frees its room.
    """
    total = 0
    for entry in os.scandir(root / "resv"):
        if not fetch_in_flight(root, entry.name):  # its fetcher died: free its room
            drop_reservation(root, entry.name)
            continue
        with contextlib.suppress(FileNotFoundError, ValueError):
            total += int(Path(entry.path).read_text() or 0)
    return total
