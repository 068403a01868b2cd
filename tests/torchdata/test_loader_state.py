"""A ``Loader`` state saved at dp 2 resumes at dp 1, 4 and 8, whatever the wrapper stack.

Each rank's ``Loader`` wraps its rank node in a stack of torchdata wrappers (Prefetcher,
Mapper, ParallelMapper on threads and processes, Batcher, Batcher + Unbatcher); two
micro-batches per step and snapshot frequencies of 2 and 3 make the nested state land in
the middle of a step or lag behind the consumer. The resumed global batches must equal a
one-rank reference run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchdata.nodes import Loader

from tests.torchdata.helpers import STACKS, recipe, reference, step_digests, take_microbatches
from zephon_nodes import (
    CheckpointError,
    Pipeline,
    Recipe,
    WorkerPool,
    load_state,
    merge_states,
    save_state,
)
from zephon_nodes.engine.loader_state import (
    load_rank_state,
    locate_rank_state,
    rank_state,
    reshard_loader_states,
)

SAVED_AT = (2, 3)  # steps consumed at dp 2 before saving
NEW_STEPS = 3


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline(recipe())


@pytest.fixture(scope="module")
def ref(pipeline: Pipeline) -> list[str]:
    return reference(pipeline, max(SAVED_AT) + NEW_STEPS)


def _save_at_dp2(pipeline: Pipeline, stack: str, steps: int, pool: WorkerPool) -> list[dict]:
    """Run two ranks (2 micro-batches per step) for ``steps`` steps; return their states."""
    states = []
    for rank in range(2):
        node = pipeline.rank_node(2, rank, pool=pool, local_batch_size=4)
        loader = Loader(STACKS[stack](node))
        take_microbatches(loader, 2 * steps)
        states.append(json.loads(json.dumps(loader.state_dict())))
    return states


@pytest.mark.parametrize("stack", list(STACKS))
def test_loader_state_resumes_at_other_dp_sizes(
    stack: str, pipeline: Pipeline, ref: list[str]
) -> None:
    with WorkerPool(2, "thread") as pool:
        saved = {k: _save_at_dp2(pipeline, stack, k, pool) for k in SAVED_AT}
        lagging = [k for k, states in saved.items() if not locate_rank_state(states[0]).exact]
        for k, states in saved.items():
            merged = reshard_loader_states(states, pipeline, step=k)
            assert merged["step"] == k
            for dp in (1, 4, 8):
                per_rank = []
                for rank in range(dp):
                    loader = Loader(STACKS[stack](pipeline.rank_node(dp, rank, pool=pool)))
                    load_rank_state(loader, merged)
                    per_rank.append(take_microbatches(loader, NEW_STEPS))
                got = step_digests(per_rank, 1)[:NEW_STEPS]
                assert got == ref[k : k + NEW_STEPS], f"{stack}: saved after {k}, dp 2 -> {dp}"
    if stack.startswith(("Prefetcher", "ParallelMapper")):
        # snapshot_frequency=3 with 2 micro-batches per step: a save lands behind the consumer
        assert lagging, "no saved state needed a replay: the test would not exercise it"


def test_an_exact_loader_state_merges_and_loads_without_the_recipe(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    """snapshot_frequency=1: the nested state is the consumer's position; no replay needed."""
    states = []
    with WorkerPool(0, "thread") as pool:
        for rank in range(2):
            from torchdata.nodes import Prefetcher

            loader = Loader(Prefetcher(pipeline.rank_node(2, rank, pool=pool), 2))
            take_microbatches(loader, 3)
            states.append(loader.state_dict())
    merged = merge_states(states)
    assert merged["step"] == 3 and sorted(merged["lanes"], key=int) == [str(i) for i in range(8)]
    assert rank_state(states[0]) == states[0]["root"]["snapshot"]
    save_state(tmp_path, states[1])  # a whole Loader state, with its checksum
    assert load_state(tmp_path) == states[1]["root"]["snapshot"]


def test_a_lagging_state_is_refused_without_the_step(pipeline: Pipeline) -> None:
    with WorkerPool(0, "thread") as pool:
        node = pipeline.rank_node(2, 0, pool=pool, local_batch_size=4)
        from torchdata.nodes import Prefetcher

        loader = Loader(Prefetcher(node, 2, snapshot_frequency=3))
        take_microbatches(loader, 4)
        state = loader.state_dict()
    with pytest.raises(CheckpointError, match=r"root\.steps_since_snapshot=1"):
        merge_states([state])
    with pytest.raises(CheckpointError, match="pass pipeline= and step="):
        rank_state(state)
    with pytest.raises(CheckpointError, match="step=1 is before"):
        rank_state(state, pipeline, step=1)
    assert rank_state(state, pipeline, step=2)["step"] == 2


def test_no_library_state_is_refused() -> None:
    from torchdata.nodes import IterableWrapper

    loader = Loader(IterableWrapper(range(4)))
    with pytest.raises(CheckpointError, match="no zephon-nodes state"):
        merge_states([loader.state_dict()])


def test_the_cli_reads_a_whole_loader_state(
    pipeline: Pipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchdata.nodes import Prefetcher

    from tests.commands.conftest import write_recipe
    from tests.commands.run import zephon

    path = write_recipe(tmp_path)
    p = Pipeline(Recipe.from_toml(path))
    with WorkerPool(0) as pool:
        loader = Loader(Prefetcher(p.rank_node(pool=pool), 2))
        take_microbatches(loader, 2)
        save_state(tmp_path / "ckpt", loader.state_dict())
    assert zephon("inspect", str(tmp_path / "ckpt"), "--recipe", str(path), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == 2 and out["resume"]["ok"]
    ckpt = str(tmp_path / "ckpt")
    assert zephon("digest", str(path), "--steps", "1", "--resume-from", ckpt) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["step"] == 3
