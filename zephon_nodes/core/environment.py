"""The environment variables of the physical settings, and how their text is read.

:data:`ENVIRONMENT` lists every variable :meth:`Settings.from_env
<zephon_nodes.core.settings.Settings.from_env>` reads (the only reader of the environment
in the package, in :mod:`zephon_nodes.core.settings`): the field each sets, how its text is
parsed and what it expects, in words for errors and for docs/cli.md's table. The parsers
(:func:`parse_size`, :func:`parse_limit`, :func:`parse_bool`) also read the CLI flags and
the API's text values (``"50G"``, ``"auto"``, ``"on"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.errors import RecipeError

__all__ = ["ENVIRONMENT", "EnvVar", "is_location", "parse_bool", "parse_limit", "parse_size"]


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``"50G"``, ``"512MiB"``, ``"1.5GB"`` or ``1000``.

    Suffixes K, M, G, T (with or without ``B``/``iB``) are powers of 1024.

    Raises:
        ValueError: ``text`` is not a size.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a byte size such as 512M or 50G, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a byte size must be >= 0, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if m is None:
        raise ValueError(f"expected a byte size such as 512M or 50G, got {text!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def parse_limit(text: str | int, name: str) -> int | None:
    """A node-cache limit: a byte size, or ``"auto"`` / empty for the default (None).

    Raises:
        RecipeError: ``text`` is not a size, naming ``name``.
    """
    if isinstance(text, str) and text.strip().lower() in ("", "auto"):
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise RecipeError(f"{name}={text!r}: {e} (or 'auto' for the default)") from None


def is_location(text: str) -> bool:
    """Whether a switch's text is a location instead (``s3://...``, ``/shared/tokens``)."""
    low = text.strip()
    return "://" in low or low.startswith(("/", "./", "~"))


def parse_bool(text: str) -> bool:
    """Parse a switch: 1/0, true/false, yes/no, on/off (empty: off).

    Raises:
        ValueError: ``text`` is not a switch (the exception names it).
    """
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(repr(text))


def _number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text.strip())
        except ValueError:
            raise ValueError(repr(text)) from None

    return parse


def _size(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return parse_size(text)
    except ValueError:
        raise ValueError(repr(text)) from None


def _byte_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError:
        raise ValueError(repr(text)) from None


def _policy(text: str) -> str:
    if text.strip() not in ("belady", "lru"):
        raise ValueError(repr(text))
    return text.strip()


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: the field it sets, how it is read and what it expects.

    Attributes:
        name: The variable.
        field: The :class:`~zephon_nodes.core.settings.Settings` field.
        parse: Text to value (raises ValueError with the text).
        expects: What the value should be, in words (for errors and docs).
        default: The default, in words (for docs).
        empty_is_unset: An empty value means unset.
    """

    name: str
    field: str
    parse: Callable[[str], Any]
    expects: str
    default: str
    empty_is_unset: bool = True


ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar("ZEPHON_CACHE_DIR", "cache_dir", str, "a directory", "~/.cache/zephon_nodes"),
    EnvVar(
        "ZEPHON_CACHE_LIMIT",
        "cache_limit",
        _size,
        "a byte size such as 512M or 50G, or 'auto'",
        "auto: min(50% of free space, 100 GiB)",
    ),
    EnvVar("ZEPHON_CACHE_POLICY", "cache_policy", _policy, "'belady' or 'lru'", "belady"),
    EnvVar("ZEPHON_CACHE_PREFETCH", "cache_prefetch", _number(int), "an integer", "4"),
    EnvVar("ZEPHON_READ_CACHE_MB", "read_cache_mb", _number(float), "megabytes", "128"),
    EnvVar("ZEPHON_STORAGE_RETRY_S", "storage_retry_s", _number(float), "seconds", "120"),
    EnvVar("ZEPHON_STORAGE_BACKOFF_MAX_S", "storage_backoff_max_s", _number(float), "seconds", "5"),
    EnvVar("ZEPHON_SHM_ARENA_MB", "shm_arena_mb", _number(float), "megabytes", "32"),
    EnvVar("ZEPHON_VERIFY_DATA", "verify_data", parse_bool, "1/0 (true/false, yes/no)", "0"),
    EnvVar("ZEPHON_IMMUTABLE_DATA", "immutable_data", parse_bool, "1/0 (true/false, yes/no)", "0"),
    EnvVar(
        "ZEPHON_NO_INDEX", "use_index", lambda t: not parse_bool(t), "1/0 (true/false, yes/no)", "0"
    ),
    EnvVar("ZEPHON_RAY_MAX_RETRIES", "ray_max_retries", _number(int), "an integer", "3"),
    EnvVar("RAY_ADDRESS", "ray_address", str, "a Ray address", "none: a local cluster"),
    EnvVar("STORAGE_EMULATOR_HOST", "gcs_emulator_host", str, "a host:port URL", "none"),
    EnvVar(
        "ZEPHON_TOKEN_CACHE", "token_cache", parse_bool, "'on' or 'off' (1/0, true/false)", "off"
    ),
    EnvVar(
        "ZEPHON_ITEM_SIZES",
        "item_sizes",
        parse_bool,
        "'on' or 'off' (1/0, true/false)",
        "on",
    ),
    EnvVar(
        "ZEPHON_TOKEN_CACHE_SHARED",
        "token_cache_shared",
        str,
        "a storage URI (s3://, gs://, az://) or a folder on a shared mount",
        "none: node-local only",
    ),
    EnvVar(
        "ZEPHON_TOKEN_CACHE_LIMIT",
        "token_cache_limit",
        _byte_size,
        "a byte size such as 16G",
        "16G",
    ),
)
"""Every environment variable :meth:`~zephon_nodes.core.settings.Settings.from_env` reads."""
