"""Re-compress ``.jsonl`` / ``.jsonl.zst`` shards into many zstd frames.

A shard made of one zstd frame cannot be entered in the middle, so it is decompressed whole
before any of its records is read. Written as frames of about ``frame_bytes`` of text each,
always ending on a record boundary, the same records can be read frame by frame through the
dataset index (see :mod:`zephon_nodes.io.index.index`). The frames of one file concatenated are
still one valid ``.zst`` file for every zstd reader. The records (and so the batches) do not
change; the file's bytes do, so its content checksum and the recipe fingerprint change too:
re-compress before a run starts, not in the middle of one.
"""

from __future__ import annotations

import os
from pathlib import Path

import zstandard

from zephon_nodes.core.errors import CORRUPT_ZSTD, DataError, os_error_kind
from zephon_nodes.io.storage.cache import atomic_write

__all__ = ["recompress_file"]


def recompress_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    frame_bytes: int = 4 << 20,
    level: int = 3,
) -> int:
    """Write the records of ``src`` to ``dst`` as zstd frames; return the frame count.

    Raises:
        DataError: If ``src`` cannot be read or is a corrupt zstd stream, or ``dst`` cannot be
            written.
    """
    source, target = Path(src), Path(dst)
    try:
        with open(source, "rb") as f:
            if source.name.endswith(".zst"):
                reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
                raw = reader.read()
            else:
                raw = f.read()
    except zstandard.ZstdError as e:
        raise DataError(f"{source}: corrupt zstd data: {e}", kind=CORRUPT_ZSTD) from None
    except OSError as e:
        raise DataError(f"{source}: cannot read: {e}", kind=os_error_kind(e)) from None
    cctx = zstandard.ZstdCompressor(level=level)
    frames = []
    start = 0
    while start < len(raw):
        end = raw.find(b"\n", start + frame_bytes - 1)
        end = len(raw) if end < 0 else end + 1
        frames.append(cctx.compress(raw[start:end]))
        start = end
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda f: f.writelines(frames))
    except OSError as e:
        raise DataError(f"{target}: cannot write: {e}") from None
    return len(frames)
