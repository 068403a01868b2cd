"""Every core property holds for multimodal recipes: same global batches, images included,
across dp sizes, workers, thread and process runners, and checkpoint resumes."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from PIL import Image

from tests.multimodal.helpers import mm_recipe, mm_recipes, records
from zephon_nodes import DatasetSpec, Pipeline, simulate
from zephon_nodes.multimodal.corpus import write_jsonl, write_tar_shards
from zephon_nodes.recipe import Recipe, WorkSpec
from zephon_nodes.recipe.image import ImageSpec
from zephon_nodes.testing import assert_elastic
from zephon_nodes.verification.digest import digest_microbatches


@given(recipe=mm_recipes())
def test_identical_global_batches_across_dp_workers_and_resumes(recipe: Recipe) -> None:
    steps = list(simulate(Pipeline(recipe), 1, 6, num_workers=0, keep_batches=True))
    assert len(steps) == 6
    assert any(bool((mb["image_offsets"] >= 0).any()) for _, mbs in steps for mb in mbs or [])
    assert_elastic(recipe, steps=6, workers=(0, 2), runners=("thread",))


@pytest.mark.slow
@settings(max_examples=3)
@given(recipe=mm_recipes())
def test_process_runner_on_generated_recipes(recipe: Recipe) -> None:
    """Fewer examples: each process-runner setting starts worker processes."""
    sizes = sorted({1, recipe.num_lanes})
    assert_elastic(recipe, steps=4, dp_sizes=sizes, workers=(2,), runners=("process",))


def files_recipe(tmp_path: Path) -> Recipe:
    write_tar_shards(tmp_path / "tars", shards=3, per_shard=10, seed=4, max_side=64)
    write_jsonl(tmp_path / "caps.jsonl", records=16, seed=5, max_side=64)
    return mm_recipe(
        [],
        ImageSpec(mode="fixed", size=(32, 32), patch_size=16, max_images=2),
        datasets=(
            DatasetSpec("photos", paths=("tars/*.tar",), base_dir=tmp_path, weight=2.0),
            DatasetSpec("caps", paths=("caps.jsonl",), base_dir=tmp_path),
        ),
        seq_len=64,
        work=WorkSpec(chunk_size=3, epochs=None),
    )


def test_process_runner_and_files(tmp_path: Path) -> None:
    """Tar shards + jsonl, mixed: the process runner gives the thread runner's batches."""
    recipe = files_recipe(tmp_path)
    assert_elastic(recipe, steps=6, dp_sizes=(1, 4), workers=(2,), runners=("thread", "process"))


def test_digest_covers_image_pixels() -> None:
    recs = records(60, seed=3, max_side=24)
    base = mm_recipe(recs, seq_len=64)
    ref = [r.digest for r, _ in simulate(Pipeline(base), 1, 50, num_workers=0)]
    assert len(ref) >= 2
    # The same records with one pixel of one image changed (PNG: lossless).
    k = next(i for i, r in enumerate(recs) if base64.b64decode(r["image"])[:4] == b"\x89PNG")
    arr = np.array(Image.open(io.BytesIO(base64.b64decode(recs[k]["image"]))))
    arr[0, 0, 0] ^= 0xFF
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    changed = list(recs)
    changed[k] = {**recs[k], "image": base64.b64encode(buf.getvalue()).decode()}
    got = [r.digest for r, _ in simulate(Pipeline(mm_recipe(changed, seq_len=64)), 1, 50)]
    assert len(got) == len(ref)
    assert sum(a != b for a, b in zip(ref, got, strict=True)) == 1


def test_digest_changes_with_any_patch_byte() -> None:
    (_, mbs), *_ = simulate(
        Pipeline(mm_recipe(records(60, seed=1), seq_len=64)), 2, 1, keep_batches=True
    )
    assert mbs is not None
    before = digest_microbatches(mbs)
    assert mbs[1]["patches"].dtype.is_floating_point is False
    mbs[1]["patches"][0, 0, 0, 0, 0] ^= 1
    assert digest_microbatches(mbs) != before
