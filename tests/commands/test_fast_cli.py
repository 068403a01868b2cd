"""The command line imports only the subcommand it runs; those that need no tensors, no torch."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_nodes import cli

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import sys\n"
    "from zephon_nodes.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "print(repr(sorted(m for m in ('torch', 'torchdata') if m in sys.modules)), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _run(*argv: str, cwd: Path) -> tuple[int, str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = eval(done.stderr.strip().splitlines()[-1])  # the probe's last line
    return done.returncode, done.stdout, imported


def test_help_lines_are_the_modules_own() -> None:
    """`zephon --help` lists each subcommand with the help line its module registers."""
    for name, (module, help_line) in cli.COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"zephon_nodes.commands.{module}").add_parser(sub)
        assert sub._choices_actions[0].help == help_line, name


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("lanes", "--dp", "2,4", "--global-batch", "16"), ("index", "--help")],
    ids=["help", "lanes", "index"],
)
def test_commands_without_tensors_do_not_import_torch(tmp_path: Path, argv: tuple[str]) -> None:
    code, out, imported = _run(*argv, cwd=tmp_path)
    assert code == 0, out
    assert out  # they did their work
    assert imported == []


def test_inspect_does_not_import_torch(tmp_path: Path) -> None:
    from zephon_nodes.state import save_state
    from zephon_nodes.state.schema import RankState

    state = RankState(
        fingerprint="0" * 64, recipe={}, num_lanes=2, step=3, micro=0, lanes={0: (0, 6), 1: (0, 6)}
    ).to_dict()
    save_state(tmp_path / "ckpt", state)
    code, out, imported = _run("inspect", str(tmp_path / "ckpt"), "--json", cwd=tmp_path)
    assert code == 0, out
    assert json.loads(out)["step"] == 3
    assert imported == []


def test_a_command_with_tensors_still_runs(tmp_path: Path) -> None:
    """`digest` imports what it needs when it runs (the parser is built for it alone)."""
    code, out, imported = _run("digest", "--help", cwd=tmp_path)
    assert code == 0 and "--dp-world-size" in out
    assert "torch" in imported


@pytest.mark.parametrize("command", ["relane", "amend", "explain"])
def test_help_of_commands_that_run_the_engine_does_not_import_torch(
    tmp_path: Path, command: str
) -> None:
    """Their parsers need no engine: only running them imports it (and with it torch)."""
    code, out, imported = _run(command, "--help", cwd=tmp_path)
    assert code == 0, out
    assert "usage: " in out and command in out
    assert imported == []


@pytest.mark.parametrize(
    "argv",
    [("relane", "r.toml", "CKPT", "--num-lanes", "4"), ("amend", "r.toml", "CKPT", "r.toml")],
    ids=["relane", "amend"],
)
def test_a_missing_checkpoint_is_refused_before_importing_torch(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """The parser's ``prepare`` step loads the checkpoint before the engine is imported."""
    (tmp_path / "r.toml").write_text("")
    missing = str(tmp_path / "no-such-checkpoint")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            *(missing if a == "CKPT" else a for a in argv),
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "no-such-checkpoint" in lines[0] and "Traceback" not in done.stderr
    assert eval(lines[-1]) == []
