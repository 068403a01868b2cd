"""The ``zephon`` command line: one subcommand per module in ``zephon_nodes.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from zephon_nodes.core.errors import ZephonError
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["main"]

# Subcommand name -> module in zephon_nodes.commands exposing add_parser(subparsers).
COMMANDS = {
    "digest": "digest",
    "demo": "demo",
    "verify": "verify",
    "inspect": "inspect",
    "lanes": "lanes",
    "stats": "stats",
    "digest-dump": "digest_dump",
    "explain": "explain",
    "index": "index",
    "recompress": "recompress",
    "relane": "relane",
    "cache": "cache",
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit 2), never a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def check_flags(args: argparse.Namespace) -> None:
    """Check every numeric flag against its row in the settings table (by its ``dest``).

    Raises:
        RecipeError: Naming the flag, its value and the allowed range.
    """
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            check_setting("--" + dest.replace("_", "-"), value)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    parser = _Parser(
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
        check_flags(args)
        return int(args.func(args) or 0)
    except ZephonError as e:
        from zephon_nodes.io.storage.storage import redact

        print(f"zephon {args.command}: error: {redact(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
