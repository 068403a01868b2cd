"""Parquet shards with a binary image column (one image, or a list of images per row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multimodal.helpers import encode, mm_recipe, noise
from tests.multimodal.test_bad_input import all_counts
from zephon_nodes import DataError, DatasetSpec, Pipeline, simulate
from zephon_nodes.multimodal.tokenize import MMDocBatch
from zephon_nodes.recipe import WorkSpec

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    return path


def test_binary_and_list_columns(tmp_path: Path) -> None:
    rows = [{"caption": f"row {k} " * 8, "img": encode(noise(9 + k, 12, k))} for k in range(30)]
    write(tmp_path / "one.parquet", rows)
    lists = [{"caption": "two", "img": [encode(noise(8, 8, 1)), encode(noise(8, 16, 2))]}]
    write(tmp_path / "two.parquet", lists)
    spec = DatasetSpec(
        "pq", paths=("*.parquet",), base_dir=tmp_path, text_field="caption", image_field="img"
    )
    recipe = mm_recipe([], datasets=(spec,), work=WorkSpec(chunk_size=4, epochs=None))
    pipeline = Pipeline(recipe)
    assert all_counts(pipeline) == (31, {})
    shard = pipeline.datasets[0].shards[1]
    from zephon_nodes.engine.work import WorkItem

    batch = pipeline.stateless(WorkItem(0, "pq", "caption", 0, 0, shard, 0, 1, 0, 0))
    assert isinstance(batch, MMDocBatch) and [len(i) for i in batch.images] == [2]
    ref = [r.digest for r, _ in simulate(pipeline, 1, 6, num_workers=0)]
    assert len(ref) == 6 and [r.digest for r, _ in simulate(pipeline, 4, 6)] == ref


def test_missing_image_column(tmp_path: Path) -> None:
    write(tmp_path / "t.parquet", [{"text": "no image here"}] * 3)
    spec = DatasetSpec("pq", paths=("t.parquet",), base_dir=tmp_path)
    with pytest.raises(DataError, match=r"t\.parquet row 0: text without image"):
        all_counts(Pipeline(mm_recipe([], datasets=(spec,))))
