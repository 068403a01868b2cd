"""Property checks for custom operators, nodes and recipes.

Each check raises :class:`AssertionError` naming the property that broke. The checks that take
generated inputs run under Hypothesis (with the settings of the active profile), so a failure
is reported on a minimal counterexample: the shortest input list, the earliest position.
"""

from __future__ import annotations

import copy
import inspect
import json
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure
from torchdata.nodes import BaseNode, Loader

from zephon_nodes.core.flush import is_flush
from zephon_nodes.core.operator import Operator
from zephon_nodes.engine.accumulate import AccumulatorNode
from zephon_nodes.engine.lane import WindowRestorable, WorkItemNode
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.engine.work import WorkSource
from zephon_nodes.recipe import Recipe
from zephon_nodes.testing._compare import difference, short
from zephon_nodes.testing.strategies import doc_batches

__all__ = [
    "ListWorkSource",
    "assert_elastic",
    "assert_flush_replay_exact",
    "assert_save_load_state",
    "assert_state_roundtrip",
    "assert_worker_invariant",
    "list_source",
]

_MAX_ITEMS = 10
_MAX_OUTPUTS = 400


class ListWorkSource(WorkSource):
    """A one-lane work source over a list: ``work(0, i)`` is ``items[i]``.

    Args:
        items: The items, in order.
    """

    def __init__(self, items: Sequence[Any]) -> None:
        super().__init__(num_lanes=1)
        self.items = list(items)

    def work(self, lane: int, i: int) -> Any:
        """Return item ``i``, or None past the end."""
        return self.items[i] if i < len(self.items) else None


def list_source(items: Sequence[Any], flush_every: int) -> WorkItemNode:
    """A lane source over ``items`` with a flush marker every ``flush_every`` items.

    It is the node a lane starts from (a :class:`~zephon_nodes.engine.lane.WorkItemNode`), so
    operators built on it restore exactly as they do inside a real lane.
    """
    return WorkItemNode(ListWorkSource(items), 0, flush_every)


def _name(obj: Any) -> str:
    if isinstance(obj, Operator) and obj.name:
        return str(obj.name)
    return str(getattr(obj, "__name__", type(obj).__name__))  # a function or a class


def _fresh_copy(op: Any) -> Any:
    try:
        return copy.deepcopy(op)
    except Exception:
        return op


def _run(check: Callable[[], None], max_examples: int | None = None) -> None:
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


# --- worker invariance ----------------------------------------------------------------------


def assert_worker_invariant(
    op: Callable[[Any], Any],
    inputs: st.SearchStrategy[Any] | None = None,
    *,
    workers: Sequence[int] = (1, 2),
    runners: Sequence[str] = ("thread",),
    max_examples: int | None = None,
) -> None:
    """Check that a stateless operator's output depends only on its input.

    For generated lists of inputs, the output of each input computed alone (a fresh copy of
    the operator, in the calling thread) must equal its output in a batch on the same
    instance, on every pool (``workers`` x ``runners``), and when the batch is submitted in
    reverse order. This catches operators that read the worker id or thread identity, keep
    a counter or cache that changes results, or (with ``runners=("process",)``) do not
    survive pickling.

    Args:
        op: The operator: a picklable callable of one item.
        inputs: Strategy of one input item (default: :func:`~.strategies.doc_batches`).
        workers: Pool sizes to try.
        runners: ``"thread"`` and/or ``"process"`` (spawned processes start slowly).
        max_examples: Generated input lists (default: the active Hypothesis profile's).

    Raises:
        AssertionError: On the smallest input list that shows a difference.
    """
    strategy = inputs if inputs is not None else doc_batches()
    name = _name(op)
    if "process" in runners:
        try:
            pickle.loads(pickle.dumps(op))
        except Exception as e:
            raise AssertionError(
                f"operator {name!r} does not pickle, and the process runner needs a picklable "
                f"operator (a module-level class or function, no lambdas or open handles): "
                f"{type(e).__name__}: {e}"
            ) from e
    pools = [WorkerPool(w, r) for r in runners for w in workers]

    @given(st.lists(strategy, min_size=1, max_size=_MAX_ITEMS))
    def check(items: list[Any]) -> None:
        alone = [_fresh_copy(op)(x) for x in items]
        same = [op(x) for x in items]
        _expect(alone, same, items, "applied in order on one instance", name)
        for pool in pools:
            got = _on_pool(pool, op, items, name)
            _expect(alone, got, items, f"on {pool}", name)
            got = _on_pool(pool, op, items[::-1], name)[::-1]
            _expect(alone, got, items, f"on {pool}, submitted in reverse order", name)

    try:
        _run(check, max_examples)
    finally:
        for pool in pools:
            pool.close()


