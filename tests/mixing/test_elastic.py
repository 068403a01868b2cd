"""Mixed, scheduled, best-fit and filtered recipes stay elastically deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.mixing.helpers import base_recipe, digests, elastic_check, memory_dataset, texts
from zephon_nodes import Pipeline, WorkerPool, WorkSpec, simulate
from zephon_nodes.recipe import MixtureSpec, OperatorSpec, PackSpec
from zephon_nodes.recipe.registry import register_filter


def has_vowel_run(text: str, n: int = 2) -> bool:
    """A module-level filter (picklable for the process runner)."""
    return "aa" * (n // 2) in text or len(text) > 40


register_filter("test_has_vowel_run", has_vowel_run, version="1")


def datasets(on_exhausted: str = "repeat"):
    return [
        memory_dataset(
            "web", texts("abcdefgh", 400, 5, 60, 1), weight=0.5, on_exhausted=on_exhausted
        ),
        memory_dataset(
            "code", texts("nopqrstu", 120, 80, 300, 2), weight=0.3, on_exhausted=on_exhausted
        ),
        memory_dataset(
            "books", texts("IJKLMNOP", 60, 200, 700, 3), weight=0.2, on_exhausted=on_exhausted
        ),
    ]


def mixed():
    return base_recipe(datasets(), num_lanes=4, global_batch_size=8, seq_len=64)


def scheduled():
    schedule = (
        (0, {"web": 0.9, "code": 0.1, "books": 0.0}),
        (4, {"web": 0.2, "code": 0.4, "books": 0.4}),
        (8, {"web": 0.5, "code": 0.5, "books": 0.0}),
    )
    return base_recipe(datasets(), mixture=MixtureSpec(schedule=schedule, block=16), num_lanes=4)


def bestfit():
    return base_recipe(
        datasets(), pack=PackSpec(mode="bestfit", bins=4, long_documents="split"), num_lanes=4
    )


def filtered():
    return base_recipe(
        datasets(),
        operators=(
            OperatorSpec("filter", "min_chars", {"n": 20}),
            OperatorSpec("map", "strip", datasets=("web",)),
            OperatorSpec("filter", "test_has_vowel_run", {"n": 2}, datasets=("web",)),
        ),
        pack=PackSpec(mode="bestfit", bins=3, long_documents="drop"),
        num_lanes=8,
        global_batch_size=8,
        seq_len=256,
    )


RECIPES = {"mixed": mixed, "scheduled": scheduled, "bestfit": bestfit, "filtered": filtered}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_identical_across_dp_workers_and_resume(name):
    """Every dp size, worker count and a resume on another dp size give the same digests."""
    elastic_check(RECIPES[name](), steps=12, save_at=5)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_endable_mixture_ends_identically(name):
    """With on_exhausted = "end", every layout stops after the same last global batch."""
    recipe = RECIPES[name]().replace(
        datasets=tuple(datasets("end")), work=WorkSpec(chunk_size=4, epochs=1)
    )
    p = Pipeline(recipe)
    reference = digests(p, 1, 10_000, num_workers=0)
    assert 0 < len(reference) < 10_000
    assert digests(p, 2, 10_000, num_workers=2) == reference


@given(data=st.data())
def test_resume_anywhere(data):
    """Any save step, dp size before and after, for any of the recipes."""
    name = data.draw(st.sampled_from(sorted(RECIPES)))
    recipe = RECIPES[name]()
    p = Pipeline(recipe)
    reference = digests(p, 1, 10, num_workers=0)
    L = recipe.num_lanes
    sizes = [w for w in (1, 2, 4, 8) if L % w == 0]
    save_at = data.draw(st.integers(1, 9))
    saved: dict = {}
    digests(p, data.draw(st.sampled_from(sizes)), save_at, save_at=save_at, on_save=saved.update)
    after = digests(p, data.draw(st.sampled_from(sizes)), 10 - save_at, resume_state=saved)
    assert after == reference[save_at:]


def test_process_runner_matches_inline():
    """User filters and maps run in spawned processes with the same result."""
    p = Pipeline(filtered())
    reference = digests(p, 1, 6, num_workers=0)
    with WorkerPool(2, "process", timeout_s=120) as pool:
        got = [r.digest for r, _ in simulate(p, 2, 6, pool=pool)]
    assert got == reference
