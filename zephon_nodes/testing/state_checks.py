"""Property checks of a node's state: the round trip of ``get_state``, torchdata's save/load.

Each check raises :class:`AssertionError` naming the property that broke and the earliest
position where it did.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from torchdata.nodes import BaseNode, Loader

from zephon_nodes.core.flush import is_flush
from zephon_nodes.engine.lane import WindowRestorable
from zephon_nodes.testing._compare import difference
from zephon_nodes.testing._harness import (
    MAX_ITEMS,
    MAX_OUTPUTS,
    accumulate,
    drain,
    name_of,
    run_check,
)
from zephon_nodes.testing.strategies import doc_batches

__all__ = ["assert_save_load_state", "assert_state_roundtrip"]


def _node_factory(target: Any) -> Callable[[], BaseNode[Any]] | None:
    if isinstance(target, BaseNode):
        return lambda: target
    if callable(target):
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            return None
        required = [p for p in params.values() if p.default is inspect.Parameter.empty]
        if not required:
            return target
    return None


def assert_state_roundtrip(
    target: BaseNode[Any] | Callable[..., Any],
    inputs: st.SearchStrategy[Any] | None = None,
    *,
    json_safe: bool = True,
    max_positions: int = 12,
    max_examples: int | None = None,
    window_restore: bool | None = None,
) -> None:
    """Check that a node's ``get_state`` is a copy that restores exactly.

    A node whose output carries flush markers sits inside a lane; a lane restores it at
    the start of a flush window, so it must also provide ``state_at_window(window)``, and
    the state it returns must restore the stream right after each flush marker.

    Args:
        target: A node (restored in place, as torchdata's ``Loader`` does), a zero-argument
            factory of a fresh node (restored into a new instance), or an accumulator factory
            ``make(window)`` (wrapped in an ``AccumulatorNode`` over generated inputs).
        inputs: For an accumulator factory, strategy of one input item.
        json_safe: Also require the state to survive a JSON round trip unchanged.
        max_positions: Restore positions tried (spread over the stream, always including
            the start, the second item and the end).
        max_examples: For an accumulator factory, generated input lists (default: the
            active Hypothesis profile's).
        window_restore: Require (True) or skip (False) the window restore check; default:
            required when the node's output holds flush markers.

    Raises:
        AssertionError: If a state taken earlier changes as the node advances (``get_state``
            returned a live object), is not JSON-safe, or does not restore the remaining
            outputs exactly, or a node inside a lane has no exact ``state_at_window``; the
            earliest failing position is reported.
    """
    factory = _node_factory(target)
    if factory is not None:
        _roundtrip(factory, name_of(target), json_safe, max_positions, window_restore)
        return
    if not callable(target):
        raise TypeError(f"expected a node or a factory, got {type(target).__name__}")
    make: Callable[[int], Any] = target
    strategy = inputs if inputs is not None else doc_batches()

    @given(st.lists(strategy, max_size=MAX_ITEMS), st.integers(1, 4))
    def check(items: list[Any], k: int) -> None:
        _roundtrip(
            lambda: accumulate(make, items, k), name_of(make), json_safe, max_positions, None
        )

    run_check(check, max_examples)


def _positions(n: int, limit: int) -> list[int]:
    if n + 1 <= limit:
        return list(range(n + 1))
    step = max(1, n // max(1, limit - 3))
    return sorted({0, 1, n, *range(0, n + 1, step)})


def _roundtrip(
    factory: Callable[[], BaseNode[Any]],
    name: str,
    json_safe: bool,
    max_positions: int,
    window_restore: bool | None,
) -> None:
    node = factory()
    node.reset(None)
    states, snapshots, outputs = [], [], []
    for _ in range(MAX_OUTPUTS):
        state = node.get_state()
        states.append(state)
        snapshots.append(copy.deepcopy(state))
        try:
            outputs.append(next(node))
        except StopIteration:
            break
    else:
        raise AssertionError(f"node {name!r} yielded more than {MAX_OUTPUTS} items")
    for p, (state, snap) in enumerate(zip(states, snapshots, strict=True)):
        d = difference(snap, state)
        if d is not None:
            raise AssertionError(
                f"node {name!r}: get_state() returned a live object: the state taken before "
                f"output #{p} changed as the node advanced ({d}). Return a copy (torchdata "
                f"calls get_state from other threads; a live buffer resumes wrongly)."
            )
        if json_safe:
            try:
                back = json.loads(json.dumps(snap))
            except (TypeError, ValueError) as e:
                raise AssertionError(
                    f"node {name!r}: the state before output #{p} is not JSON-safe ({e})"
                ) from None
            d = difference(snap, back, strict=True)
            if d is not None:
                raise AssertionError(
                    f"node {name!r}: the state before output #{p} changes in a JSON round "
                    f"trip ({d}); use str keys, lists, ints, floats, strings and bools"
                )
    for p in _positions(len(outputs), max_positions):
        fresh = factory()
        fresh.reset(copy.deepcopy(snapshots[p]))
        got = drain(fresh, len(outputs) - p + 1)
        d = difference(outputs[p:], got)
        if d is not None:
            raise AssertionError(
                f"node {name!r}: restoring the state taken before output #{p} of "
                f"{len(outputs)} does not reproduce the rest of the stream ({d})"
            )
    markers = [p for p, out in enumerate(outputs) if is_flush(out)]
    if window_restore is None:
        window_restore = bool(markers)
    if window_restore:
        _check_window_restore(factory, name, outputs, markers, max_positions)


def _check_window_restore(
    factory: Callable[[], BaseNode[Any]],
    name: str,
    outputs: list[Any],
    markers: list[int],
    max_positions: int,
) -> None:
    """A node inside a lane must restore at every window start (``state_at_window``)."""
    probe = factory()
    if not isinstance(probe, WindowRestorable):
        raise AssertionError(
            f"node {name!r} passes flush markers, so it runs inside a lane, but it has no "
            f"state_at_window(window): a lane restores its chain at a window start and would "
            f"fail at the first restore. Wrap a torchdata node in "
            f"zephon_nodes.TorchdataStage, or implement state_at_window"
        )
    starts = [(0, 0)] + [(outputs[p].window + 1, p + 1) for p in markers]
    if len(starts) > max_positions:
        step = max(1, len(starts) // max_positions)
        starts = sorted(set(starts[::step]) | {starts[-1]})
    for window, p in starts:
        fresh = factory()
        assert isinstance(fresh, WindowRestorable)
        state = fresh.state_at_window(window)
        fresh.reset(copy.deepcopy(state))
        try:
            got = drain(fresh, len(outputs) - p + 1)
            d = difference(outputs[p:], got)
        except AssertionError:
            d = f"it yields more than the {len(outputs) - p} outputs left"
        if d is not None:
            raise AssertionError(
                f"node {name!r}: state_at_window({window}) does not restore the stream at the "
                f"start of window {window} (output #{p} of {len(outputs)}): {d}"
            )


def assert_save_load_state(node: BaseNode[Any], midpoint: int) -> None:
    """Check torchdata's save/load contract through a ``torchdata.nodes.Loader``.

    The same checks torchdata applies to its own nodes: restore mid-epoch (the rest of the
    epoch, then a full next epoch), mid-way through the next epoch, from the initial state,
    and from the end of an epoch (nothing with ``restart_on_stop_iteration=False``, the
    next epoch otherwise).

    Args:
        node: The node under test (it must yield more than ``midpoint`` items per epoch).
        midpoint: Items taken before the mid-epoch state is saved.

    Raises:
        AssertionError: Naming the scenario that failed.
    """
    loader = Loader(node)
    initial = copy.deepcopy(loader.state_dict())
    it = iter(loader)
    epoch0 = [next(it) for _ in range(midpoint)]
    mid0 = copy.deepcopy(loader.state_dict())
    epoch0 += list(it)
    end0 = copy.deepcopy(loader.state_dict())
    if len(epoch0) <= midpoint:
        raise AssertionError(f"the node yields {len(epoch0)} items, need more than {midpoint=}")
    it = iter(loader)
    epoch1 = [next(it) for _ in range(midpoint)]
    mid1 = copy.deepcopy(loader.state_dict())
    epoch1 += list(it)

    def same(expected: list[Any], got: list[Any], scenario: str) -> None:
        d = difference(expected, got)
        if d is not None:
            raise AssertionError(f"{name_of(node)}: {scenario}: {d}")

    loader.load_state_dict(mid0)
    same(epoch0[midpoint:], list(loader), "restore at the midpoint of epoch 0")
    same(epoch1, list(loader), "the epoch after a mid-epoch restore")
    loader.load_state_dict(mid1)
    same(epoch1[midpoint:], list(loader), "restore at the midpoint of epoch 1")
    loader.load_state_dict(initial)
    same(epoch0, list(loader), "restore from the initial state")
    same(epoch1, list(loader), "the epoch after restoring the initial state")
    no_restart = Loader(node, restart_on_stop_iteration=False)
    no_restart.load_state_dict(end0)
    same([], list(no_restart), "restore at the end of epoch 0 without restart")
    restart = Loader(node)
    restart.load_state_dict(end0)
    same(epoch1, list(restart), "restore at the end of epoch 0 (restart on stop)")
