"""Operators that fail on purpose, importable by spawned worker processes."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Faulty:
    """Wrap a stateless operator; misbehave on work item ``position`` of lane ``lane``.

    Modes: ``raise`` (ValueError), ``block`` (sleep ``seconds``), ``sigkill`` (the worker
    process SIGKILLs itself), ``pidfile_block`` (write the worker's pid to ``path``, then
    block, so a test can SIGKILL it from outside), ``jitter`` (sleep a pseudo-random few ms on
    every item, to shuffle completion order).
    """

    inner: Any
    mode: str
    lane: int = 1
    position: int = 3
    seconds: float = 3600.0
    path: str = ""
    name: str = "faulty"

    def __call__(self, item: Any) -> Any:
        if self.mode == "jitter":
            time.sleep(((item.lane * 7919 + item.position * 104729) % 13) / 1000)
        elif item.lane == self.lane and item.position == self.position:
            if self.mode == "raise":
                raise ValueError(f"injected failure on lane {item.lane} item {item.position}")
            if self.mode == "block":
                time.sleep(self.seconds)
            if self.mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "pidfile_block":
                with open(self.path + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(self.path + ".tmp", self.path)
                time.sleep(self.seconds)
        return self.inner(item)


def worker_pid(delay_s: float) -> int:
    """Return the pid of the worker running the call (after ``delay_s``)."""
    time.sleep(delay_s)
    return os.getpid()
