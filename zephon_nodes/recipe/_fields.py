"""Typed access to one TOML table of a recipe, reporting unknown keys."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.recipe.bounds import SETTINGS, check_setting, unknown_keys

__all__ = ["_Fields"]


class _Fields:
    """Typed access to one TOML table that reports unknown keys.

    Every value read is checked: its type, NaN and infinities for any number, and the
    range of :data:`~zephon_nodes.recipe.bounds.SETTINGS` under ``<table>.<key>``; an
    unknown key is named with the closest known one.
    """

    def __init__(self, data: Any, where: str, table: str = "") -> None:
        if not isinstance(data, Mapping):
            raise RecipeError(f"{where} must be a table, got {type(data).__name__}")
        self.data = data
        self.where = where
        self.table_name = table
        self.used: set[str] = set()

    def raw(self, key: str, typ: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(key)
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) and typ is not bool and bool not in _as_tuple(typ):
            raise RecipeError(f"{self.where}.{key}={value!r} must be {_type_names(typ)}")
        if not isinstance(value, typ):
            raise RecipeError(
                f"{self.where}.{key}={value!r} must be {_type_names(typ)}, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{self.where}.{key}={value!r} must be a finite number")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row = f"{self.table_name}.{key}" if self.table_name else key
            if row in SETTINGS:
                check_setting(f"{self.where}.{key}", value, bound=SETTINGS[row])
        return value

    def get(self, key: str, typ: type | tuple[type, ...], default: Any) -> Any:
        return self.raw(key, typ, default)

    def table(self, key: str) -> _Fields:
        self.used.add(key)
        top = not self.table_name and self.where.endswith("recipe")
        where = self.where.removesuffix("recipe") + key if top else f"{self.where}.{key}"
        return _Fields(self.data.get(key, {}), where, key)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise RecipeError(unknown_keys(self.where, unknown, self.used))


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def _type_names(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(typ))
