"""Where a jsonl text's records lie: the byte ranges of its non-blank lines.

One rule, three ways to apply it: to a file (:func:`index_file`), to bytes in memory
(:func:`split_records`) and to a stream written block by block (:class:`LineCounter`, fed by
:func:`decompress_to` without a temporary file). A line holding only a carriage return (a blank
CRLF line) is blank too. Every record index of the cache, the dataset index's offsets and the
sparse reads through a dataset index agree because they all come from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from zephon_nodes.core.errors import CORRUPT_ZSTD, TRUNCATED_FILE, DataError

__all__ = [
    "BLOCK",
    "TEXT_SUFFIXES",
    "LineCounter",
    "decompress_to",
    "index_file",
    "is_text_lines",
    "split_records",
]

BLOCK = 16 << 20

TEXT_SUFFIXES = (".txt", ".txt.zst")
"""Plain-text shards: each non-blank line is one document (its text, not a JSON object)."""


def is_text_lines(path: Any) -> bool:
    """Whether a shard's records are lines of plain text (``.txt``, ``.txt.zst``), not JSON."""
    return str(path).endswith(TEXT_SUFFIXES)


def decompress_to(src: Path, dst: Any, hasher: Any = None) -> None:
    """Decompress every zstd frame of ``src`` into the file object ``dst``.

    ``hasher`` (optional) is updated with every compressed block read.

    Raises:
        DataError: ``src`` is corrupt or truncated zstd data (naming it).
    """
    dctx = zstandard.ZstdDecompressor()
    obj = dctx.decompressobj()
    frame_done = True
    with open(src, "rb") as f:
        while block := f.read(1 << 20):
            if hasher is not None:
                hasher.update(block)
            while block:
                try:
                    out = obj.decompress(block)
                except zstandard.ZstdError as e:
                    raise DataError(f"{src}: corrupt zstd data: {e}", kind=CORRUPT_ZSTD) from None
                dst.write(out)
                if not obj.eof:
                    frame_done = False
                    break
                block = obj.unused_data
                obj = dctx.decompressobj()
                frame_done = not block
    if not frame_done:
        raise DataError(
            f"{src}: truncated zstd stream (the last frame is incomplete)", kind=TRUNCATED_FILE
        )


def split_records(blob: bytes) -> np.ndarray:
    """``(n, 2)`` byte ranges of the non-blank lines of ``blob`` (as :func:`index_file`)."""
    arr = np.frombuffer(blob, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10).astype(np.int64)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [len(blob)]])
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    ones = np.flatnonzero(ends - starts == 1)
    if len(ones):
        mask = arr[starts[ones]] != 13
        keep2 = np.ones(len(starts), dtype=bool)
        keep2[ones[~mask]] = False
        starts, ends = starts[keep2], ends[keep2]
    return np.stack([starts, ends], axis=1).astype(np.int64)


def index_file(data_path: Path) -> np.ndarray:
    """Return an ``(n, 2)`` int64 array of [start, end) byte ranges of non-blank lines."""
    size = data_path.stat().st_size
    newlines: list[np.ndarray] = []
    with open(data_path, "rb") as f:
        base = 0
        while block := f.read(BLOCK):
            arr = np.frombuffer(block, dtype=np.uint8)
            newlines.append(np.flatnonzero(arr == 10).astype(np.int64) + base)
            base += len(block)
    nl = np.concatenate(newlines) if newlines else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [size]])
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    ones = np.flatnonzero(ends - starts == 1)
    if len(ones):
        with open(data_path, "rb") as f:
            drop = []
            for i in ones.tolist():
                f.seek(int(starts[i]))
                if f.read(1) == b"\r":
                    drop.append(i)
        if drop:
            mask = np.ones(len(starts), dtype=bool)
            mask[drop] = False
            starts, ends = starts[mask], ends[mask]
    return np.stack([starts, ends], axis=1).astype(np.int64)


class LineCounter:
    """A file-like sink that finds record byte ranges in a stream (as :func:`index_file`)."""

    def __init__(self) -> None:
        self.size = 0
        self.newlines: list[np.ndarray] = []
        self.cr_before: list[np.ndarray] = []  # per newline: the byte before it is "\r"
        self.last = -1

    def write(self, block: bytes) -> int:
        """Take the next bytes of the stream."""
        arr = np.frombuffer(block, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        before = np.where(nl > 0, arr[np.maximum(nl - 1, 0)], self.last)
        self.newlines.append(nl.astype(np.int64) + self.size)
        self.cr_before.append(before == 13)
        if len(arr):
            self.last = int(arr[-1])
            self.size += len(arr)
        return len(block)

    def index(self) -> np.ndarray:
        """``(n, 2)`` start and end offsets of the non-blank lines."""
        nl = np.concatenate(self.newlines) if self.newlines else np.zeros(0, np.int64)
        cr = np.concatenate(self.cr_before) if self.cr_before else np.zeros(0, bool)
        starts = np.concatenate([[0], nl + 1])
        ends = np.concatenate([nl, [self.size]])
        # A line is "\r" alone when it is one byte long and that byte is "\r".
        lone_cr = np.concatenate([cr, [self.last == 13]]) & (ends - starts == 1)
        keep = (ends > starts) & ~lone_cr
        return np.stack([starts[keep], ends[keep]], axis=1).astype(np.int64)
