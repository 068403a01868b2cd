"""The ``zephon`` command line: one subcommand per module in ``zephon_nodes.commands``.

Only the module of the subcommand being run is imported (the others are listed by name and
help line), so ``zephon --help`` and the commands that need no tensors (``lanes``, ``inspect``,
``index``) start without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from zephon_nodes.core.errors import ZephonError
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["DefaultsFormatter", "main"]

# Subcommand name -> (module in zephon_nodes.commands exposing add_parser(subparsers), the
# help line that module gives it: shown by `zephon --help` without importing the module).
COMMANDS = {
    "digest": ("digest", "simulate N ranks and print one JSON line per global batch"),
    "demo": (
        "demo",
        "run the bundled default recipe at dp 1/2/4, 1/2 workers, and across a resume",
    ),
    "verify": (
        "verify",
        "check that a recipe gives identical global batches under many settings",
    ),
    "inspect": ("inspect", "print a checkpoint's format, fingerprint, step and lane positions"),
    "lanes": ("lanes", "suggest lane counts for the dp sizes you plan to use"),
    "stats": (
        "stats",
        "token shares per dataset, padding and skipped records over the first S steps",
    ),
    "digest-dump": (
        "digest_dump",
        "print the digest of every step of a batch dump (JSON lines, like digest)",
    ),
    "explain": (
        "explain",
        "print what each rank will run: lanes, operators, pools, checkpoint size",
    ),
    "index": (
        "index",
        "build the dataset index (record counts, offsets, checksums) of shard files",
    ),
    "recompress": (
        "recompress",
        "rewrite .jsonl/.jsonl.zst shards as multi-frame .jsonl.zst (readable in parts)",
    ),
    "relane": (
        "relane",
        "write a checkpoint with another lane count (no document lost or repeated)",
    ),
    "amend": ("amend", "write a checkpoint that continues the run with a changed recipe"),
    "cache": ("cache", "show or clear the token cache"),
}


class DefaultsFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default.

    Like argparse's ``ArgumentDefaultsHelpFormatter``, less the defaults None and False (a
    flag) and those the help text already states.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
        if not shown or "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit 2), never a usage dump.

    Its ``--help`` shows the defaults (:class:`DefaultsFormatter`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the argument parser: the subcommand ``argv`` names in full, the others by name.

    With ``argv`` None every subcommand is registered in full (for tests and docs).
    """
    parser = _Parser(
        prog="zephon",
        description="Elastically deterministic training data: digest, verify and inspect recipes.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_line) in COMMANDS.items():
        if wanted is None or name == wanted:
            importlib.import_module(f"zephon_nodes.commands.{module}").add_parser(sub)
        else:
            sub.add_parser(name, help=help_line)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``zephon`` command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
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
