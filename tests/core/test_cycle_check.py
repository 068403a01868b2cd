"""The import-cycle check that `make lint` runs (.ci/check_cycles.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "check_cycles", Path(__file__).resolve().parents[2] / ".ci" / "check_cycles.py"
)
assert _SPEC is not None and _SPEC.loader is not None
check_cycles = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check_cycles)


def test_no_cycle_in_a_chain() -> None:
    """A chain a -> b -> c has no cycle."""
    assert check_cycles.cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_two_module_cycle() -> None:
    """a <-> b is one cycle of two modules; c outside it is not listed."""
    assert check_cycles.cycles({"a": ["b"], "b": ["a", "c"], "c": []}) == [["a", "b"]]


def test_separate_cycles_and_a_long_one() -> None:
    """Two disjoint cycles are two components; a ring of four is one."""
    edges = {"a": ["b"], "b": ["c"], "c": ["d"], "d": ["a"], "x": ["y"], "y": ["x"]}
    assert sorted(check_cycles.cycles(edges)) == [["a", "b", "c", "d"], ["x", "y"]]


def test_self_import_is_not_a_cycle() -> None:
    """A package importing itself (grimp lists no such edge, but be safe) is not reported."""
    assert check_cycles.cycles({"a": ["a"]}) == []
