"""What the property checks share: running a Hypothesis check, naming code, draining nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.errors import FlakyFailure
from torchdata.nodes import BaseNode

from zephon_nodes.core.operator import Operator
from zephon_nodes.engine.accumulate import AccumulatorNode
from zephon_nodes.testing.list_sources import list_source

MAX_ITEMS = 10
"""Longest generated input list."""
MAX_OUTPUTS = 400
"""Most outputs taken from a node fed a short input."""


def name_of(obj: Any) -> str:
    """The name a check gives the code under test: an operator's name, else its own."""
    if isinstance(obj, Operator) and obj.name:
        return str(obj.name)
    return str(getattr(obj, "__name__", type(obj).__name__))  # a function or a class


def run_check(check: Callable[[], None], max_examples: int | None = None) -> None:
    """Run a Hypothesis check; turn several failures, or a flaky one, into one AssertionError.

    A wrong operator that keeps state between calls can fail differently from one example to
    the next (Hypothesis then reports an exception group); the first assertion is reported,
    with a note when it did not reproduce on the same input.
    """
    # Timing is not the property under test: no deadline (a pool's first task may take
    # seconds while workers start), and slow data generation is fine.
    options: dict[str, Any] = {
        "report_multiple_bugs": False,
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    }
    if max_examples is not None:
        options["max_examples"] = max_examples
    try:
        settings(**options)(check)()
    except BaseExceptionGroup as group:
        first = _first_assertion(group)
        if first is None:
            raise
        note = ""
        if isinstance(group, FlakyFailure):
            note = (
                " (this failure did not reproduce on the same input: the code under test "
                "keeps state between calls)"
            )
        raise AssertionError(f"{first}{note}") from group


def _first_assertion(group: BaseExceptionGroup[Any]) -> AssertionError | None:
    for e in group.exceptions:
        if isinstance(e, AssertionError):
            return e
        if isinstance(e, BaseExceptionGroup):
            found = _first_assertion(e)
            if found is not None:
                return found
    return None


def accumulate(make: Callable[[int], Any], items: list[Any], k: int) -> AccumulatorNode:
    """The accumulator ``make`` builds, over ``items`` with a flush every ``k`` of them."""
    return AccumulatorNode(list_source(items, k), make)


def drain(node: BaseNode[Any], limit: int = MAX_OUTPUTS) -> list[Any]:
    """Every output of ``node``; more than ``limit`` is an AssertionError."""
    out = []
    for _ in range(limit):
        try:
            out.append(next(node))
        except StopIteration:
            return out
    raise AssertionError(f"the node yielded more than {limit} items from a short input")