def _on_pool(pool: WorkerPool, op: Callable[[Any], Any], items: list[Any], name: str) -> list[Any]:
    try:
        futures = [pool.submit(op, x) for x in items]
        return [f.result(timeout=pool.timeout_s) for f in futures]
    except Exception as e:
        hint = (
            " (the process runner needs a picklable operator)" if pool.runner == "process" else ""
        )
        raise AssertionError(
            f"operator {name!r} failed on {pool}{hint}: {type(e).__name__}: {e}"
        ) from e


def _expect(expected: list[Any], got: list[Any], items: list[Any], how: str, name: str) -> None:
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        d = difference(a, b)
        if d is not None:
            raise AssertionError(
                f"operator {name!r} is not worker-invariant: input #{i} of {len(items)} "
                f"({short(items[i])}) gives a different output {how} than alone in the "
                f"calling thread ({d}). A stateless operator must be a pure function of its "
                f"input: no worker id, thread identity, counters or caches that change results."
            )


# --- flush / replay -------------------------------------------------------------------------


def _accumulate(make: Callable[[int], Any], items: list[Any], k: int) -> AccumulatorNode:
    return AccumulatorNode(list_source(items, k), make)


def _drain(node: BaseNode[Any], limit: int = _MAX_OUTPUTS) -> list[Any]:
    out = []
    for _ in range(limit):
        try:
            out.append(next(node))
        except StopIteration:
            return out
    raise AssertionError(f"the node yielded more than {limit} items from a short input")


def _windows(outputs: list[Any]) -> dict[int, list[Any]]:
    windows: dict[int, list[Any]] = {0: []}
    w = 0
    for x in outputs:
        if is_flush(x):
            w = x.window + 1
            windows[w] = []
        else:
            windows[w].append(x)
    return windows


def assert_flush_replay_exact(
    make: Callable[[int], Any],
    inputs: st.SearchStrategy[Any] | None = None,
    *,
    flush_every: int | None = None,
    max_examples: int | None = None,
) -> None:
    """Check that an accumulator restores exactly by flush/replay.

    ``make(window)`` returns the accumulator of one flush window (``feed``/``flush``), as
    :class:`~zephon_nodes.engine.accumulate.AccumulatorNode` takes it. For generated input
    lists and flush intervals, two properties must hold:

    1. every window's outputs, replayed alone from a fresh ``make(window)``, equal its
       outputs in the uninterrupted run (nothing crosses a flush);
    2. the state taken before any output, restored into a new node, yields exactly the
       remaining outputs.

    Args:
        make: Accumulator factory.
        inputs: Strategy of one input item (default: :func:`~.strategies.doc_batches`, what a
            packer takes).
        flush_every: Items per window (default: drawn from 1 to 4).
        max_examples: Generated input lists (default: the active Hypothesis profile's).

    Raises:
        AssertionError: On the smallest input list and earliest window or position.
    """
    strategy = inputs if inputs is not None else doc_batches()
    ks = st.just(flush_every) if flush_every is not None else st.integers(1, 4)
    name = _name(make)

    @given(st.lists(strategy, max_size=_MAX_ITEMS), ks)
    def check(items: list[Any], k: int) -> None:
        node = _accumulate(make, items, k)
        node.reset(None)
        states, outputs = [], []
        for _ in range(_MAX_OUTPUTS):
            states.append(json.loads(json.dumps(node.get_state())))
            try:
                outputs.append(next(node))
            except StopIteration:
                break
        windows = _windows(outputs)
        for w in sorted(windows, reverse=True):
            alone = _accumulate(make, items, k)
            alone.reset(alone.state_at_window(w))
            got = []
            for x in _drain(alone):
                if is_flush(x):
                    break
                got.append(x)
            d = difference(windows[w], got)
            if d is not None:
                raise AssertionError(
                    f"accumulator {name!r} is not flush/replay exact: window {w} (flush_every="
                    f"{k}, {len(items)} inputs) replayed alone from a fresh make({w}) differs "
                    f"from the uninterrupted run ({d}). Does it keep state across a flush "
                    f"(a shared object, a class attribute, a carry-over)?"
                )
        for p, state in enumerate(states):
            resumed = _accumulate(make, items, k)
            resumed.reset(state)
            d = difference(outputs[p:], _drain(resumed))
            if d is not None:
                raise AssertionError(
                    f"accumulator {name!r} is not flush/replay exact: restoring the state "
                    f"taken before output #{p} (flush_every={k}, {len(items)} inputs) does not "
                    f"reproduce the rest of the stream ({d}). Does it keep state across a "
                    f"flush, or depend on anything but its window and inputs?"
                )

    _run(check, max_examples)


