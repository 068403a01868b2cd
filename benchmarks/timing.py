"""Timing shared by every pipeline under test (stdlib only: TorchTitan main's venv imports it)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchConfig:
    """Shape of one run (the same for every pipeline)."""

    seq_len: int = 2048
    batch_size: int = 8
    num_workers: int = 2
    num_lanes: int = 8
    shuffle_buffer: int = 64
    chunk_size: int = 64
    flush_every: int = 8
    seconds: float = 4.0
    warmup_s: float = 3.0
    min_flush_periods: int = 2
    runner: str = "thread"
    python_filter: bool = False
    tokenizer: str = "sp"  # "sp": the corpus's sentencepiece model; "hf": its tokenizer.json
    dp: int = 1  # data-parallel ranks (the run is rank 0's)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialize (for a subprocess)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        """Deserialize."""
        return cls(**json.loads(text))


@dataclass
class RunResult:
    """What one timed run measured."""

    tokens: int
    seconds: float
    first_batch_s: float
    batches: int
    ckpt_bytes: int | None = None
    padding_tokens: int = 0
    cpu_s: float | None = None
    flush_periods: int | None = None  # whole flush periods of every lane inside the window

    @property
    def tok_s(self) -> float:
        """Tokens per second in steady state."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and all its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(children.get(pid, []))
    return total


def timed(
    batches: Iterator[Any],
    count: Callable[[Any], tuple[int, int]],
    cfg: BenchConfig,
    windows: Callable[[], list[int]] | None = None,
) -> RunResult:
    """Pull batches; the clock starts ``warmup_s`` after the first one.

    The warm-up drains what the pipeline computed ahead while it filled its buffers before
    the first batch (a lane's look-ahead, a prefetch queue), so the timed window measures
    steady state, not work done before the clock started. With ``windows`` (each lane's
    current flush window), the clock also runs until every lane has passed
    ``cfg.min_flush_periods`` whole flush periods.
    """
    t0 = time.perf_counter()
    first = next(batches)
    count(first)
    t1 = time.perf_counter()
    while time.perf_counter() < t1 + cfg.warmup_s:
        count(next(batches))
    first_s = t1 - t0
    t1 = time.perf_counter()
    c1 = tree_cpu_s()
    tokens = pad = n = 0
    deadline = t1 + cfg.seconds
    start = windows() if windows is not None else []
    periods = 0  # whole periods of every lane: a lane k windows further covered k - 1 whole

    def covered() -> int:
        return min(w - w0 for w, w0 in zip(windows(), start, strict=True)) - 1

    now = t1
    while now < deadline or (windows is not None and periods < cfg.min_flush_periods):
        real, padding = count(next(batches))
        tokens += real
        pad += padding
        n += 1
        now = time.perf_counter()
        if windows is not None:
            periods = covered()
    cpu = tree_cpu_s() - c1
    return RunResult(
        tokens,
        now - t1,
        first_s,
        n,
        padding_tokens=pad,
        cpu_s=cpu,
        flush_periods=periods if windows is not None else None,
    )
