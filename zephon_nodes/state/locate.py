"""Find the library's state inside a larger state (a ``torchdata.nodes.Loader`` state).

A ``Loader`` over a rank node nests the rank node's state under the keys of the wrappers
around it: ``root``, ``root.snapshot`` (``Prefetcher``, ``PinMemory``), ``root.it_state.snapshot``
(``ParallelMapper``), ``root.source`` (``Batcher``, ``Unbatcher``, inline ``Mapper``) and any
combination. These helpers search the nesting by content (the state's ``format`` key), so
they work whatever the wrapper stack. Pure data functions, no torchdata import.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.errors import CheckpointError
from zephon_nodes.state.schema import FORMAT, FORMAT_KEY

__all__ = ["LocatedState", "locate_state", "replace_state", "unwrap_state"]

# Counters that torchdata's wrappers keep next to a nested state: the items yielded since
# it. Anything but ``num_yielded`` (the Loader's own count) that is a nonzero integer means
# the nested state lags behind the consumer.
_NEUTRAL = {"num_yielded"}
_MAX_DEPTH = 64


@dataclass(frozen=True)
class LocatedState:
    """Where a nested state sits.

    Attributes:
        path: Keys from the outer state down to it (empty: the state itself).
        state: The nested state.
        lag: ``(key path, value)`` of every nonzero counter beside the path (e.g.
            ``steps_since_snapshot``): items the wrappers yielded after the nested state was
            taken. Empty when the nested state is exactly the consumer's position.
    """

    path: tuple[str, ...]
    state: Mapping[str, Any]
    lag: tuple[tuple[str, int], ...]

    @property
    def exact(self) -> bool:
        """True if no wrapper yielded anything after the nested state was taken."""
        return not self.lag

    @property
    def where(self) -> str:
        """The path as ``root.snapshot`` (``<top>`` for the state itself)."""
        return ".".join(self.path) or "<top>"


def _is_target(x: Any, fmt: str) -> bool:
    return isinstance(x, Mapping) and x.get(FORMAT_KEY) == fmt


def locate_state(state: Any, fmt: str = FORMAT) -> list[LocatedState]:
    """Return every mapping with ``format == fmt`` inside ``state`` (outermost first).

    The search does not descend into a match.
    """
    found: list[LocatedState] = []

    def walk(node: Any, path: tuple[str, ...], lag: tuple[tuple[str, int], ...]) -> None:
        if len(path) > _MAX_DEPTH:
            return
        if _is_target(node, fmt):
            found.append(LocatedState(path, node, lag))
            return
        if not isinstance(node, Mapping):
            return
        counters = tuple(
            (".".join((*path, str(k))), int(v))
            for k, v in node.items()
            if isinstance(v, int) and not isinstance(v, bool) and v and str(k) not in _NEUTRAL
        )
        for k, v in node.items():
            if isinstance(v, Mapping):
                walk(v, (*path, str(k)), lag + counters)

    walk(state, (), ())
    return found


def replace_state(state: Mapping[str, Any], path: tuple[str, ...], new: Any) -> dict[str, Any]:
    """Return a deep copy of ``state`` with ``new`` at ``path`` and the lag counters zeroed.

    Counters along the path (``steps_since_snapshot``, ``batch_idx``, ...) are set to 0: the
    new nested state is the exact position, with nothing yielded after it.
    """
    out = copy.deepcopy(dict(state))
    node: dict[str, Any] = out
    for key in path[:-1]:
        for k, v in list(node.items()):
            if isinstance(v, int) and not isinstance(v, bool) and str(k) not in _NEUTRAL:
                node[k] = 0
        node = node[key]
    if path:
        for k, v in list(node.items()):
            if isinstance(v, int) and not isinstance(v, bool) and str(k) not in _NEUTRAL:
                node[k] = 0
        node[path[-1]] = copy.deepcopy(new)
        return out
    return copy.deepcopy(dict(new))


def unwrap_state(state: Any) -> dict[str, Any]:
    """Return the library's state: ``state`` itself, or the one inside a ``Loader`` state.

    A ``torchdata.nodes.Loader`` over a rank node holds its state under the wrappers' keys
    (``root``, ``root.snapshot``, ``root.it_state.snapshot``, ``root.source``, ...); it is
    found by its ``format`` key whatever the stack.

    Raises:
        CheckpointError: If there is no library state, more than one, or the wrappers yielded
            items after it was taken (``steps_since_snapshot`` > 0): then the state lags the
            consumer and :func:`zephon_nodes.rank_state` must replay it to the step the
            consumer reached.
    """
    if isinstance(state, Mapping) and FORMAT_KEY in state:
        return dict(state)
    found = locate_state(state, FORMAT)
    if not found:
        kind = type(state).__name__
        raise CheckpointError(
            f"no zephon-nodes state (a dict with format {FORMAT!r}) found in this {kind}"
        )
    if len(found) > 1:
        where = ", ".join(f.where for f in found)
        raise CheckpointError(f"more than one zephon-nodes state in this Loader state: {where}")
    f = found[0]
    if not f.exact:
        lag = ", ".join(f"{k}={v}" for k, v in f.lag)
        raise CheckpointError(
            f"the zephon-nodes state at {f.where} in this Loader state was taken before the "
            f"last items the wrappers yielded ({lag}); replay it to the step the training loop "
            f"reached: zephon_nodes.rank_state(state, pipeline, step=STEP)"
        )
    return dict(f.state)
