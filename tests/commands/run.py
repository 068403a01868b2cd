"""Run a ``zephon`` subcommand: in-process, with the error handling of ``cli.main``
(:func:`zephon`), or in a process of its own as a user runs it (:func:`zephon_process`)."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zephon_nodes import cli
from zephon_nodes.core.errors import ZephonError

REPO = Path(__file__).resolve().parents[2]


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


def zephon_process(
    *argv: object,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
    timeout: float = 300,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m zephon_nodes.cli ARGV...`` in a new process and wait for it.

    The repository is on its ``PYTHONPATH`` and ``env`` is added to this process's
    environment; stdout and stderr are captured as text unless ``popen`` says otherwise
    (``capture_output=False`` with ``stdout=...``).

    Args:
        argv: The subcommand and its arguments (each passed as ``str``).
        cwd: Where it runs (None: here).
        env: Variables set for it on top of this process's environment.
        check: Raise :class:`subprocess.CalledProcessError` on a non-zero status.
        timeout: Seconds it may run.
        popen: More :func:`subprocess.run` arguments.
    """
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "zephon_nodes.cli", *map(str, argv)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        text=True,
        timeout=timeout,
        check=check,
        **{"capture_output": True, **popen},
    )
