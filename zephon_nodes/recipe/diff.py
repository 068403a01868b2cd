"""The fields that differ between two canonical recipe descriptions (a resume's refusal)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["diff_canonical"]


def diff_canonical(expected: Any, got: Any, prefix: str = "") -> list[str]:
    """List the fields that differ between two canonical recipe descriptions.

    Args:
        expected: Canonical dict of the recipe the checkpoint was written with.
        got: Canonical dict of the recipe now in use.
        prefix: Dotted path prefix for nested fields.

    Returns:
        Lines such as ``"seq_len: checkpoint has 128, recipe has 256"``.
    """
    if isinstance(expected, Mapping) and isinstance(got, Mapping):
        out: list[str] = []
        for key in sorted(set(expected) | set(got)):
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in expected:
                out.append(f"{name}: only in the recipe ({got[key]!r})")
            elif key not in got:
                out.append(f"{name}: only in the checkpoint ({expected[key]!r})")
            else:
                out.extend(diff_canonical(expected[key], got[key], name))
        return out
    if (
        isinstance(expected, Sequence)
        and isinstance(got, Sequence)
        and not isinstance(expected, str)
        and not isinstance(got, str)
        and len(expected) == len(got)
    ):
        out = []
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            out.extend(diff_canonical(a, b, f"{prefix}[{i}]"))
        return out
    if expected != got:
        return [f"{prefix}: checkpoint has {_short(expected)}, recipe has {_short(got)}"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."
