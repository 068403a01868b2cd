"""``zephon recompress``: rewrite shards as many zstd frames, readable in parts."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.io.formats.recompress import recompress_file
from zephon_nodes.io.storage import storage

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    p = sub.add_parser(
        "recompress",
        help="rewrite .jsonl/.jsonl.zst shards as multi-frame .jsonl.zst (readable in parts)",
        description=(
            "Write each local shard's records into OUTPUT_DIR as a .jsonl.zst made of zstd "
            "frames of about --frame-mb MB of text each, ending on record boundaries. With a "
            "dataset index (zephon index), a work item then reads only its frames. The records "
            "do not change; the files' checksums (and so the recipe fingerprint) do."
        ),
    )
    p.add_argument("patterns", nargs="+", metavar="PATTERN", help="local shard glob patterns")
    p.add_argument("--output-dir", required=True, help="folder for the re-compressed shards")
    p.add_argument("--frame-mb", type=float, default=4.0, help="text per frame in MB")
    p.add_argument("--level", type=int, default=3, help="zstd level")
    p.set_defaults(run=__name__)


def run(args: argparse.Namespace) -> int:
    """Re-compress every matched shard; print one line per shard."""
    if not 0.01 <= args.frame_mb <= 4096:
        raise RecipeError(f"--frame-mb={args.frame_mb} must be in [0.01, 4096]")
    if not 1 <= args.level <= 22:
        raise RecipeError(f"--level={args.level} must be in [1, 22]")
    files = []
    for pattern in args.patterns:
        if storage.is_remote(pattern):
            raise RecipeError(f"{storage.redact(pattern)}: recompress reads local files only")
        matches = storage.expand(pattern)
        if not matches:
            raise RecipeError(f"pattern {pattern!r} matches no file")
        files.extend(matches)
    for f, target in _targets(files, Path(args.output_dir)).items():
        n = recompress_file(f, target, int(args.frame_mb * (1 << 20)), args.level)
        print(f"{target}: {n} frame(s)", file=sys.stdout)
    return 0


def _targets(files: list[str], out: Path) -> dict[str, Path]:
    """Each shard's output file in ``out`` (a shard matched twice is written once).

    Raises:
        RecipeError: If two shards would be written to one file (same name in two folders,
            or ``x.jsonl`` beside ``x.jsonl.zst``): the second would replace the first.
    """
    targets: dict[str, Path] = {}
    by_target: dict[Path, str] = {}
    for f in files:
        name = Path(f).name
        target = out / (name if name.endswith(".zst") else name + ".zst")
        seen = by_target.get(target)
        if seen is not None and os.path.realpath(seen) != os.path.realpath(f):
            raise RecipeError(
                f"{seen} and {f} would both be written to {target} (the second would replace "
                "the first): recompress shards of one name into different --output-dir folders"
            )
        by_target[target] = f
        targets.setdefault(f, target)
    return targets
