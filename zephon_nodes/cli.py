"""The ``zephon`` command line: one subcommand per module in ``zephon_nodes.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from zephon_nodes.errors import ZephonError

__all__ = ["main"]

# Subcommand name -> module in zephon_nodes.commands exposing add_parser(subparsers).
COMMANDS = {
    "digest": "digest",
    "demo": "demo",
    "verify": "verify",
    "inspect": "inspect",
    "lanes": "lanes",
    "stats": "stats",
    "index": "index",
    "recompress": "recompress",
}


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="zephon",
        description="Elastically deterministic training data: digest, verify and inspect recipes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(f"zephon_nodes.commands.{module}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``zephon`` command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ZephonError as e:
        print(f"zephon {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
