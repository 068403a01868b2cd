"""``zephon digest-dump``: digest the batches a job dumped, as ``zephon digest`` prints them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zephon_nodes.verification.dump import dump_digests

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "digest-dump",
        help="print the digest of every step of a batch dump (JSON lines, like digest)",
        description=(
            "Read a batch dump (step-SSSSSSSS.npz files written by zephon digest "
            "--dump-batches, or step-SSSSSSSS.rank-RRRRR.npz files written by the TorchTitan "
            'loader\'s dump_batches) and print {"step": t, "digest": "<sha256>"} per step, '
            "the lines zephon digest prints for the same batches."
        ),
    )
    p.add_argument("folder", help="the dump folder")
    p.set_defaults(run=__name__)


def run(args: argparse.Namespace) -> int:
    """Run ``zephon digest-dump``."""
    for step, digest in dump_digests(args.folder).items():
        print(json.dumps({"step": step, "digest": digest}), flush=True)
    return 0
