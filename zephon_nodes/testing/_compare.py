"""Deep equality for operator outputs (arrays, tensors, dataclasses, containers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["difference", "short"]


def difference(a: Any, b: Any, path: str = "", strict: bool = False) -> str | None:
    """Return where ``a`` and ``b`` first differ (e.g. ``[3]['input']: ...``), or None.

    With ``strict``, containers must also have the same type (a tuple is not a list).
    """
    where = path or "value"
    if strict and type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    for kind, compare in _ARRAYS:
        if isinstance(a, kind) or isinstance(b, kind):
            if not (isinstance(a, kind) and isinstance(b, kind)):
                return f"{where}: {type(a).__name__} vs {type(b).__name__}"
            return compare(a, b, where)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return _dataclass_difference(a, b, path, strict)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _mapping_difference(a, b, path, strict)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return _sequence_difference(a, b, path, strict)
    if type(a) is not type(b) or a != b:
        return f"{where}: {short(a)} vs {short(b)}"
    return None


def _tensor_difference(a: torch.Tensor, b: torch.Tensor, where: str) -> str | None:
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        return f"{where}: tensor {short(a)} vs {short(b)}"
    return None


def _array_difference(a: np.ndarray, b: np.ndarray, where: str) -> str | None:
    if a.shape != b.shape or not np.array_equal(a, b):
        return f"{where}: array {short(a)} vs {short(b)}"
    return None


# Leaf array types, each compared whole; a value of one type against another is a difference.
_ARRAYS: tuple[tuple[type, Callable[[Any, Any, str], str | None]], ...] = (
    (torch.Tensor, _tensor_difference),
    (np.ndarray, _array_difference),
)


def _dataclass_difference(a: Any, b: Any, path: str, strict: bool) -> str | None:
    if type(a) is not type(b):
        return f"{path or 'value'}: {type(a).__name__} vs {type(b).__name__}"
    for f in dataclasses.fields(a):
        d = difference(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", strict)
        if d:
            return d
    return None


def _mapping_difference(a: Mapping, b: Mapping, path: str, strict: bool) -> str | None:
    if set(a) != set(b):
        return f"{path or 'value'}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
    for k in a:
        d = difference(a[k], b[k], f"{path}[{k!r}]", strict)
        if d:
            return d
    return None


def _sequence_difference(a: Sequence, b: Sequence, path: str, strict: bool) -> str | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        d = difference(x, y, f"{path}[{i}]", strict)
        if d:
            return d
    if len(a) != len(b):
        return f"{path or 'value'}: {len(a)} items vs {len(b)} items"
    return None


def short(x: Any, limit: int = 80) -> str:
    """A one-line, length-limited repr."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        x = x.tolist()
    text = repr(x).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
