"""Checks of plain (JSON) values read from untrusted input: checkpoints, recipes."""

from __future__ import annotations

from typing import Any

__all__ = ["is_int"]


def is_int(x: Any) -> bool:
    """Whether ``x`` is an integer (JSON's ``true``/``false`` are not: Python's bools are)."""
    return isinstance(x, int) and not isinstance(x, bool)
