"""``zephon index``: read each shard once and write the dataset index next to the shards."""

from __future__ import annotations

import argparse
import os
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.progress import Progress
from zephon_nodes.io.index.index import EVERY, INDEX_NAME, build_index, write_index
from zephon_nodes.io.storage import storage

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "index",
        help="build the dataset index (record counts, offsets, checksums) of shard files",
        description=(
            "Read each shard matched by the patterns once (in parallel, with a progress bar) "
            f"and write a JSON dataset index ({INDEX_NAME}) in the shards' common directory, "
            "or at --output. A pipeline over indexed shards starts without reading any shard. "
            "Patterns may be local paths or storage URIs (s3://, gs://, az://, hf://, "
            "http(s):// single files, file://); over http(s):// URLs --output is required "
            "(a web server cannot be written to)."
        ),
    )
    p.add_argument("patterns", nargs="+", metavar="PATTERN", help="glob patterns or URIs")
    p.add_argument(
        "--output", default=None, help=f"where to write the index (default: DIR/{INDEX_NAME})"
    )
    p.add_argument(
        "--every", type=int, default=EVERY, help="keep the offset of every k-th jsonl record"
    )
    p.add_argument("--jobs", "-j", type=int, default=8, help="shards read at once (default 8)")
    # --workers / --num-workers mean pool workers per rank in every other command.
    p.add_argument("--workers", "--num-workers", dest="old_workers", help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=__name__)


def run(args: argparse.Namespace) -> int:
    """Build and write the index; print where it went and what it holds."""
    if not 1 <= args.every <= 1 << 20:
        raise RecipeError(f"--every={args.every} must be in [1, 1048576]")
    if args.old_workers is not None:
        raise RecipeError(
            f"zephon index --workers={args.old_workers}: the shards read at once are --jobs "
            "(-j) now; --workers / --num-workers mean pool workers per rank in the other "
            "commands"
        )
    if not 1 <= args.jobs <= 256:
        raise RecipeError(f"--jobs={args.jobs} must be in [1, 256]")
    web = [p for p in args.patterns if storage.scheme(p) in ("http", "https")]
    if web and args.output is None:
        raise RecipeError(
            f"zephon index over http(s):// URLs ({storage.redact(web[0])}) needs --output "
            "FILE: a web server cannot be written to (nor listed: name each shard's URL); "
            'then set the dataset\'s index = "FILE"'
        )
    if args.output is not None:
        _check_output(args.output)
    bar = Progress(None, "indexing shards", "shard", disable=args.quiet)
    try:
        directory, manifest = build_index(
            args.patterns, every=args.every, workers=args.jobs, progress=bar.update
        )
    finally:
        bar.close()
    if args.output is not None:
        location = args.output
    elif storage.is_remote(directory):
        location = directory.rstrip("/") + "/" + INDEX_NAME
    else:
        location = os.path.join(directory, INDEX_NAME)
    write_index(manifest, location, directory)
    shards = manifest["shards"]
    records = sum(int(e["records"]) for e in shards.values())
    size = sum(int(e["bytes"]) for e in shards.values())
    print(
        f"{storage.redact(location)}: {len(shards)} shard(s), {records:,} records, {size:,} bytes"
    )
    return 0


def _check_output(output: str) -> None:
    """Refuse a local ``--output`` that cannot be written, before any shard is read.

    Missing folders are made when the index is written, so the nearest existing one must be
    a writable folder.

    Raises:
        RecipeError: If the output is a folder, or the folder it would be made in is a file
            or not writable.
    """
    if storage.is_remote(output):
        return  # an object store is checked when the index is written
    path = os.path.abspath(storage.local_path(output))
    if os.path.isdir(path):
        raise RecipeError(f"--output {output}: is a folder; name the index file (.../{INDEX_NAME})")
    folder = os.path.dirname(path)
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise RecipeError(f"--output {output}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise RecipeError(f"--output {output}: the folder {folder} is not writable")
