"""Error types raised by zephon-nodes.

Every error the library raises on purpose derives from :class:`ZephonError`, so callers (and
fuzz tests) can tell a refused input from a bug.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "CHANGED_FILE",
    "CORRUPT_ZSTD",
    "EMPTY_FILE",
    "FILE_ERROR_KINDS",
    "MISSING_FILE",
    "TRUNCATED_FILE",
    "UNREADABLE_ARROW",
    "UNREADABLE_FILE",
    "UNREADABLE_PARQUET",
    "FileErrorKind",
    "classify_file_error",
    "os_error_kind",
    "skip_reason",
    "CheckpointError",
    "DataError",
    "RecipeError",
    "WorkerError",
    "ZephonError",
]


# What is wrong with a whole data file: the skip reason under ``on_error = "skip"`` (counted
# per dataset in ``skipped_files``). A DataError carries its kind as ``kind``.
FileErrorKind = Literal[
    "changed_file",
    "unreadable_parquet",
    "missing_file",
    "truncated_file",
    "corrupt_zstd",
    "unreadable_arrow",
    "empty_file",
    "unreadable_file",
]
CHANGED_FILE: Final = "changed_file"
UNREADABLE_PARQUET: Final = "unreadable_parquet"
MISSING_FILE: Final = "missing_file"
TRUNCATED_FILE: Final = "truncated_file"
CORRUPT_ZSTD: Final = "corrupt_zstd"
UNREADABLE_ARROW: Final = "unreadable_arrow"
EMPTY_FILE: Final = "empty_file"
UNREADABLE_FILE: Final = "unreadable_file"
FILE_ERROR_KINDS: Final[frozenset[str]] = frozenset(
    {
        CHANGED_FILE,
        UNREADABLE_PARQUET,
        MISSING_FILE,
        TRUNCATED_FILE,
        CORRUPT_ZSTD,
        UNREADABLE_ARROW,
        EMPTY_FILE,
        UNREADABLE_FILE,
    }
)


class ZephonError(Exception):
    """Base class of all errors raised on purpose by zephon-nodes."""


class RecipeError(ZephonError):
    """A recipe is invalid, or a physical setting does not fit the recipe."""


class DataError(ZephonError):
    """A data file or record cannot be read; the message names the file and line/record.

    Args:
        kind: What is wrong with the whole file (a :data:`FileErrorKind`), when the error is
            about a file; it, not the message, is the skip reason under ``on_error = "skip"``.
            ``None`` (an error raised by other code): the message is classified instead.
        refused_under_skip: Raise even under ``on_error = "skip"`` (what a skip would leave
            out is not deterministic); default: the class's ``refused_under_skip``.
    """

    refused_under_skip: bool = False

    def __init__(
        self,
        *args: object,
        kind: FileErrorKind | None = None,
        refused_under_skip: bool | None = None,
    ) -> None:
        super().__init__(*args)
        self.kind: FileErrorKind | None = kind
        if refused_under_skip is not None:
            self.refused_under_skip = refused_under_skip


class CheckpointError(ZephonError):
    """A checkpoint state cannot be loaded; the message says what is wrong."""


class WorkerError(ZephonError):
    """An operator failed, crashed or timed out on a worker."""


def os_error_kind(e: OSError) -> FileErrorKind:
    """Return the kind of a file that cannot be read: missing, or unreadable."""
    return MISSING_FILE if isinstance(e, FileNotFoundError) else UNREADABLE_FILE


def skip_reason(e: DataError, path: str = "") -> FileErrorKind:
    """Return the skip reason of a file-level :class:`DataError` about ``path``: its kind.

    An error without a kind (raised by code other than the library's formats) falls back to
    :func:`classify_file_error` of its message.
    """
    return e.kind if e.kind is not None else classify_file_error(str(e), path)


def classify_file_error(message: str, path: str = "") -> FileErrorKind:
    """Return the skip reason of a file-level :class:`DataError` message about ``path``.

    Only the fallback of :func:`skip_reason` for an error without a ``kind``.
    """
    text = message.replace(path, "").lower() if path else message.lower()
    if "changed since it was indexed" in text:
        return CHANGED_FILE
    if "unreadable parquet" in text:  # before "not found": pyarrow says "magic bytes not found"
        return UNREADABLE_PARQUET
    if "not found" in text or "no such file" in text:
        return MISSING_FILE
    if "truncated" in text:
        return TRUNCATED_FILE
    if "zstd" in text:
        return CORRUPT_ZSTD
    if "parquet" in text:
        return UNREADABLE_PARQUET
    if "arrow file" in text:
        return UNREADABLE_ARROW
    if "empty" in text:
        return EMPTY_FILE
    return UNREADABLE_FILE
