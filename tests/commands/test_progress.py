"""``zephon digest --progress``: a live bar on a terminal, the same JSON lines on stdout."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

from tests.commands.run import zephon

REPO = Path(__file__).parents[2]


def run_digest(recipe: Path, *extra: str) -> tuple[bytes, bytes]:
    """Run ``zephon digest`` with stdout on a pipe and stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    # A terminal of 24 x 100 characters (a fresh pseudo-terminal has 0 columns).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "zephon_nodes.cli", "digest", str(recipe), "--steps", "6", *extra],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    terminal = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        terminal += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    assert proc.returncode == 0, terminal.decode(errors="replace")
    return out, terminal


def test_progress_on_a_terminal_keeps_stdout(recipe_path: Path, capsys: Any) -> None:
    assert zephon("digest", str(recipe_path), "--steps", "6") == 0
    plain = capsys.readouterr().out.encode()
    with_bar, terminal = run_digest(recipe_path, "--progress")
    assert with_bar == plain
    assert len(plain.splitlines()) == 6
    text = terminal.decode(errors="replace")
    assert "global batches" in text and "6/6" in text and "step" in text
    assert "\r" in text  # redrawn in place
    assert "tokens=" in text
