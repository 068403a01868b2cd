"""Per-operator pools on an image recipe: decode in processes (patches through shared memory)."""

from __future__ import annotations

from pathlib import Path

from tests.multimodal.test_elastic import files_recipe
from zephon_nodes import Pipeline, WorkerPool, simulate


def _digests(pipeline: Pipeline, world: int, **kw: object) -> list[str]:
    return [r.digest for r, _ in simulate(pipeline, world, 6, **kw)]  # type: ignore[arg-type]


def test_decode_in_processes_rest_inline(tmp_path: Path) -> None:
    pipeline = Pipeline(files_recipe(tmp_path))
    names = [op.name for op in pipeline.stateless.operators]
    assert names == ["parse_multimodal", "decode_images", "tokenize_multimodal"]
    reference = _digests(pipeline, 1, num_workers=0)
    assert len(reference) == 6
    with WorkerPool(1, "process") as decode:
        got = _digests(pipeline, 2, num_workers=0, operator_pools={"decode": decode})
        assert got == reference
        mixed = {"decode": decode, "tokenize": "thread:2", "parse": "inline"}
        assert _digests(pipeline, 4, num_workers=1, operator_pools=mixed) == reference
