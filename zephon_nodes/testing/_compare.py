"""Deep equality for operator outputs (arrays, tensors, dataclasses, containers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["difference", "short"]


def difference(a: Any, b: Any, path: str = "", strict: bool = False) -> str | None:
    """Return where ``a`` and ``b`` first differ (e.g. ``[3]['input']: ...``), or None.

    With ``strict``, containers must also have the same type (a tuple is not a list).
    """
    if strict and type(a) is not type(b):
        return f"{path or 'value'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path or 'value'}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return f"{path or 'value'}: tensor {short(a)} vs {short(b)}"
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f"{path or 'value'}: {type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape or not np.array_equal(a, b):
            return f"{path or 'value'}: array {short(a)} vs {short(b)}"
        return None
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            return f"{path or 'value'}: {type(a).__name__} vs {type(b).__name__}"
        for f in dataclasses.fields(a):
            d = difference(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", strict)
            if d:
                return d
        return None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return f"{path or 'value'}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            d = difference(a[k], b[k], f"{path}[{k!r}]", strict)
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            d = difference(x, y, f"{path}[{i}]", strict)
            if d:
                return d
        if len(a) != len(b):
            return f"{path or 'value'}: {len(a)} items vs {len(b)} items"
        return None
    if type(a) is not type(b) or a != b:
        return f"{path or 'value'}: {short(a)} vs {short(b)}"
    return None


def short(x: Any, limit: int = 80) -> str:
    """A one-line, length-limited repr."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        x = x.tolist()
    text = repr(x).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
