"""Property tests: the global batches do not depend on any physical setting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.core.helpers import digests
from tests.strategies import divisors, lane_assignments, recipes
from zephon_nodes import Pipeline, WorkerPool, simulate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class TestElasticDeterminism:
    """Digests are identical across every physical setting."""

    @given(recipe=recipes(), data=st.data())
    def test_any_dp_size_assignment_workers_and_micro_batch(self, recipe, data):
        """Every dp size dividing L, any lane-to-rank map, workers and micro-batch size agree."""
        pipeline = Pipeline(recipe)
        reference = digests(pipeline, 1, num_workers=0)
        for world in divisors(recipe.num_lanes):
            assignment = data.draw(lane_assignments(recipe.num_lanes, world))
            workers = data.draw(st.sampled_from([0, 1, 2]))
            share = recipe.global_batch_size // world
            micro = data.draw(st.sampled_from(divisors(share)))
            got = digests(
                pipeline,
                world,
                num_workers=workers,
                lane_assignment=assignment,
                local_batch_size=micro,
            )
            assert got == reference, (world, assignment, workers, micro)

    @given(recipe=recipes(), data=st.data())
    def test_resume_at_any_step_on_any_layout(self, recipe, data):
        """A checkpoint at any step resumed at any dp size and worker count continues exactly."""
        pipeline = Pipeline(recipe)
        reference = digests(pipeline, 1, num_workers=0)
        if not reference:
            return
        save_at = data.draw(st.integers(1, len(reference)))
        world_a = data.draw(st.sampled_from(divisors(recipe.num_lanes)))
        world_b = data.draw(st.sampled_from(divisors(recipe.num_lanes)))
        saved: dict = {}
        before = digests(pipeline, world_a, save_at, save_at=save_at, on_save=saved.update)
        assert before == reference[:save_at]
        assert saved["step"] == save_at
        after = digests(
            pipeline,
            world_b,
            len(reference) - save_at,
            num_workers=data.draw(st.sampled_from([0, 2])),
            resume_state=saved,
        )
        assert after == reference[save_at:]


@pytest.fixture(scope="module")
def process_pool():
    pool = WorkerPool(2, "process", timeout_s=120)
    yield pool
    pool.close()


@given(recipe=recipes())
def test_process_runner_matches_inline(recipe, process_pool):
    """The process runner yields the same global batches as inline execution."""
    pipeline = Pipeline(recipe)
    reference = digests(pipeline, 1, num_workers=0)
    world = max(divisors(recipe.num_lanes)[-1] // 2, 1)
    got = [r.digest for r, _ in simulate(pipeline, world, 30, pool=process_pool)]
    assert got == reference
