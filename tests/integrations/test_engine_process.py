"""``dataloader.engine = "process"``: the rank node runs in a child process
(``zephon_nodes.engine.child.ChildRankNode``), with the thread engine's batches and states.

The engine test is skipped where ``zephon_nodes/engine/child.py`` is absent. The thread
engine is the reference here (its batches are checked against ``zephon digest``'s
simulation elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.test_step_check import build as build_loader
from tests.integrations.test_torchtitan_loader import build as titan_build
from tests.integrations.test_torchtitan_loader import run_ranks
from tests.integrations.test_torchtitan_relane import expected, recipes  # noqa: F401
from tests.integrations.titan_main.helpers import dcp_load, union


def build(recipe: Path, world: int, rank: int, engine: str) -> Any:
    return build_loader(recipe, world, rank, rows=2, engine=engine)


def flat(batch: Any) -> list[torch.Tensor]:
    inputs, labels = batch
    return [inputs["input"], inputs["positions"], labels]


def take(loader: Any, n: int) -> list[list[torch.Tensor]]:
    it = iter(loader)
    return [flat(next(it)) for _ in range(n)]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        all(torch.equal(x, y) for x, y in zip(p, q, strict=True)) for p, q in zip(a, b, strict=True)
    )


def test_process_engine_gives_the_thread_engines_batches_and_resumes_at_another_dp(
    recipe_path: Path,
) -> None:
    pytest.importorskip("zephon_nodes.engine.child", reason="needs zephon_nodes/engine/child.py")
    loaders = {e: [build(recipe_path, 2, r, e) for r in range(2)] for e in ("thread", "process")}
    try:
        assert loaders["process"][0].pool is None  # the child builds its own pool
        for r in range(2):  # steps 1-2 on each rank (2 micro-batches a step)
            assert same(take(loaders["process"][r], 4), take(loaders["thread"][r], 4)), r
        stored = union([x.state_dict() for x in loaders["process"]])
        assert set(stored) == set(union([x.state_dict() for x in loaders["thread"]]))
        resumed = {e: build(recipe_path, 1, 0, e) for e in ("thread", "process")}
        for loader in resumed.values():
            dcp_load(loader, {k: v.clone() for k, v in stored.items()})
        assert same(take(resumed["process"], 8), take(resumed["thread"], 8))  # steps 3-4
    finally:
        for loader in [
            *loaders["thread"],
            *loaders["process"],
            *locals().get("resumed", {}).values(),
        ]:
            loader.close()


def test_process_engine_relanes_at_load_and_resumes_after_it(
    recipes: dict[int, Path],  # noqa: F811 (the fixture)
) -> None:
    """``relane_from`` and ``relaned`` with the process engine (refused before the rank node
    resolved re-laned states on its timeline): the thread engine's batches, which are the
    engine's re-laned simulation."""
    pytest.importorskip("zephon_nodes.engine.child", reason="needs zephon_nodes/engine/child.py")
    first = [titan_build(recipes[4], 2, r) for r in range(2)]
    loaders: list[Any] = list(first)
    try:
        run_ranks(first, [iter(x) for x in first], 3)
        stored = union([x.state_dict() for x in first])
        want = expected(recipes, 4)
        relaned = [titan_build(recipes[6], 2, r, lbs=6, relane_from=4, engine="process")
                   for r in range(2)]  # fmt: skip
        loaders += relaned
        for loader in relaned:
            dcp_load(loader, {k: v.clone() for k, v in stored.items()})
        assert run_ranks(relaned, [iter(x) for x in relaned], 2) == want[:2]
        after = union([x.state_dict() for x in relaned])
        resumed = [titan_build(recipes[6], 3, r, lbs=4, relaned=True, engine="process")
                   for r in range(3)]  # fmt: skip
        loaders += resumed
        for loader in resumed:
            dcp_load(loader, {k: v.clone() for k, v in after.items()})
        assert run_ranks(resumed, [iter(x) for x in resumed], 2) == want[2:]
    finally:
        for loader in loaders:
            loader.close()
