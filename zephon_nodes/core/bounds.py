"""The type and range of a numeric setting, and the bounds of the physical settings.

:class:`Bound` is the row type of the one bounds table
(:data:`zephon_nodes.recipe.bounds.SETTINGS`); the rows of physical settings (pools, the
node cache, storage retries, ...) live here, in the bottom layer, so that
:mod:`zephon_nodes.core.settings` checks the environment with the same rows the recipe
table re-uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PHYSICAL", "Bound"]


@dataclass(frozen=True)
class Bound:
    """Type and range of one numeric setting.

    Args:
        kind: ``int`` (a bool or a float such as ``2.0`` is refused) or ``float`` (an int is
            accepted; NaN and infinities never are).
        lo: Smallest allowed value.
        hi: Largest allowed value.
        lo_open: ``lo`` itself is not allowed (``weight > 0``).
        note: Why the bound exists, appended to the error.
    """

    kind: type
    lo: float
    hi: float
    lo_open: bool = False
    note: str = ""

    def describe(self) -> str:
        """The allowed range in words, e.g. ``an integer in [1, 65536]``."""
        noun = "an integer" if self.kind is int else "a finite number"
        left = "(" if self.lo_open else "["
        return f"{noun} in {left}{_num(self.lo)}, {_num(self.hi)}]"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused (``must be <range>[, got <type>]``), or None if it fits."""
        ok_type = isinstance(value, (int, float)) if self.kind is float else isinstance(value, int)
        if isinstance(value, bool) or not ok_type:
            return f"must be {self.describe()}, got {type(value).__name__}" + self.suffix()
        if (
            (isinstance(value, float) and not math.isfinite(value))
            or value < self.lo
            or (self.lo_open and value == self.lo)
            or value > self.hi
        ):
            return f"must be {self.describe()}" + self.suffix()
        return None

    def suffix(self) -> str:
        """The note as the error's tail: `` (why)`` or nothing."""
        return f" ({self.note})" if self.note else ""


def _num(x: float) -> str:
    if isinstance(x, float) and abs(x) >= 1e6:
        return f"{x:g}"
    n = int(x)
    if n >= 1 << 16 and n & (n - 1) == 0:
        return f"2**{n.bit_length() - 1}"
    if n >= 1 << 16 and (n + 1) & n == 0:
        return f"2**{n.bit_length()} - 1"
    return str(n) if float(x).is_integer() else str(x)


_LANES = 1 << 16
_ROWS = 1 << 24

PHYSICAL: dict[str, Bound] = {
    # pools and ranks: Python API, CLI flags, TorchTitan config
    "dp_world_size": Bound(int, 1, _LANES, note="at most one rank per lane"),
    "dp_rank": Bound(int, 0, _LANES - 1),
    "local_batch_size": Bound(int, 1, _ROWS),
    "num_workers": Bound(int, 0, 1024),
    "steps": Bound(int, 0, 2**62),
    "save_at": Bound(int, 1, 2**62),
    "at_step": Bound(int, 0, 2**62),
    "lookahead": Bound(int, 1, 1 << 16),
    "prefetch": Bound(int, 0, 1 << 16),
    "worker_timeout_s": Bound(float, 0, 1e7, lo_open=True),
    # the process's physical settings (zephon_nodes.core.settings.Settings)
    "cache_limit": Bound(int, 1, 2**62, note="bytes of the node cache"),
    "cache_prefetch": Bound(int, 0, 1 << 16, note="shards fetched ahead of use"),
    "cache_free_bytes": Bound(int, 0, 2**62),
    "read_cache_mb": Bound(float, 0, 1e7, note="megabytes of remote blocks kept per process"),
    "storage_retry_s": Bound(float, 0, 1e7, note="seconds of retrying transient errors"),
    "storage_backoff_max_s": Bound(float, 0, 1e7, note="longest single backoff, in seconds"),
    "shm_arena_mb": Bound(float, 0, 1 << 20, note="megabytes per process worker"),
    "ray_max_retries": Bound(int, 0, 1000, note="re-runs of a task whose worker was lost"),
    "token_cache_limit": Bound(int, 0, 2**62, note="bytes of the token cache"),
    # the checkpoint's room (TorchTitan config; fixed-shape DCP tensors are allocated to it)
    "max_decisions": Bound(
        int, -1, 1 << 16, note="set_mixture decisions the checkpoint holds; -1: automatic"
    ),
    "relane_from": Bound(int, 0, _LANES, note="the lane count of the checkpoint; 0: none"),
    "max_lineage_bytes": Bound(int, 0, 1 << 24, note="about 12 bytes per old lane"),
    "max_stage_bytes": Bound(int, 1, 1 << 24, note="about 40 bytes per dataset"),
    "max_stage_datasets": Bound(int, 1, 1 << 12, note="8 bytes per dataset and lane"),
}
"""Bounds of the physical settings (never part of a fingerprint), by setting name."""
