"""The ``zephon`` command line: a lazy command table over the modules of ``zephon_nodes.commands``.

Each subcommand is named by the module that declares its arguments (``add_parser``); that
module names, by its module path (the parsed ``run``), the module whose ``run(args)`` runs
it, imported with :func:`importlib.import_module` only when the command is dispatched. So
``zephon --help``, the ``--help`` of every command and the commands that need no tensors
(``lanes``, ``inspect``, ``index``) start without importing torch, and no command module
imports the engine inside a function: a command whose run needs the engine declares its
arguments in a light ``*_args`` module and runs in a module that imports the engine at its top.
A parser may also set ``prepare``: a light step run before the run's module is imported
(``relane`` and ``amend`` refuse a missing checkpoint there, before torch is loaded).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from zephon_nodes import __version__
from zephon_nodes.core.errors import ZephonError
from zephon_nodes.io.storage.retry import redact
from zephon_nodes.recipe.bounds import check_setting

__all__ = ["COMMANDS", "DefaultsFormatter", "main", "run_command"]

# Subcommand name -> (module in zephon_nodes.commands exposing add_parser(subparsers), the
# help line that module gives it: shown by `zephon --help` without importing the module). The
# parser names the module that runs the command (`run`), imported by `run_command`.
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
        "explain_args",
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
        "relane_args",
        "write a checkpoint with another lane count (no document lost or repeated)",
    ),
    "amend": ("amend_args", "write a checkpoint that continues the run with a changed recipe"),
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
    parser.add_argument("--version", action="version", version=f"zephon-nodes {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_line) in COMMANDS.items():
        if wanted is None or name == wanted:
            importlib.import_module(f"zephon_nodes.commands.{module}").add_parser(sub)
        else:
            sub.add_parser(name, help=help_line)
    return parser


class Terminated(BaseException):
    """Raised in the main thread by SIGTERM, so that pools close before the process exits."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` (in the main thread only; restored after)."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave the default
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reap_resource_tracker() -> None:
    """Stop and reap multiprocessing's resource tracker (a process runner's helper process).

    Python 3.11 leaves it running at exit: the process that outlives ``zephon`` is reparented
    to PID 1 and stays defunct where PID 1 reaps nothing (a container). Registered before
    multiprocessing is imported, so it runs after multiprocessing's own exit handlers have
    released every semaphore (none is reported leaked).
    """
    util = sys.modules.get("multiprocessing.util")
    if util is not None and not getattr(util, "_exiting", False):
        return  # imported after multiprocessing: its exit handlers still release semaphores
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    stop = getattr(getattr(tracker, "_resource_tracker", None), "_stop", None)
    if callable(stop):
        with contextlib.suppress(Exception):
            stop()


atexit.register(_reap_resource_tracker)


def _fail(command: str, message: str, status: int) -> int:
    """Print ``zephon COMMAND: MESSAGE`` on stderr (one line) and return ``status``."""
    with contextlib.suppress(Exception):
        print(f"zephon {command}: {message}", file=sys.stderr, flush=True)
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail a second time."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command and return its exit status.

    The parser's ``prepare`` step (if any) runs first; then the module the parser names as
    ``run`` is imported (only now: the lazy half of the command table) and its ``run(args)``
    is called.
    """
    prepare = getattr(args, "prepare", None)
    if prepare is not None:
        prepare(args)
    return int(importlib.import_module(args.run).run(args) or 0)


def _run(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
        status = run_command(args)
        if sys.stdout is not None:
            sys.stdout.flush()  # a write error surfaces here, not at exit
        return status
    except ZephonError as e:
        return _fail(args.command, f"error: {redact(str(e))}", 2)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except OSError as e:
        return _os_error(args.command, e)


def _os_error(command: str, e: OSError) -> int:
    """One line for an operating-system error: writing the output, or a file."""
    if isinstance(sys.stdout, _Stdout) and sys.stdout.failed:
        _silence_stdout()
        return _fail(command, f"error: cannot write to stdout: {e.strerror or e}", 1)
    where = f"{e.filename}: " if e.filename else ""
    return _fail(command, f"error: {where}{e.strerror or e}", 1)


class _Stdout:
    """``sys.stdout`` during a command, remembering that a write to it failed.

    A full disk or ``> /dev/full`` is then named as the output's error, not a file's.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failed = False

    def write(self, text: str) -> int:
        try:
            return int(self.inner.write(text))
        except OSError:
            self.failed = True
            raise

    def flush(self) -> None:
        try:
            self.inner.flush()
        except OSError:
            self.failed = True
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``zephon`` command line; return the exit status.

    SIGINT and SIGTERM, from the start (while the command's module is imported) to the end,
    stop the command with one line and status 130 / 143 once its pools are closed.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        with _sigterm_raises():
            return _parse_and_run(argv)
    except KeyboardInterrupt:
        return _fail(command, "interrupted (SIGINT)", 130)
    except Terminated:
        return _fail(command, "terminated (SIGTERM)", 143)


def _parse_and_run(argv: list[str]) -> int:
    args = build_parser(argv).parse_args(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing could be printed
        return _fail(args.command, "error: stdout is closed (nothing could be printed)", 1)
    guard = _Stdout(sys.stdout)
    sys.stdout = guard
    try:
        return _run(args)
    finally:
        if sys.stdout is guard:
            sys.stdout = guard.inner


if __name__ == "__main__":
    sys.exit(main())
