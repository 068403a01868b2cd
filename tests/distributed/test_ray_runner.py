"""The Ray runner on a local two-node Ray cluster (``ray start --head`` + ``ray start``).

One cluster per module (Ray start-up is slow); the node-loss test kills the second node, so
only the head is left for the tests after it. The cluster's processes never outlive the module,
even if the test process dies (see ``ray_cluster.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.helpers import check_random_operator_pools
from tests.distributed.ray_cluster import NO_METRICS, LocalRayCluster
from tests.strategies import chain_recipes
from zephon_nodes import (
    DatasetSpec,
    OperatorSpec,
    Pipeline,
    Recipe,
    TokenizerSpec,
    WorkerPool,
    WorkSpec,
    digest_microbatches,
    register_map,
)
from zephon_nodes.core.errors import WorkerError
from zephon_nodes.verification.simulate import simulate

from .ray_ops import die_in_ray_worker, tag_node

pytestmark = pytest.mark.slow

register_map("test_ray_tag_node", tag_node)
register_map("test_ray_die", die_in_ray_worker)

STEPS = 12


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    saved = {k: os.environ.get(k) for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", *NO_METRICS)}
    c = LocalRayCluster(extra_nodes=1, cpus=1)
    os.environ["RAY_ADDRESS"] = c.address
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.update(NO_METRICS)  # this process is the Ray driver (see NO_METRICS)
    try:
        yield c
    finally:
        import ray

        ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def recipe(op: OperatorSpec) -> Recipe:
    docs = tuple({"text": f"document {i} " * (1 + i % 9)} for i in range(400))
    return Recipe(
        datasets=(DatasetSpec("demo", records=docs),),
        tokenizer=TokenizerSpec(kind="bytes"),
        num_lanes=4,
        global_batch_size=8,
        seq_len=32,
        flush_every=2,
        work=WorkSpec(chunk_size=4, epochs=None),
        operators=(op,),
    )


def tag_recipe(log_dir: Path, delay: float = 0.01) -> Pipeline:
    op = OperatorSpec("map", "test_ray_tag_node", {"log_dir": str(log_dir), "delay": delay})
    return Pipeline(recipe(op))


def digests(pipeline: Pipeline, runner: str, workers: int = 2) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, 2, STEPS, num_workers=workers, runner=runner)]


def nodes_seen(log_dir: Path) -> set[str]:
    return {p.name.split("-")[0] for p in log_dir.iterdir()}


def test_two_nodes_give_the_thread_runners_digests(
    cluster: LocalRayCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``zephon digest --runner ray`` joins the cluster in RAY_ADDRESS, runs work on both nodes
    and prints the thread runner's digests."""
    from zephon_nodes.cli import main

    logs = tmp_path / "nodes"
    logs.mkdir()
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": f"line {i} " * (1 + i % 9)}) + "\n" for i in range(400))
    )
    toml = tmp_path / "r.toml"
    toml.write_text(
        "num_lanes = 4\nglobal_batch_size = 8\nseq_len = 32\nflush_every = 2\n"
        "[tokenizer]\nkind = 'bytes'\n[[datasets]]\nname = 'd'\npaths = ['docs.jsonl']\n"
        "[work]\nchunk_size = 4\nepochs = 'inf'\n"
        "[[operators]]\nmap = 'test_ray_tag_node'\n"
        f"params = {{ log_dir = '{logs}', delay = 0.01 }}\n"
    )
    outs = []
    for runner in ("thread", "ray"):
        args = ["digest", str(toml), "--dp-world-size", "2", "--steps", str(STEPS)]
        assert main([*args, "--runner", runner]) == 0
        outs.append(capsys.readouterr().out)
        if runner == "thread":
            assert list(logs.iterdir()) == []  # threads are not Ray workers: nothing tagged
    assert outs[1] == outs[0]
    assert len(outs[0].splitlines()) == STEPS
    assert len(nodes_seen(logs)) == 2


def test_per_operator_ray_pool(cluster: LocalRayCluster, tmp_path: Path) -> None:
    """Only the map operator on Ray (the rest on threads): same digests, both nodes used."""
    pipeline = tag_recipe(tmp_path)
    reference = digests(pipeline, "thread")
    pools = {"map:test_ray_tag_node": "ray:2"}
    got = [r.digest for r, _ in simulate(pipeline, 2, STEPS, num_workers=1, operator_pools=pools)]
    assert got == reference
    assert len(nodes_seen(tmp_path)) == 2


