"""The rank node of a ``ZephonDataLoader``, built where it runs: here or in a child process.

:func:`build_rank_node` is module-level and takes only plain, picklable arguments, so
``functools.partial(build_rank_node, ...)`` is the zero-argument factory
:class:`zephon_nodes.engine.child.ChildRankNode` runs in its child process
(``dataloader.engine = "process"``): the same pipeline, pool and rank node as the thread
engine builds in the trainer's process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from zephon_nodes.core.settings import Settings, using
from zephon_nodes.engine.child import STALL_S, ChildRankNode
from zephon_nodes.engine.operator_pools import parse_operator_workers
from zephon_nodes.engine.pipeline import Pipeline
from zephon_nodes.engine.pool import WorkerPool
from zephon_nodes.recipe import Recipe

__all__ = ["build_rank_node", "child_rank_node"]


def build_rank_node(
    recipe: str,
    settings: Settings,
    *,
    dp_world_size: int,
    dp_rank: int,
    local_batch_size: int,
    lanes: Sequence[int],
    lookahead: int,
    operator_workers: str,
    num_workers: int,
    runner: str,
    worker_timeout_s: float,
) -> Any:
    """Build the rank node (a ``Multiplexer`` owning its worker pool) of ``recipe``."""
    with using(settings):
        pipeline = Pipeline(Recipe.from_toml(recipe), settings=settings)
    pool = WorkerPool(num_workers, runner, worker_timeout_s, settings=settings)
    node = pipeline.rank_node(
        dp_world_size,
        dp_rank,
        local_batch_size=local_batch_size,
        pool=pool,
        lanes=list(lanes),
        lookahead=lookahead,
        operator_pools=parse_operator_workers(operator_workers),
    )
    node.own([pool])
    return node


def child_rank_node(config: Any, settings: Settings, **geometry: Any) -> Any:
    """A ``ChildRankNode`` running :func:`build_rank_node` in a child process.

    Args:
        config: The loader's ``Config`` (its recipe and physical settings).
        settings: The process's physical settings, with the config's applied.
        **geometry: ``dp_world_size``, ``dp_rank``, ``local_batch_size`` and ``lanes``.
    """
    factory = functools.partial(
        build_rank_node,
        config.recipe,
        settings,
        lookahead=config.lookahead,
        operator_workers=config.operator_workers,
        num_workers=config.num_workers,
        runner=config.runner,
        worker_timeout_s=config.worker_timeout_s,
        **geometry,
    )
    return ChildRankNode(
        factory,
        prefetch=max(1, config.prefetch),
        label=f"rank {geometry['dp_rank']}",
        # silence well beyond one work item's own limit is a child stuck elsewhere
        stall_s=max(STALL_S, 3 * config.worker_timeout_s),
    )
