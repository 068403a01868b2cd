"""The stateless operator's declared face: a callable with a name (messages, metrics, pools)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Fused", "Operator", "operator_name"]


@runtime_checkable
class Operator(Protocol):
    """A stateless operator: a picklable function of one batch, with a ``name``.

    The name keys the operator in messages, run metrics and per-operator pools
    (``--operator-workers parse=process:4``). Every built-in operator declares one; a plain
    callable without it is named by its type.
    """

    @property
    def name(self) -> str:
        """The operator's name."""
        ...

    def __call__(self, item: Any) -> Any:
        """Run the operator on one batch."""
        ...


def operator_name(op: object) -> str:
    """The name of ``op``: its declared ``name`` (an :class:`Operator`), else its type's name."""
    return str(op.name) if isinstance(op, Operator) else type(op).__name__


@runtime_checkable
class Fused(Protocol):
    """Several operators fused into one call per work item (a ``Chain``), timed one by one."""

    @property
    def operators(self) -> Sequence[Callable[[Any], Any]]:
        """The operators, applied in order."""
        ...