def test_reset_with_tasks_in_flight(
    cluster: LocalRayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reset drops the tasks in flight; the restarted stream is the thread runner's.

    Resets with tasks in flight once ended the test process (a ``ray.cancel`` racing with a
    task's reply fails a RAY_CHECK in Ray 2.60); the executor no longer cancels through Ray.
    """
    import ray

    cancels: list[object] = []
    monkeypatch.setattr(ray, "cancel", lambda *a, **k: cancels.append(a))
    pipeline = tag_recipe(tmp_path, delay=0.0)
    reference = [r.digest for r, _ in simulate(pipeline, 1, 4, num_workers=1)]
    with WorkerPool(2, "ray") as pool:
        node = pipeline.rank_node(1, 0, pool=pool)
        node.reset(None)
        start = node.state_dict()  # (a reset without a state would start the next pass)
        for _ in range(3):  # each reset drops up to lookahead tasks per lane
            node.reset(start)
            next(node)
        node.reset(start)
        got = [digest_microbatches([next(node)]) for _ in range(4)]
    assert got == reference
    assert cancels == []  # neither the resets nor the close cancelled a task through Ray


def test_a_connection_the_caller_opened_is_left_open(cluster: LocalRayCluster) -> None:
    """A pool uses the caller's own ``ray.init`` and does not shut it down at close."""
    import ray

    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        with WorkerPool(2, "ray") as pool:
            assert pool.submit(abs, -3).result(timeout=60) == 3
        assert ray.is_initialized()
    finally:
        ray.shutdown()


def test_retry_budget_then_worker_error(
    cluster: LocalRayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task whose worker dies every time is run 1 + max_retries times, then WorkerError."""
    monkeypatch.setenv("ZEPHON_RAY_MAX_RETRIES", "1")

    def die_on(prefix: str) -> Pipeline:
        params = {"log_dir": str(tmp_path), "prefix": prefix}
        return Pipeline(recipe(OperatorSpec("map", "test_ray_die", params)))

    first = die_on("-").work_source.work(0, 0)  # lane 0's first work item: dies every time
    assert first is not None
    pipeline = die_on(f"document {first.start} ")
    assert pipeline.work_source.work(0, 0) == first
    with pytest.raises(WorkerError, match=r"failed on .*lane 0.*RayTaskLost.*max_retries=1"):
        digests(pipeline, "ray", workers=1)
    attempts = [p for p in tmp_path.iterdir() if p.name.startswith("attempt-")]
    assert len(attempts) == 2  # one work item holds document 0: run, then re-run once


def test_node_lost_mid_run_costs_time_not_bytes(cluster: LocalRayCluster, tmp_path: Path) -> None:
    """The second node is killed mid-run: its tasks run again on the head, digests unchanged.

    The run is long enough for the second node to take work even on a loaded machine (a CI
    run of 2 x STEPS steps once ended before its Ray worker had started: all on the head).
    """
    steps = 4 * STEPS
    pipeline = tag_recipe(tmp_path, delay=0.02)
    reference = [r.digest for r, _ in simulate(pipeline, 2, steps, num_workers=2)]
    got: list[str] = []
    killed_after = None
    for result, _ in simulate(pipeline, 2, steps, num_workers=2, runner="ray"):
        got.append(result.digest)
        if killed_after is None and len(nodes_seen(tmp_path)) == 2:
            cluster.nodes[1].kill()  # the node was doing work: its tasks are lost with it
            killed_after = len(got)
    assert killed_after is not None and killed_after <= steps - 4, killed_after
    assert got == reference


def test_ray_runner_without_ray_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Ray installed, the pool is refused when built, naming the extra."""
    import importlib.util

    from zephon_nodes.core.errors import RecipeError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(RecipeError, match=r"zephon-nodes\[ray\]"):
        WorkerPool(2, "ray")
    assert WorkerPool(0, "ray").num_workers == 0  # inline: Ray is never needed


@pytest.fixture(scope="module")
def mixed_pools(cluster: LocalRayCluster) -> Iterator[dict[str, WorkerPool]]:
    made = {
        "inline": WorkerPool(0),
        "thread:2": WorkerPool(2, "thread"),
        "ray:2": WorkerPool(2, "ray"),
    }
    yield made
    for p in made.values():
        p.close()


@settings(max_examples=4)
@given(recipe=chain_recipes(), data=st.data())
def test_random_operator_pools_with_ray_match_inline_reference(
    mixed_pools: dict[str, WorkerPool], recipe: Recipe, data: st.DataObject
) -> None:
    """Random inline/thread/ray pools per operator, any dp size, resumed: the inline bytes.

    Last in the module: its Ray pool stays open until the module ends (a caller's own
    ``ray.init`` in an earlier test must find Ray not yet connected).
    """
    check_random_operator_pools(recipe, mixed_pools, data.draw, 8, mixed_pools["ray:2"])
