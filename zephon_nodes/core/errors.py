"""Error types raised by zephon-nodes.

Every error the library raises on purpose derives from :class:`ZephonError`, so callers (and
fuzz tests) can tell a refused input from a bug.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "DataError", "RecipeError", "WorkerError", "ZephonError"]


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
