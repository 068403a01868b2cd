"""Upgrade what older versions wrote to the current schema (:data:`~.schema.FORMAT`).

Every form that zephon-nodes wrote and that still loads goes through :func:`upgrade`:

- a state of the current format (``zephon-nodes/1``): returned as is;
- a whole ``torchdata.nodes.Loader`` state holding one (saved by ``save_state`` before the
  library state was taken out of it): the library state inside it
  (:func:`~zephon_nodes.state.locate.unwrap_state`);
- files written before checksums existed (a plain-JSON state, loaded with
  ``allow_unchecked=True``; rank files and commit markers vouched for by the marker's
  SHA-256s) are read by the codec (:mod:`zephon_nodes.state.codec`) and then upgraded here
  like any other.

A later schema version adds its step to :data:`MIGRATIONS` (``{old format: function to the
next}``); a state of a version this library does not know, newer or not, is refused naming
the version, never misread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.locate import unwrap_state
from zephon_nodes.state.schema import FORMAT, FORMAT_KEY, FORMAT_PREFIX, SCHEMA_VERSION

__all__ = ["MIGRATIONS", "upgrade"]

MIGRATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""``{format: upgrade to the next version}``; empty while version 1 is the only one."""


def upgrade(state: Any, where: str | os.PathLike[str] = "checkpoint") -> dict[str, Any]:
    """Return ``state`` in the current schema (a new dict; ``state`` is not modified).

    Raises:
        CheckpointError: Naming ``where`` and the format that cannot be read.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: a state must be a JSON object, got {type(state).__name__}")
    if FORMAT_KEY not in state:
        try:
            return unwrap_state(state)
        except CheckpointError as e:
            raise CheckpointError(f"{where}: {e}") from None
    out = dict(state)
    seen = 0
    while isinstance(out.get(FORMAT_KEY), str) and seen <= len(MIGRATIONS):
        step = MIGRATIONS.get(out[FORMAT_KEY])
        if step is None:
            break
        out = step(out)
        seen += 1
    fmt = out.get(FORMAT_KEY)
    if fmt != FORMAT and isinstance(fmt, str) and fmt.startswith(FORMAT_PREFIX):
        version = fmt[len(FORMAT_PREFIX) :]
        if version.isdigit() and int(version) > SCHEMA_VERSION:
            raise CheckpointError(
                f"{where}: the state has format {fmt!r}, written by a newer zephon-nodes; "
                f"this version reads {FORMAT!r} and older"
            )
    return out
