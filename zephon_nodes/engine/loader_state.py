"""A ``torchdata.nodes.Loader`` state at another dp size: extract, replay, merge, put back.

A ``Loader`` over a rank node (with any stack of torchdata wrappers) saves the rank node's
state nested under the wrappers' keys; a wrapper that snapshots its source every ``f`` items
(``Prefetcher``, ``ParallelMapper``) saves an older state plus the number of items yielded
since (``steps_since_snapshot``). To restart at another dp size:

1. :func:`rank_state` takes each rank's ``Loader`` state and returns the rank node's state
   at the step the training loop reached (replaying the few steps after an older snapshot);
2. :func:`~zephon_nodes.state.merge.merge_states` merges the ranks (it also accepts
   ``Loader`` states whose nested state is exact); :func:`reshard_loader_states` does 1 + 2;
3. :func:`with_rank_state` puts the merged state into a new rank's ``Loader`` state, and
   :func:`load_rank_state` loads it into the new rank's ``Loader``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchdata.nodes import Loader

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.state.locate import LocatedState, locate_state, replace_state, unwrap_state
from zephon_nodes.state.merge import merge_states
from zephon_nodes.state.schema import FORMAT, LANES_KEY, LAYOUT_KEY, MICRO_KEY, STEP_KEY, is_int

__all__ = [
    "load_rank_state",
    "locate_rank_state",
    "rank_state",
    "reshard_loader_states",
    "with_rank_state",
]


def locate_rank_state(loader_state: Mapping[str, Any]) -> LocatedState:
    """Find the rank node's state inside a ``Loader`` state (or a rank state itself).

    Raises:
        CheckpointError: If there is none, or more than one.
    """
    found = locate_state(loader_state, FORMAT)
    if len(found) != 1:
        if not found:
            raise CheckpointError(
                f"no zephon-nodes state (a dict with format {FORMAT!r}) in this Loader state"
            )
        where = ", ".join(f.where for f in found)
        raise CheckpointError(f"more than one zephon-nodes state in this Loader state: {where}")
    return found[0]


def rank_state(
    loader_state: Mapping[str, Any],
    pipeline: Pipeline | None = None,
    *,
    step: int | None = None,
    num_workers: int = 0,
) -> dict[str, Any]:
    """Return a rank's state at a step boundary, from its ``Loader`` state.

    If the nested rank state is exact (no wrapper yielded anything after it, and it is not
    in the middle of a step), it is returned as is. Otherwise ``step`` (the number of steps
    the training loop consumed) and ``pipeline`` are needed: the rank's lanes are replayed
    from the nested state's step to ``step``. Only the step boundary is recomputed; nothing
    is inferred from the wrappers' counters (their units depend on the stack: a ``Batcher``
    counts batches).

    Args:
        loader_state: ``loader.state_dict()`` of one rank (or the rank node's own state).
        pipeline: The compiled recipe (for a replay).
        step: Steps the training loop consumed when the state was saved (for a replay).
        num_workers: Worker threads for the replay.

    Raises:
        CheckpointError: If the state cannot be found, needs a replay and ``step`` or
            ``pipeline`` is missing, or ``step`` is before the nested state.
    """
    found = locate_rank_state(loader_state)
    inner = dict(found.state)
    micro = inner.get(MICRO_KEY, 0)
    s = inner.get(STEP_KEY)
    if found.exact and micro == 0 and (step is None or step == s):
        return unwrap_state(inner)
    if step is None or pipeline is None:
        lag = ", ".join(f"{k}={v}" for k, v in found.lag) or f"micro={micro}"
        raise CheckpointError(
            f"the rank state at {found.where} is not at the consumer's step boundary ({lag}): "
            f"pass pipeline= and step= (the steps the training loop consumed) to replay it"
        )
    if not is_int(s) or s is None:
        raise CheckpointError(f"the rank state at {found.where} has step={s!r}")
    if step < s or (step == s and micro):
        raise CheckpointError(
            f"step={step} is before the rank state at {found.where} (step {s}, micro-batch "
            f"{micro}): pass the number of steps the training loop consumed"
        )
    lanes = inner.get(LANES_KEY)
    if not isinstance(lanes, Mapping) or not lanes:
        raise CheckpointError(f"the rank state at {found.where} has no lanes")
    try:
        owned = sorted(int(k) for k in lanes)
    except (TypeError, ValueError):
        raise CheckpointError(f"the rank state at {found.where} has bad lane keys") from None
    # The lane positions are those at the start of step s: restart there, run step - s steps.
    start = {k: v for k, v in inner.items() if k != LAYOUT_KEY}
    start[MICRO_KEY] = 0

    with WorkerPool(num_workers, "thread") as pool:
        node = pipeline.rank_node(lanes=owned, pool=pool)  # its timeline: any segment
        node.reset(start)
        for _ in range(step - s):
            try:
                next(node)
            except StopIteration:
                raise CheckpointError(
                    f"step={step}: the rank's lanes {owned} end at step {node.step}"
                ) from None
        return node.get_state()


def reshard_loader_states(
    states: Sequence[Mapping[str, Any]],
    pipeline: Pipeline | None = None,
    *,
    step: int | None = None,
) -> dict[str, Any]:
    """Merge every rank's ``Loader`` state into one global state (for any dp size).

    Args:
        states: ``loader.state_dict()`` of every rank (any wrapper stack).
        pipeline: The compiled recipe (needed when a state must be replayed).
        step: Steps the training loop consumed (needed when a state must be replayed).
    """
    return merge_states([rank_state(s, pipeline, step=step) for s in states])


def with_rank_state(loader_state: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``loader_state`` with its rank state replaced by ``state`` (a copy).

    The wrappers' counters on the way (``steps_since_snapshot``, ``batch_idx``) are set to 0:
    the new rank state is the exact position. Use the new rank's own ``Loader`` state as
    ``loader_state``, so the wrappers' layout (worker counts, ...) is the new one.
    """
    found = locate_rank_state(loader_state)
    return replace_state(loader_state, found.path, dict(state))


def load_rank_state(loader: Loader[Any], state: Mapping[str, Any]) -> None:
    """Make ``loader`` resume at ``state`` (a merged or rank state) on its next ``iter()``.

    The template is ``loader.state_dict()``; torchdata's ``Loader`` then hands the iterator
    it made for that call to the next ``iter()`` and would ignore a state loaded after it,
    so that iterator is taken here first.
    """
    template = loader.state_dict()
    iter(loader)
    loader.load_state_dict(with_rank_state(template, state))
