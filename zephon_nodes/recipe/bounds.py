"""Allowed ranges of every numeric setting, and the "did you mean" of unknown keys.

One table, :data:`SETTINGS`, gives the type and range of each numeric setting by its dotted
name (``seq_len``, ``work.chunk_size``, ``datasets.weight``, CLI flags such as
``--dp-world-size``). The recipe's TOML reader, its dataclasses, the CLI, the Python API
(:meth:`~zephon_nodes.Pipeline.rank_node`, :func:`~zephon_nodes.simulate`) and the TorchTitan
config all check values with :func:`check_setting`, so each setting is refused the same way
wherever it comes from: a :class:`~zephon_nodes.core.errors.RecipeError` naming the setting, the
value and the allowed range. A new setting gets the same treatment by adding one row.

Upper bounds are far beyond any real job and only stop absurd sizes (``seq_len =
100000000000``) before they become an out-of-memory crash or an hour of silent work.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from zephon_nodes.core.bounds import PHYSICAL, Bound
from zephon_nodes.core.errors import RecipeError

__all__ = [
    "MAX_SHOWN_KEY",
    "SETTINGS",
    "Bound",
    "check_setting",
    "did_you_mean",
    "shown_key",
    "unknown_keys",
]


_LANES = 1 << 16
_ROWS = 1 << 24
_TOKENS = 1 << 24

SETTINGS: dict[str, Bound] = {
    # recipe, top level
    "seed": Bound(int, 0, 2**63 - 1),
    "num_lanes": Bound(int, 1, _LANES, note="every lane has its own operator chain and buffers"),
    "global_batch_size": Bound(int, 1, _ROWS),
    "seq_len": Bound(int, 1, _TOKENS, note="tokens per sample"),
    "flush_every": Bound(int, 1, 1 << 20),
    # [work], [[datasets]], [shuffle], [pack], [mixture]
    "work.chunk_size": Bound(int, 1, 1 << 24),
    "work.epochs": Bound(int, 1, 1 << 31),
    "datasets.weight": Bound(float, 0, 1e12, lo_open=True),
    "datasets.chunk_size": Bound(int, 1, 1 << 24),
    "shuffle.buffer_size": Bound(int, 0, 1 << 24, note="samples held per lane"),
    "pack.pad_id": Bound(int, 0, 2**31 - 1, note="a token id of the tokenizer's vocabulary"),
    "pack.bins": Bound(int, 1, 1 << 16),
    "mixture.estimate_records": Bound(int, 1, 1 << 24),
    "mixture.tokens_per_record": Bound(float, 0, 1e12, lo_open=True),
    "mixture.weights.at": Bound(float, 0, 1e18),
    "mixture.weights.weight": Bound(float, 0, 1e12),
    # [image]
    "image.patch_size": Bound(int, 1, 1 << 12),
    "image.max_patches": Bound(int, 1, 1 << 20),
    "image.merge": Bound(int, 1, 1 << 6),
    "image.max_images": Bound(int, 1, 1 << 16),
    "image.max_pixels": Bound(int, 1, 1 << 31),
    "image.placeholder_id": Bound(int, 0, 2**31 - 1),
    # physical settings: Python API, CLI flags, TorchTitan config, the environment
    **PHYSICAL,
    # CLI spellings of recipe settings (``zephon lanes``)
    "global_batch": Bound(int, 1, _ROWS),
    "chunk_size": Bound(int, 1, 1 << 24),
}


def check_setting(name: str, value: Any, *, where: str = "", bound: Bound | None = None) -> Any:
    """Check ``value`` against the bound of setting ``name`` and return it.

    Args:
        name: The setting's dotted name as a user writes it (``"work.chunk_size"``,
            ``"--dp-world-size"``); its row in :data:`SETTINGS` is looked up without leading
            dashes, with ``-`` read as ``_`` and list indexes (``datasets[2].weight``) removed.
        value: The value to check.
        where: Prefix of the error message (the recipe file, a dataset's name).
        bound: Use this bound instead of the table's.

    Raises:
        RecipeError: ``<where><name>=<value> must be <range>``, naming the type when the
            value has the wrong one. Names absent from the table are not checked.
    """
    b = bound if bound is not None else SETTINGS.get(_key(name))
    if b is None:
        return value
    problem = b.problem(value)
    if problem is not None:
        raise RecipeError(f"{where}{name}={value!r} {problem}")
    return value


def _key(name: str) -> str:

    return re.sub(r"\[[^\]]*\]", "", name.lstrip("-")).replace("-", "_")


MAX_SHOWN_KEY = 64
"""An unknown key longer than this is shortened in messages and gets no suggestion (no known
key is that long, and a fuzzy match over a 10 MB key takes minutes)."""


def shown_key(key: object) -> str:
    """``repr(key)``, shortened to :data:`MAX_SHOWN_KEY` characters with its length named."""
    text = str(key)
    if len(text) <= MAX_SHOWN_KEY:
        return repr(key)
    return f"{text[:MAX_SHOWN_KEY]!r}... ({len(text):,} characters)"


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """Return ``" (did you mean `paths`?)"`` for the known key closest to ``key``, or ``""``."""
    if len(str(key)) > MAX_SHOWN_KEY:
        return ""
    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    if not close and isinstance(key, str):
        close = [k for k in sorted(known) if k.startswith(key) or key.startswith(k)][:1]
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_keys(where: str, unknown: Iterable[object], known: Iterable[str]) -> str:
    """The message refusing ``unknown`` keys of a table.

    At most 8 keys are named, each shortened (:func:`shown_key`); for a single one the
    closest known key is suggested.
    """
    keys = sorted(map(str, unknown))
    names = ", ".join(shown_key(k) for k in keys[:8])
    more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
    hint = did_you_mean(keys[0], known) if len(keys) == 1 else ""
    return f"{where}: unknown key(s) [{names}]{more}{hint}"
