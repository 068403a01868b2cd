"""Small helpers for the core tests."""

from __future__ import annotations

from typing import Any

from zephon_nodes import Pipeline, Recipe, simulate


def digests(pipeline: Pipeline, world: int, steps: int = 30, **kw: Any) -> list[str]:
    """Per-step global batch digests of a simulated run."""
    return [r.digest for r, _ in simulate(pipeline, world, steps, **kw)]


def texts_recipe(texts: list[str], **kw: Any) -> Recipe:
    """A recipe over in-memory texts with the byte tokenizer."""
    from zephon_nodes import DatasetSpec, TokenizerSpec, WorkSpec

    base: dict[str, Any] = {
        "datasets": (DatasetSpec("corpus", records=tuple({"text": t} for t in texts)),),
        "tokenizer": TokenizerSpec(kind="bytes"),
        "seed": 1,
        "num_lanes": 4,
        "global_batch_size": 8,
        "seq_len": 16,
        "flush_every": 2,
        "work": WorkSpec(chunk_size=2),
    }
    base.update(kw)
    return Recipe(**base)


def fail_on_seven(x: int) -> int:
    """A stateless operator that fails on one item (picklable for the process runner)."""
    if x == 7:
        raise ValueError("seven is not allowed")
    return x * 10


def check_random_operator_pools(
    recipe: Recipe, pools: dict[str, Any], draw: Any, steps: int, resume_pool: Any = None
) -> None:
    """Random per-operator pools, dp sizes and a resume give the inline reference's digests.

    ``draw`` is Hypothesis' ``data.draw``; ``resume_pool`` is the default pool after the
    resume (drawn from ``pools`` when None).
    """
    from hypothesis import strategies as st

    from tests.strategies import divisors, operator_assignments

    pipeline = Pipeline(recipe)
    reference = digests(pipeline, 1, steps, num_workers=0)
    world = draw(st.sampled_from(divisors(recipe.num_lanes)))
    assignment = operator_assignments(draw, pipeline, pools)
    default = pools[draw(st.sampled_from(list(pools)))]
    got = digests(pipeline, world, steps, pool=default, operator_pools=assignment)
    assert got == reference, (world, assignment)
    if not reference:
        return
    save_at = draw(st.integers(1, len(reference)))
    saved: dict[str, Any] = {}
    digests(pipeline, world, save_at, pool=default, operator_pools=assignment,
            save_at=save_at, on_save=saved.update)  # fmt: skip
    other = draw(st.sampled_from(divisors(recipe.num_lanes)))
    after = digests(
        pipeline,
        other,
        len(reference) - save_at,
        pool=resume_pool if resume_pool is not None else default,
        operator_pools=operator_assignments(draw, pipeline, pools),
        resume_state=saved,
    )
    assert after == reference[save_at:], (world, other, save_at)
