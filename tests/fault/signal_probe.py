"""Run ``zephon ARGS...``, send it a signal once its workers run, report what it left behind.

``python -m tests.fault.signal_probe SIGNAL|none WAIT_FOR ARGS...`` prints one JSON object:
the exit status, stderr, every descendant process seen and the ones still present after
the command exited. The probe makes itself a child subreaper (Linux), so a descendant the
command did not reap is reparented here, not to PID 1, and is seen (then reaped) here.
The signal is sent once the command has printed a line (on stdout or stderr) and has
``WAIT_FOR`` descendants (a process runner's workers and resource tracker), plus a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc's children lists)."""
    out: set[int] = set()
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                continue
            out.update(kids)
            frontier.extend(kids)
    return out


def _left(pids: set[int]) -> list[dict[str, object]]:
    """The processes of ``pids`` still present (state 'Z': defunct), reaped if ours."""
    left = []
    for q in sorted(pids):
        try:
            with open(f"/proc/{q}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        left.append({"pid": q, "state": fields[0], "ppid": int(fields[1])})
        with contextlib.suppress(ChildProcessError):
            os.waitpid(q, os.WNOHANG)
    return left


def _drain(stream: Any, into: list[bytes]) -> None:
    for line in iter(stream.readline, b""):
        into.append(line)


def main() -> None:
    """Run the probe (see the module docstring)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    name, wait_for, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zephon_nodes.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    seen: set[int] = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and proc.poll() is None:
        seen |= descendants(proc.pid)
        if len(seen) >= wait_for and (out or err):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # into the run (a process runner's workers busy)
    seen |= descendants(proc.pid)
    printed_before = len(err)
    if name != "none":
        proc.send_signal(getattr(signal, name))
    try:
        proc.wait(timeout=120)
        hung = False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        hung = True
    for r in readers:
        r.join(timeout=10)
    time.sleep(1.5)  # a worker left behind notices its parent gone within 0.5 s
    report = {
        "rc": proc.returncode,
        "hung": hung,
        "stderr_after": b"".join(err[printed_before:]).decode(errors="replace"),
        "stderr": b"".join(err).decode(errors="replace"),
        "stdout_lines": len(out),
        "seen": len(seen),
        "left": _left(seen),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
