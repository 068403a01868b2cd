"""Error types raised by zephon-nodes.

Every error the library raises on purpose derives from :class:`ZephonError`, so callers (and
fuzz tests) can tell a refused input from a bug.
"""

from __future__ import annotations

__all__ = [
    "classify_file_error",
    "CheckpointError",
    "DataError",
    "RecipeError",
    "WorkerError",
    "ZephonError",
]


class ZephonError(Exception):
    """Base class of all errors raised on purpose by zephon-nodes."""


class RecipeError(ZephonError):
    """A recipe is invalid, or a physical setting does not fit the recipe."""


class DataError(ZephonError):
    """A data file or record cannot be read; the message names the file and line/record."""


class CheckpointError(ZephonError):
    """A checkpoint state cannot be loaded; the message says what is wrong."""


class WorkerError(ZephonError):
    """An operator failed, crashed or timed out on a worker."""


def classify_file_error(message: str, path: str = "") -> str:
    """Return the skip reason of a file-level :class:`DataError` message about ``path``."""
    text = message.replace(path, "").lower() if path else message.lower()
    if "changed since it was indexed" in text:
        return "changed_file"
    if "unreadable parquet" in text:  # before "not found": pyarrow says "magic bytes not found"
        return "unreadable_parquet"
    if "not found" in text or "no such file" in text:
        return "missing_file"
    if "truncated" in text:
        return "truncated_file"
    if "zstd" in text:
        return "corrupt_zstd"
    if "parquet" in text:
        return "unreadable_parquet"
    if "arrow file" in text:
        return "unreadable_arrow"
    if "empty" in text:
        return "empty_file"
    return "unreadable_file"
