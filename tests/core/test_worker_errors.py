"""A failing operator surfaces as an error on both runners, in order, and never hangs."""

from __future__ import annotations

import signal

import pytest
from torchdata.nodes import IterableWrapper

from tests.core.helpers import fail_on_seven, texts_recipe
from zephon_nodes import OrderedParallelMap, Pipeline, WorkerError, WorkerPool, simulate


@pytest.fixture
def alarm():
    """Fail the test instead of hanging: SIGALRM after 60 s."""

    def on_alarm(signum, frame):
        raise TimeoutError("test hung")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(("runner", "workers"), [("thread", 0), ("thread", 2), ("process", 2)])
def test_operator_exception_is_raised_after_all_earlier_items(alarm, runner, workers):
    """Items before the failing one come out in order, then WorkerError names the cause."""
    with WorkerPool(workers, runner, timeout_s=60) as pool:
        node = OrderedParallelMap(IterableWrapper(range(20)), fail_on_seven, pool)
        got = []
        with pytest.raises(WorkerError, match="seven is not allowed") as info:
            for x in node:
                got.append(x)
        assert got == [0, 10, 20, 30, 40, 50, 60]
        assert "ValueError" in str(info.value)
        with pytest.raises(WorkerError):
            next(node)


def test_data_error_inside_the_pipeline_stops_the_simulation(alarm):
    """A failing work item ends the run with the error, not a short epoch."""
    texts = [f"fine {i}" for i in range(30)]
    records = [{"text": t} for t in texts]
    records[17] = {"text": None}
    recipe = texts_recipe(texts)
    recipe = recipe.replace(
        datasets=(recipe.datasets[0].__class__("corpus", records=tuple(records)),)
    )
    with pytest.raises(Exception, match="record 17") as info:
        list(simulate(Pipeline(recipe), 2, 1000, num_workers=2))
    assert "must be a string" in str(info.value)
