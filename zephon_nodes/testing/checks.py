"""Property checks for custom operators, nodes and recipes.

Each check raises :class:`AssertionError` naming the property that broke. The checks that take
generated inputs run under Hypothesis (with the settings of the active profile), so a failure
is reported on a minimal counterexample: the shortest input list, the earliest position.

This module holds the checks of operators (worker invariance, flush/replay) and of whole
recipes (:func:`assert_elastic`), and exports the checks of a node's state
(:mod:`~zephon_nodes.testing.state_checks`) and the list sources they feed
(:mod:`~zephon_nodes.testing.list_sources`).
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from zephon_nodes.core.flush import is_flush
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.recipe import Recipe
from zephon_nodes.testing._compare import difference, short
from zephon_nodes.testing._harness import (
    MAX_ITEMS,
    MAX_OUTPUTS,
    accumulate,
    drain,
    name_of,
    run_check,
)
from zephon_nodes.testing.list_sources import ListWorkSource, list_source
from zephon_nodes.testing.state_checks import assert_save_load_state, assert_state_roundtrip
from zephon_nodes.testing.strategies import doc_batches
from zephon_nodes.verification.matrix import default_dp_sizes, default_matrix, run_matrix

__all__ = [
    "ListWorkSource",
    "assert_elastic",
    "assert_flush_replay_exact",
    "assert_save_load_state",
    "assert_state_roundtrip",
    "assert_worker_invariant",
    "list_source",
]


def _fresh_copy(op: Any) -> Any:
    try:
        return copy.deepcopy(op)
    except Exception:
        return op


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
    name = name_of(op)
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

    @given(st.lists(strategy, min_size=1, max_size=MAX_ITEMS))
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
        run_check(check, max_examples)
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
    name = name_of(make)

    @given(st.lists(strategy, max_size=MAX_ITEMS), ks)
    def check(items: list[Any], k: int) -> None:
        node = accumulate(make, items, k)
        node.reset(None)
        states, outputs = [], []
        for _ in range(MAX_OUTPUTS):
            states.append(json.loads(json.dumps(node.get_state())))
            try:
                outputs.append(next(node))
            except StopIteration:
                break
        windows = _windows(outputs)
        for w in sorted(windows, reverse=True):
            alone = accumulate(make, items, k)
            alone.reset(alone.state_at_window(w))
            got = []
            for x in drain(alone):
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
            resumed = accumulate(make, items, k)
            resumed.reset(state)
            d = difference(outputs[p:], drain(resumed))
            if d is not None:
                raise AssertionError(
                    f"accumulator {name!r} is not flush/replay exact: restoring the state "
                    f"taken before output #{p} (flush_every={k}, {len(items)} inputs) does not "
                    f"reproduce the rest of the stream ({d}). Does it keep state across a "
                    f"flush, or depend on anything but its window and inputs?"
                )

    run_check(check, max_examples)


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
