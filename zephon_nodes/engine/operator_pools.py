"""Per-operator pools: the runner and worker count of each operator stage.

By default a rank runs its whole fused operator chain (parse, filters, maps, tokenize; for
images parse, decode, tokenize) as one task per work item on one shared
:class:`~zephon_nodes.engine.pool.WorkerPool`. An *operator pool assignment* gives named
operators their own pool instead, e.g. image decoding in six processes and tokenization in
two threads. Consecutive operators on the same pool stay fused into one task; each stage is
an :class:`~zephon_nodes.engine.parallel_map.OrderedParallelMap` whose results come back in
work-item order, so an assignment is a physical setting: it changes speed, never a byte.

Command-line and config syntax (:func:`parse_operator_workers`)::

    decode=process:6,tokenize=thread:2,parse=inline

A key names an operator (``parse``, ``filter:<name>``, ``map:<name>``, ``tokenize``,
``long_documents``; images: ``parse_multimodal``, ``decode_images``,
``tokenize_multimodal``) or the first word of its name: ``decode`` names ``decode_images``,
``filter`` every filter, ``map`` every map.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from zephon_nodes.core.errors import RecipeError
from zephon_nodes.core.operator import operator_name
from zephon_nodes.core.settings import Settings
from zephon_nodes.engine.pool import RUNNERS, WorkerPool
from zephon_nodes.operators.chain import Chain

__all__ = [
    "OPERATOR_WORKERS_HELP",
    "PoolSpec",
    "operator_workers_arg",
    "parse_operator_workers",
    "split_stages",
]

INLINE = "inline"
DEFAULT_WORKERS = 2
OPERATOR_WORKERS_HELP = (
    "per-operator pools, e.g. decode=process:6,tokenize=thread:2 (runner inline, thread, "
    "process, ray; unnamed operators use the --num-workers/--runner pool)"
)


@dataclass(frozen=True)
class PoolSpec:
    """A pool to create: runner and workers (``"inline"`` runs in the calling thread).

    Args:
        runner: ``"inline"`` or one of :data:`~zephon_nodes.engine.pool.RUNNERS`.
        num_workers: Workers (ignored, and 0, for ``"inline"``).
    """

    runner: str = "thread"
    num_workers: int = DEFAULT_WORKERS

    def __post_init__(self) -> None:
        if self.runner == INLINE:
            object.__setattr__(self, "num_workers", 0)
            return
        if self.runner not in RUNNERS:
            raise RecipeError(f"runner {self.runner!r} must be one of {(INLINE, *RUNNERS)}")
        if self.num_workers < 1:
            raise RecipeError(
                f"{self.runner} pool: num_workers={self.num_workers} must be >= 1 (use "
                f"'inline' to run an operator in the calling thread)"
            )

    @classmethod
    def parse(cls, text: str) -> PoolSpec:
        """Parse ``"process:6"``, ``"thread"`` (2 workers) or ``"inline"``."""
        runner, sep, count = text.strip().partition(":")
        if not sep:
            return cls(runner, DEFAULT_WORKERS)
        try:
            workers = int(count)
        except ValueError:
            raise RecipeError(
                f"pool {text!r}: the worker count {count!r} must be an integer (e.g. 'process:6')"
            ) from None
        return cls(runner, workers)

    def build(self, timeout_s: float = 300.0, settings: Settings | None = None) -> WorkerPool:
        """Create the pool (workers start at the first task)."""
        if self.runner == INLINE:
            return WorkerPool(0, "thread", timeout_s, settings=settings)
        return WorkerPool(self.num_workers, self.runner, timeout_s, settings=settings)

    def __str__(self) -> str:
        return INLINE if self.runner == INLINE else f"{self.runner}:{self.num_workers}"


def parse_operator_workers(text: str) -> dict[str, PoolSpec]:
    """Parse ``"decode=process:6,tokenize=thread:2"`` into ``{operator: PoolSpec}``.

    Raises:
        RecipeError: On a malformed entry, an unknown runner or a repeated operator.
    """
    out: dict[str, PoolSpec] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise RecipeError(
                f"operator pool {entry!r} must read OPERATOR=RUNNER[:WORKERS], "
                f"e.g. 'decode=process:6'"
            )
        if key in out:
            raise RecipeError(f"operator {key!r} is given a pool twice in {text!r}")
        try:
            out[key] = PoolSpec.parse(value)
        except RecipeError as e:
            raise RecipeError(f"operator pool {entry!r}: {e}") from None
    return out


def operator_workers_arg(text: str) -> dict[str, PoolSpec]:
    """:func:`parse_operator_workers` for ``argparse`` (errors become usage errors)."""
    try:
        return parse_operator_workers(text)
    except RecipeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _matches(key: str, name: str) -> bool:
    return key == name or name.startswith((key + "_", key + ":"))


def split_stages(chain: Chain, assignment: Mapping[str, Any]) -> list[tuple[Chain, str | None]]:
    """Cut ``chain`` into stages: runs of consecutive operators with the same pool key.

    Args:
        chain: The fused stateless chain.
        assignment: Operator keys (see the module docs) to anything; only the keys are used.

    Returns:
        ``[(sub-chain, key or None for the default pool), ...]`` in chain order.

    Raises:
        RecipeError: If a key names no operator of the chain, or two keys name one operator.
    """
    names = [operator_name(op) for op in chain.operators]
    keys: list[str | None] = []
    for name in names:
        hits = [k for k in assignment if _matches(k, name)]
        if len(hits) > 1:
            raise RecipeError(
                f"operator {name!r} is given a pool by both {hits[0]!r} and {hits[1]!r}"
            )
        keys.append(hits[0] if hits else None)
    unused = [k for k in assignment if k not in keys]
    if unused:
        raise RecipeError(
            f"operator pools name {unused[0]!r}, which is not an operator of this recipe; "
            f"its operators are {names}"
        )
    stages: list[tuple[Chain, str | None]] = []
    start = 0
    for i in range(1, len(names) + 1):
        if i == len(names) or keys[i] != keys[start]:
            stages.append((Chain(chain.operators[start:i]), keys[start]))
            start = i
    return stages