# --- state round trip -----------------------------------------------------------------------


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
        _roundtrip(factory, _name(target), json_safe, max_positions, window_restore)
        return
    if not callable(target):
        raise TypeError(f"expected a node or a factory, got {type(target).__name__}")
    make: Callable[[int], Any] = target
    strategy = inputs if inputs is not None else doc_batches()

    @given(st.lists(strategy, max_size=_MAX_ITEMS), st.integers(1, 4))
    def check(items: list[Any], k: int) -> None:
        _roundtrip(lambda: _accumulate(make, items, k), _name(make), json_safe, max_positions, None)

    _run(check, max_examples)


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
    for _ in range(_MAX_OUTPUTS):
        state = node.get_state()
        states.append(state)
        snapshots.append(copy.deepcopy(state))
        try:
            outputs.append(next(node))
        except StopIteration:
            break
    else:
        raise AssertionError(f"node {name!r} yielded more than {_MAX_OUTPUTS} items")
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
        got = _drain(fresh, len(outputs) - p + 1)
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
            got = _drain(fresh, len(outputs) - p + 1)
            d = difference(outputs[p:], got)
        except AssertionError:
            d = f"it yields more than the {len(outputs) - p} outputs left"
        if d is not None:
            raise AssertionError(
                f"node {name!r}: state_at_window({window}) does not restore the stream at the "
                f"start of window {window} (output #{p} of {len(outputs)}): {d}"
            )


# --- torchdata's save/load contract ---------------------------------------------------------


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
            raise AssertionError(f"{_name(node)}: {scenario}: {d}")

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


# --- whole recipes --------------------------------------------------------------------------


def assert_elastic(
    recipe: Recipe | Pipeline,
    *,
    steps: int = 8,
    dp_sizes: Sequence[int] | None = None,
    workers: Sequence[int] = (0, 2),
    runners: Sequence[str] = ("thread",),
    checkpoint_step: int | None = None,
) -> None:
    """Check that a recipe gives identical global batches across physical settings.

    Runs the recipe under every dp size (default: the divisors of ``num_lanes`` up to 8) x
    ``workers`` x ``runners``, plus a checkpoint after ``checkpoint_step`` (default: half the
    steps) resumed from each dp size at each other, and compares each step's global batch
    digest with a one-rank inline reference. ``recipe`` may also be a
    :class:`~zephon_nodes.engine.pipeline.Pipeline`, for example a subclass whose ``build_lane``
    adds your own operators.

    Raises:
        AssertionError: Naming the smallest failing setting and its first differing step.
    """
    from zephon_nodes.verification.matrix import default_dp_sizes, default_matrix, run_matrix

    pipeline = recipe if isinstance(recipe, Pipeline) else Pipeline(recipe)
    sizes = list(dp_sizes) if dp_sizes is not None else default_dp_sizes(pipeline.num_lanes)
    settings = default_matrix(
        pipeline.num_lanes,
        dp_sizes=sizes,
        workers=workers,
        runners=runners,
        checkpoint_step=checkpoint_step,
    )
    result = run_matrix(pipeline, settings, steps)
    bad = [r for r in result.results if not r.identical]
    if not bad:
        return
    bad.sort(key=lambda r: (r.setting.is_resume, r.setting.dp, r.setting.workers))
    first = bad[0]
    if first.error is not None:
        detail = f"it failed: {first.error}"
    else:
        step = first.first_diff or 0
        ref = result.reference.digests
        a = ref[step - 1][:12] if step <= len(ref) else "<no batch>"
        b = first.digests[step - 1][:12] if step <= len(first.digests) else "<no batch>"
        detail = f"step {step} differs (reference {a}..., got {b}...)"
    others = ", ".join(r.setting.name for r in bad[1:6])
    raise AssertionError(
        f"recipe is not elastically deterministic: {first.setting.name}: {detail}"
        + (f"; also failing: {others}" if others else "")
    )
