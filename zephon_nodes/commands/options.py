"""Command-line options that several subcommands share, spelled once.

Light on purpose (no engine import), so that a command's ``--help`` stays fast.
"""

from __future__ import annotations

import argparse

__all__ = ["add_workers_arg"]


def add_workers_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--num-workers`` (alias ``--workers``): pool workers per rank, default 2."""
    p.add_argument(
        "--num-workers",
        "--workers",
        dest="num_workers",
        type=int,
        default=2,
        help="pool workers per rank (default 2; --workers is the same flag)",
    )
