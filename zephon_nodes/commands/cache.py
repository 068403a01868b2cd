"""``zephon cache``: show or clear the token cache; the ``--token-cache`` flags of commands."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.settings import Settings, current
from zephon_nodes.io.nodecache.tokenstore import (
    DEFAULT_LIMIT,
    clear,
    default_root,
    set_token_cache,
    shared_location,
    token_cache_settings,
)

__all__ = ["add_parser", "add_token_cache_args", "settings_from_args", "run"]


def add_token_cache_args(p: argparse.ArgumentParser) -> None:
    """Add ``--token-cache on|off|URI`` and ``--token-cache-limit SIZE`` to a command."""
    p.add_argument(
        "--token-cache",
        default=None,
        metavar="on|off|URI",
        help="reuse tokenized work items across runs (default: $ZEPHON_TOKEN_CACHE, else off); "
        "a URI (s3://, gs://, az://, a shared folder) turns it on with a cache shared by a "
        "cluster behind this node's ($ZEPHON_TOKEN_CACHE_SHARED); never changes a digest",
    )
    p.add_argument(
        "--token-cache-limit",
        default=None,
        metavar="SIZE",
        help=f"token cache size, e.g. 16G (default: $ZEPHON_TOKEN_CACHE_LIMIT, else "
        f"{DEFAULT_LIMIT})",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The current settings with a command's ``--cache-limit`` and token cache flags applied.

    Raises:
        RecipeError: A limit is not a byte size.
    """
    settings = current()
    for flag, field, value in (
        ("--cache-limit", "cache_limit", vars(args).get("cache_limit")),
        ("--token-cache", "token_cache", args.token_cache),
        ("--token-cache-limit", "token_cache_limit", args.token_cache_limit),
    ):
        if value is None:
            continue
        try:
            settings = settings.replace(**{field: value})
        except RecipeError as e:  # name the flag the user gave, not the Settings field
            raise RecipeError(str(e).replace(f"Settings.{field}=", f"{flag}=")) from None
    return settings


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "cache",
        help="show or clear the token cache",
        description=(
            "Show the token cache of this node ($ZEPHON_CACHE_DIR/tokens): its entries, bytes "
            "and limit, and the folder shared by the cluster behind it "
            "($ZEPHON_TOKEN_CACHE_SHARED) if any; or clear it (entries in use by a running job "
            "are kept; a shared folder is never cleared from here)."
        ),
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("show", "clear"),
        default="show",
        help="show the cache's entries, bytes and limit, or clear it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--token-cache-limit", default=None, metavar="SIZE", help="limit to report")
    p.set_defaults(run=__name__)


def _usage() -> tuple[int, int]:
    data = default_root() / "data"
    n = total = 0
    if data.is_dir():
        for e in data.iterdir():
            try:
                total += e.stat().st_size
                n += 1
            except FileNotFoundError:
                continue
    return n, total


def run(args: argparse.Namespace) -> int:
    """Run ``zephon cache``."""
    if args.token_cache_limit is not None:
        set_token_cache(None, args.token_cache_limit)
    enabled, limit = token_cache_settings()
    root = default_root()
    removed = 0
    if args.action == "clear":
        try:
            removed = clear(root)
        except OSError as e:
            raise RecipeError(f"cannot clear the token cache {root}: {e}") from None
    entries, used = _usage()
    out = {
        "directory": str(root),
        "enabled": enabled,
        "entries": entries,
        "bytes": used,
        "limit_bytes": limit,
        "shared": shared_location(),  # a folder shared by the cluster behind it, or None
    }
    if args.action == "clear":
        out["removed"] = removed
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    state = "on" if enabled else "off"
    shared = f", in front of the shared {out['shared']}" if out["shared"] else ""
    print(
        f"token cache {root} ({state}{shared}): {entries} entries, {used} bytes of a {limit} "
        "byte limit" + (f"; removed {removed}" if args.action == "clear" else "")
    )
    return 0
