"""Run metrics of a rank: data wait, tokens, padding, operator busy time, queues, skips.

Metrics are observations, never state: they are not checkpointed and never change a byte of
output. A rank's :class:`~zephon_nodes.engine.multiplexer.Multiplexer` keeps the per-step
numbers (:class:`StepMetrics`); each pool stage (:class:`TimedCall` around the stateless
chain, timing every operator of it) and each accumulator node keeps its own busy time, and
:func:`rank_metrics` gathers everything into one plain dict (see ``docs/cli.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from zephon_nodes.core.operator import Fused, operator_name
from zephon_nodes.engine.lane import chain_nodes

__all__ = [
    "Clocked",
    "OperatorClock",
    "StepMetrics",
    "TimedCall",
    "flatten_metrics",
    "rank_metrics",
]


@dataclass(frozen=True)
class TimedCall:
    """``fn(item) -> (result, ((operator name, seconds), ...))``; picklable if ``fn`` is.

    A :class:`~zephon_nodes.operators.chain.Chain` is timed operator by operator.
    """

    fn: Callable[[Any], Any]

    def __call__(self, item: Any) -> tuple[Any, tuple[tuple[str, float], ...]]:
        """Run ``fn`` on ``item`` and time it."""
        ops = self.fn.operators if isinstance(self.fn, Fused) else None
        if ops is None:
            t0 = time.perf_counter()
            out = self.fn(item)
            return out, ((operator_name(self.fn), time.perf_counter() - t0),)
        times = []
        for op in ops:
            t0 = time.perf_counter()
            item = op(item)
            times.append((operator_name(op), time.perf_counter() - t0))
        return item, tuple(times)


class OperatorClock:
    """Busy seconds and calls per operator name, and queue depth samples (one node's)."""

    def __init__(self) -> None:
        self.busy_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.queue_samples = 0
        self.queue_total = 0
        self.ready_total = 0

    def add(self, times: Iterable[tuple[str, float]]) -> None:
        """Add one call's ``(operator, seconds)`` pairs."""
        for name, secs in times:
            self.add_one(name, secs)

    def add_one(self, name: str, secs: float) -> None:
        """Add one call of one operator (:meth:`add` without building a tuple per call)."""
        self.busy_s[name] = self.busy_s.get(name, 0.0) + secs
        self.calls[name] = self.calls.get(name, 0) + 1

    def add_skipped(self, skipped: Iterable[tuple[str, int]]) -> None:
        """Add records skipped by reason (a batch's ``skipped``)."""
        for reason, count in skipped:
            self.skipped[reason] = self.skipped.get(reason, 0) + int(count)

    def add_queue(self, in_flight: int, ready: int) -> None:
        """Sample the queue: items submitted ahead, and how many of them are done."""
        self.queue_samples += 1
        self.queue_total += in_flight
        self.ready_total += ready


class StepMetrics:
    """The per-step numbers of one rank (what it handed out, and how long that took)."""

    def __init__(self) -> None:
        self.steps = 0
        self.wait_s = 0.0
        self.total_wait_s = 0.0
        self.samples = 0
        self.tokens = 0
        self.padding_fraction = 0.0
        self.total_samples = 0
        self.total_tokens = 0
        self.restore_s = 0.0

    def step(self, batches: Iterable[Mapping[str, Any]], wait_s: float) -> None:
        """Record one step's micro-batches and the seconds spent building them."""
        samples = tokens = pad = cells = 0
        for b in batches:
            labels = np.asarray(b["labels"])
            size = int(labels.size)
            real = int(np.count_nonzero(labels != -100))
            samples += int(labels.shape[0])
            cells += size
            tokens += real
            if "document_ids" in b:
                pad += int(np.count_nonzero(np.asarray(b["document_ids"]) < 0))
            else:
                pad += size - real  # the cells labelled -100: one pass over labels, not two
        self.steps += 1
        self.wait_s = wait_s
        self.total_wait_s += wait_s
        self.samples, self.tokens = samples, tokens
        self.padding_fraction = pad / cells if cells else 0.0
        self.total_samples += samples
        self.total_tokens += tokens


@runtime_checkable
class Clocked(Protocol):
    """A node that keeps its operators' busy time (a pool stage, an accumulator node)."""

    clock: OperatorClock


def _clocks(node: Any) -> Iterable[OperatorClock]:
    for n in chain_nodes(node):
        if isinstance(n, Clocked) and isinstance(n.clock, OperatorClock):
            yield n.clock


def rank_metrics(step: StepMetrics, lanes: Iterable[Any]) -> dict[str, Any]:
    """Gather a rank's metrics into a plain, JSON-safe dict.

    Keys: ``step``; the last step's ``data_wait_s``, ``samples``, ``tokens`` (trained label
    tokens) and ``padding_fraction``; totals ``data_wait_s_total``, ``samples_total``,
    ``tokens_total``; ``restore_s`` (the replay time of the last restore); ``operators``
    (``{name: {"busy_s", "calls"}}`` over the rank's lanes); ``queue_depth`` and
    ``queue_ready`` (mean work items submitted ahead, and done, when a lane took one);
    ``skipped`` (records skipped by reason, as processed: a replay counts them again).
    """
    operators: dict[str, dict[str, Any]] = {}
    skipped: dict[str, int] = {}
    samples = total = ready = 0
    for lane in lanes:
        for clock in _clocks(lane):
            for name, secs in list(clock.busy_s.items()):
                entry = operators.setdefault(name, {"busy_s": 0.0, "calls": 0})
                entry["busy_s"] += secs
                entry["calls"] += clock.calls.get(name, 0)
            for reason, count in list(clock.skipped.items()):
                skipped[reason] = skipped.get(reason, 0) + count
            samples += clock.queue_samples
            total += clock.queue_total
            ready += clock.ready_total
    return {
        "step": step.steps,
        "data_wait_s": step.wait_s,
        "samples": step.samples,
        "tokens": step.tokens,
        "padding_fraction": step.padding_fraction,
        "data_wait_s_total": step.total_wait_s,
        "samples_total": step.total_samples,
        "tokens_total": step.total_tokens,
        "restore_s": step.restore_s,
        "operators": dict(sorted(operators.items())),
        "queue_depth": total / samples if samples else 0.0,
        "queue_ready": ready / samples if samples else 0.0,
        "skipped": dict(sorted(skipped.items())),
    }


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "zephon") -> dict[str, float]:
    """Flatten nested metrics into ``prefix/key/sub`` scalar entries (for loggers)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_metrics(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out
