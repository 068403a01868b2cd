"""Run a ``zephon`` subcommand in-process, with the error handling of ``cli.main``."""

from __future__ import annotations

import argparse
import importlib

from zephon_nodes import cli
from zephon_nodes.core.errors import ZephonError


def zephon(*argv: str) -> int:
    """Run ``zephon ARGV...`` and return its exit status.

    Only the named subcommand's module is imported (``cli.main`` imports them all), so these
    tests do not depend on other commands.
    """
    parser = argparse.ArgumentParser(prog="zephon")
    sub = parser.add_subparsers(dest="command", required=True)
    importlib.import_module(f"zephon_nodes.commands.{cli.COMMANDS[argv[0]][0]}").add_parser(sub)
    args = parser.parse_args(list(argv))
    try:
        return cli.run_command(args)
    except ZephonError as e:
        print(f"zephon {args.command}: error: {e}")
        return 2
